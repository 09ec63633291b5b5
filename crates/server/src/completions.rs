//! `POST /v1/completions`: the legacy text-in, text-out endpoint (no template, no reasoning
//! split), streamed or whole, with the legacy logprobs shape.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::Response;
use spindle_api::{
    ApiError, Completion, CompletionChoice, CompletionChunk, CompletionLogprobs, CompletionRequest,
    LegacyTopLogprobs, Prompt, TokenLogprob, DEFAULT_COMPLETION_MAX_TOKENS,
};
use spindle_chat::Tokenizer;
use spindle_runner::SequenceSummary;

use crate::admission::Admission;
use crate::answer_parts::{finish_reason, usage, ResponseHead};
use crate::error::{failure, parse_json, HttpError};
use crate::loaded_model::ModelLease;
use crate::pipeline::generation::{Collected, Generation, Output};
use crate::pipeline::request::{self, GenerationRequest};
use crate::pipeline::respond::{respond_on_model, Answer, Delivery, ModelChoice, Protocol};
use crate::pipeline::{start_on, Started};
use crate::sse::{done_event, failure_events, json_event};
use crate::state::AppState;

pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let request: CompletionRequest = parse_json(&body?)?;
    request.validate()?;
    if request.echo && request.logprobs.is_some() {
        return Err(ApiError::bad_request(
            "echo together with logprobs is not supported",
            Some("echo"),
        )
        .into());
    }
    let model_name = request.model.clone();
    let choice = ModelChoice { name: model_name.as_deref(), ttl_seconds: request.ttl };
    let delivery = Delivery::of(request.stream);
    let started = state.clone();
    let answer: Answer<CompletionAnswer> =
        Box::new(move |model| answer_on(&started, model, &request));
    Ok(respond_on_model(&state, choice, delivery, answer).await?)
}

/// The token ids `prompt` starts from (text gets the tokenizer's special tokens, as the
/// model was trained to see a raw prompt); an empty prompt or an id outside the vocabulary is
/// refused naming `prompt`.
pub(crate) fn prompt_ids(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
    let prompt_ids = match prompt {
        Prompt::TokenIds(ids) => ids.clone(),
        prompt => {
            let text = prompt.as_text().ok_or_else(|| {
                ApiError::bad_request("prompt must hold exactly one text", Some("prompt"))
            })?;
            tokenizer.encode(text, true).map_err(failure)?
        }
    };
    if prompt_ids.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty", Some("prompt")));
    }
    if let Some(bad) = prompt_ids.iter().find(|&&id| id as usize >= tokenizer.vocab_size()) {
        return Err(ApiError::bad_request(
            format!("token id {bad} is outside the vocabulary"),
            Some("prompt"),
        ));
    }
    Ok(prompt_ids)
}

/// Tokenizes `request`'s prompt with `model`'s tokenizer and submits it.
fn answer_on(
    state: &Arc<AppState>,
    model: ModelLease,
    request: &CompletionRequest,
) -> Result<(Generation, CompletionAnswer), ApiError> {
    let tokenizer = &model.model.tokenizer;
    let prompt_ids = prompt_ids(tokenizer, &request.prompt)?;
    let echo = if request.echo {
        tokenizer.decode(&prompt_ids, false).map_err(failure)?
    } else {
        String::new()
    };
    let generation_request = GenerationRequest {
        model: request.model.clone(),
        prompt: request::Prompt::Tokens(prompt_ids),
        sampling: request.sampling.clone(),
        max_tokens: Some(request.max_tokens.unwrap_or(DEFAULT_COMPLETION_MAX_TOKENS)),
        logprobs: request.logprobs.map(|n| n as usize),
        prompt_field: "prompt",
        endpoint: "/v1/completions",
        ttl: request.ttl,
    };
    generation_request.validate()?;
    let head = ResponseHead::new(ResponseHead::fresh_id("cmpl"), &model.id);
    let Started { generation, .. } =
        start_on(state, model, &generation_request, &head.id, Admission::Live)?;
    let include_usage = request.stream_options.as_ref().is_some_and(|o| o.include_usage);
    Ok((generation, CompletionAnswer { head, echo, include_usage }))
}

impl ResponseHead {
    fn completion_event(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<spindle_api::Usage>,
    ) -> Event {
        let chunk = CompletionChunk {
            id: self.id.clone(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage,
        };
        json_event(&chunk)
    }
}

/// Accumulates the legacy logprobs arrays; `text_offset` counts characters of the output.
#[derive(Default)]
struct LegacyLogprobs {
    logprobs: CompletionLogprobs,
    offset: u32,
}

impl LegacyLogprobs {
    fn push(&mut self, lp: TokenLogprob, text: &str) {
        self.logprobs.text_offset.push(self.offset);
        self.offset += text.chars().count() as u32;
        self.logprobs.tokens.push(lp.token);
        self.logprobs.token_logprobs.push(Some(lp.logprob));
        let top = lp.top_logprobs.into_iter().map(|t| (t.token, t.logprob)).collect();
        self.logprobs.top_logprobs.push(Some(LegacyTopLogprobs(top)));
    }
}

fn choice(
    text: String,
    logprobs: Option<CompletionLogprobs>,
    summary: Option<&SequenceSummary>,
) -> CompletionChoice {
    CompletionChoice {
        text,
        index: 0,
        logprobs,
        finish_reason: summary.map(|s| finish_reason(s.finish_reason)),
    }
}

/// The Completions answer. Streamed: the echo, a chunk per token that released text (or has
/// logprobs), the finish chunk, the usage chunk when asked for, and `[DONE]`. Whole: the same
/// outputs, concatenated.
struct CompletionAnswer {
    head: ResponseHead,
    /// The prompt's text, when the request asked for it back.
    echo: String,
    include_usage: bool,
}

impl Protocol for CompletionAnswer {
    type Whole = Completion;

    fn opening(&mut self) -> Vec<Event> {
        let echo = std::mem::take(&mut self.echo);
        (!echo.is_empty())
            .then(|| self.head.completion_event(vec![choice(echo, None, None)], None))
            .into_iter()
            .collect()
    }

    fn events(&mut self, output: Output) -> Vec<Event> {
        let head = &self.head;
        match output {
            Output::Text { delta, logprob } => {
                let logprobs = logprob.map(|lp| {
                    let mut legacy = LegacyLogprobs::default();
                    legacy.push(lp, &delta.content);
                    legacy.logprobs
                });
                if delta.content.is_empty() && logprobs.is_none() {
                    vec![]
                } else {
                    vec![head.completion_event(vec![choice(delta.content, logprobs, None)], None)]
                }
            }
            Output::Done(summary) => {
                let tail = choice(summary.tail.content.clone(), None, Some(&summary));
                let mut events = vec![head.completion_event(vec![tail], None)];
                if self.include_usage {
                    events.push(head.completion_event(vec![], Some(usage(&summary))));
                }
                events.push(done_event());
                events
            }
            Output::Failed(error) => failure_events(&error),
            Output::Progress(_) => vec![],
        }
    }

    fn whole(self, whole: Collected) -> Result<Completion, ApiError> {
        let mut legacy = LegacyLogprobs::default();
        for (delta, logprob) in &whole.pieces {
            if let Some(lp) = logprob {
                legacy.push(lp.clone(), &delta.content);
            }
        }
        let head = self.head;
        Ok(Completion {
            id: head.id,
            created: head.created,
            model: head.model,
            system_fingerprint: None,
            choices: vec![choice(
                self.echo + &whole.text(|d| &d.content),
                whole.logprobs.then_some(legacy.logprobs),
                Some(&whole.summary),
            )],
            usage: usage(&whole.summary),
        })
    }
}
