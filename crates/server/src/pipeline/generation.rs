//! One request's generation as the handlers see it: submitted to the engine, then read back as
//! [`Output`]s with logprobs in the OpenAI shape and latency metrics recorded on the way.
//! Streaming and non-streaming responses both read this same sequence.

use std::sync::Arc;
use std::time::Instant;

use spindle_api::{ApiError, PromptProgress, TokenLogprob, TopLogprob};
use spindle_chat::Tokenizer;
use spindle_runner::sampler::SampledToken;
use spindle_runner::{
    sequence_channel, SequenceEvent, SequenceEvents, SequenceRequest, SequenceSummary, TextDelta,
};

use crate::admission::{Admission, Ticket};
use crate::error::{internal_error, runner_failure};
use crate::loaded_model::ModelLease;
use crate::state::AppState;

/// What a response is built from, in order: prompt progress (when asked for), text pieces,
/// then one end.
pub enum Output {
    Progress(PromptProgress),
    Text { delta: TextDelta, logprob: Option<TokenLogprob> },
    Done(SequenceSummary),
    Failed(ApiError),
}

/// How often the log tells how far a long prompt has been read.
const PROGRESS_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

pub struct Generation {
    state: Arc<AppState>,
    /// The model it runs on, kept loaded until the response is dropped.
    model: ModelLease,
    /// Read only as fast as the response is sent: a slow client holds its sequence back.
    events: SequenceEvents,
    logprobs: bool,
    started: Instant,
    first_token: Option<Instant>,
    last_progress_log: Instant,
    /// Prefill progress becomes outputs too.
    progress: bool,
    last_token: Option<Instant>,
    /// The response id, for the log line.
    id: String,
    /// The route the request came in by, for the log line.
    endpoint: &'static str,
    /// The engine reported the end (finished or failed): dropped before it, the client left
    /// (or a batch request gave way).
    ended: bool,
    admission: Admission,
    /// Held until the response is dropped: frees the request's slot and cancel entry.
    _ticket: Ticket,
}

impl Generation {
    /// Admits the request (a live one 429 when full, a batch's never refused) and hands it to
    /// the engine.
    pub fn start(
        state: &Arc<AppState>,
        model: ModelLease,
        id: &str,
        endpoint: &'static str,
        request: SequenceRequest,
        admission: Admission,
    ) -> Result<Self, ApiError> {
        let (caller, events) = sequence_channel();
        let ticket = state.admissions.admit(id, events.canceller(), admission)?;
        let logprobs = request.sampling.top_logprobs.is_some();
        model.engine.submit(request, caller).map_err(|e| runner_failure(id, e.into()))?;
        Ok(Self {
            state: state.clone(),
            model,
            events,
            logprobs,
            started: Instant::now(),
            first_token: None,
            last_progress_log: Instant::now(),
            progress: false,
            last_token: None,
            id: id.to_string(),
            endpoint,
            ended: false,
            admission,
            _ticket: ticket,
        })
    }

    /// The name of the model that answers.
    pub fn model_name(&self) -> &str {
        &self.model.id
    }

    /// Also report how far the prompt has been read, as [`Output::Progress`].
    pub fn report_progress(&mut self) {
        self.progress = true;
    }

    /// The next output; `None` after the end has been returned.
    pub async fn next(&mut self) -> Option<Output> {
        loop {
            let metrics = &self.state.metrics;
            let output = match self.events.recv().await? {
                SequenceEvent::Prefilled { read, total, cached } => {
                    self.log_progress(read, total);
                    if !self.progress {
                        continue;
                    }
                    let time_ms = self.started.elapsed().as_millis() as u64;
                    Output::Progress(PromptProgress {
                        total,
                        cache: cached,
                        processed: read,
                        time_ms,
                    })
                }
                SequenceEvent::Token { token, text, .. } => {
                    let now = Instant::now();
                    let model = &self.model.id;
                    match self.last_token.replace(now) {
                        None => {
                            self.first_token = Some(now);
                            metrics.first_token(model, (now - self.started).as_secs_f64())
                        }
                        Some(previous) => {
                            metrics.inter_token(model, (now - previous).as_secs_f64())
                        }
                    }
                    let logprob =
                        self.logprobs.then(|| token_logprob(&self.model.model.tokenizer, &token));
                    Output::Text { delta: text, logprob }
                }
                SequenceEvent::Finished(summary) => {
                    metrics.finished(
                        &self.model.id,
                        summary.prompt_tokens,
                        summary.completion_tokens,
                        summary.cached_tokens,
                    );
                    self.log(&summary);
                    self.ended = true;
                    self.events.close();
                    Output::Done(summary)
                }
                SequenceEvent::Failed(error) => {
                    self.ended = true;
                    self.events.close();
                    Output::Failed(runner_failure(&self.id, error))
                }
            };
            return Some(output);
        }
    }
}

impl Generation {
    /// A log line every few seconds while a long prompt is read.
    fn log_progress(&mut self, read: usize, total: usize) {
        let now = Instant::now();
        if read < total && now - self.last_progress_log >= PROGRESS_LOG_INTERVAL {
            self.last_progress_log = now;
            let seconds = (now - self.started).as_secs_f64();
            tracing::info!(id = %self.id, read, total, seconds = format_args!("{seconds:.1}"), "reading the prompt");
        }
    }

    /// One line per request, as llama-server's operators expect: tokens read, reused and
    /// generated, and the speed of each phase (prefill from submission to the first token, so
    /// it includes any wait in the queue).
    fn log(&self, summary: &SequenceSummary) {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let prefill_s = (first - self.started).as_secs_f64();
        let decode_s = (self.last_token.unwrap_or(first) - first).as_secs_f64();
        let read = summary.prompt_tokens - summary.cached_tokens.min(summary.prompt_tokens);
        let per_second =
            |tokens: usize, seconds: f64| if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 };
        if read > 0 && self.first_token.is_some() {
            self.state.metrics.prefill_speed(&self.model.id, per_second(read, prefill_s));
        }
        // Speeds rounded as numbers, not text: a JSON log keeps them numeric.
        let rounded = |value: f64, places: i32| {
            let scale = 10f64.powi(places);
            (value * scale).round() / scale
        };
        tracing::info!(
            id = %self.id,
            model = %self.model.id,
            endpoint = self.endpoint,
            // A finished generation was answered 200 (a stream's status went out with its head).
            status = 200,
            prompt = summary.prompt_tokens,
            cached = summary.cached_tokens,
            generated = summary.completion_tokens,
            prefill_tok_s = rounded(per_second(read, prefill_s), 1),
            decode_tok_s = rounded(per_second(summary.completion_tokens.saturating_sub(1), decode_s), 1),
            total_s = rounded((now - self.started).as_secs_f64(), 2),
            drafted = summary.drafted_tokens,
            accepted = summary.accepted_tokens,
            finish = ?summary.finish_reason,
            "request done"
        );
    }
}

/// A request whose client left before its end has its line too: nginx's 499 (client closed
/// request), whatever went out before, so an operator sees every request an agent gave up on.
impl Drop for Generation {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let total_s = (self.started.elapsed().as_secs_f64() * 100.0).round() / 100.0;
        let (id, model, endpoint) = (&self.id, &self.model.id, self.endpoint);
        match self.admission {
            Admission::Live => tracing::info!(
                %id, %model, endpoint, status = 499, total_s,
                "request abandoned: the client left before its end"
            ),
            Admission::Batch => tracing::info!(
                %id, %model, total_s,
                "batch request gave way to live requests; it runs again later"
            ),
        }
    }
}

/// A whole generation, for a non-streamed response: each token's text and logprob in order,
/// then the end (whose `tail` holds the text released last).
pub struct Collected {
    pub pieces: Vec<(TextDelta, Option<TokenLogprob>)>,
    pub summary: SequenceSummary,
    /// The request asked for logprobs (so even no pieces answer with a list).
    pub logprobs: bool,
}

impl Collected {
    /// The outputs read, in order, the end included.
    pub fn outputs(self) -> impl Iterator<Item = Output> {
        let texts = self.pieces.into_iter().map(|(delta, logprob)| Output::Text { delta, logprob });
        texts.chain([Output::Done(self.summary)])
    }

    /// All text of one kind, the tail included.
    pub fn text(&self, kind: fn(&TextDelta) -> &str) -> String {
        self.pieces.iter().map(|(delta, _)| kind(delta)).chain([kind(&self.summary.tail)]).collect()
    }
}

impl Generation {
    /// Reads the generation to its end.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut pieces = Vec::new();
        loop {
            match self.next().await {
                Some(Output::Text { delta, logprob }) => pieces.push((delta, logprob)),
                Some(Output::Progress(_)) => {}
                Some(Output::Done(summary)) => {
                    return Ok(Collected { pieces, summary, logprobs: self.logprobs })
                }
                Some(Output::Failed(error)) => return Err(error),
                None => {
                    let detail = "the engine ended the request without a result";
                    return Err(internal_error(&self.id, &detail));
                }
            }
        }
    }
}

/// A sampled token in the OpenAI logprobs shape: its text, bytes and the top alternatives.
fn token_logprob(tok: &Tokenizer, token: &SampledToken) -> TokenLogprob {
    let entry = |id: u32, logprob: f32| {
        let bytes = tok.token_bytes(id);
        // JSON has no -inf; OpenAI reports impossible tokens as -9999.
        (String::from_utf8_lossy(&bytes).into_owned(), logprob.max(-9999.0), bytes)
    };
    let (text, logprob, bytes) = entry(token.id, token.logprob);
    TokenLogprob {
        token: text,
        logprob,
        bytes,
        top_logprobs: token
            .top_logprobs
            .iter()
            .map(|&(id, lp)| {
                let (token, logprob, bytes) = entry(id, lp);
                TopLogprob { token, logprob, bytes }
            })
            .collect(),
    }
}
