//! Request handling shared by the generation endpoints: the model check, fitting the output
//! into the context, sampling defaults, ids, and usage.

use spindle_api::{ApiError, FinishReason, SamplingParams, Usage};
use spindle_runner::sampler::SamplingParams as RunnerSampling;
use spindle_runner::{RunnerError, SequenceRequest, SequenceSummary};

use crate::error::prompt_too_long;
use crate::state::{unix_now, AppState};

/// 404 for a model this server does not serve. An absent or empty name means the one it does.
pub fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(name) if !name.is_empty() && name != state.config.model_id => Err(ApiError {
            code: Some("model_not_found".into()),
            ..ApiError::not_found(format!(
                "the model `{name}` does not exist; this server serves `{}`",
                state.config.model_id
            ))
        }),
        _ => Ok(()),
    }
}

/// The output limit: what the client asked for, capped by the room the prompt leaves in the
/// context; a prompt that leaves no room is a 400 `context_length_exceeded` naming
/// `prompt_field`, the request field that holds the prompt.
pub fn fit_max_tokens(
    state: &AppState,
    prompt_tokens: usize,
    requested: Option<u32>,
    prompt_field: &str,
) -> Result<usize, ApiError> {
    let context = state.config.ctx_size.min(state.model.max_positions);
    if prompt_tokens >= context {
        let error = RunnerError::PromptExceedsContext { prompt: prompt_tokens, context };
        return Err(prompt_too_long(&error, prompt_field));
    }
    // Generated tokens take blocks as they come (a full pool preempts the newest sequence), but
    // a prompt must fit the whole pool on its own.
    let kv_tokens = state.model.kv_tokens;
    if prompt_tokens >= kv_tokens {
        let error = RunnerError::PromptExceedsKvPool { prompt: prompt_tokens, kv_tokens };
        return Err(prompt_too_long(&error, prompt_field));
    }
    let room = context - prompt_tokens;
    Ok(requested.map_or(room, |n| (n as usize).min(room)))
}

/// The engine request for `prompt_ids`: the request's sampling and stop strings, logprobs with
/// `logprobs` alternatives when asked for, ending at the model's end-of-text tokens or the
/// served context.
pub fn sequence_request(
    state: &AppState,
    prompt_ids: Vec<u32>,
    max_tokens: usize,
    sampling: &SamplingParams,
    logprobs: Option<usize>,
) -> SequenceRequest {
    SequenceRequest {
        stop_ids: state.model.tokenizer.eos_token_ids().to_vec(),
        stop_strings: stop_strings(sampling),
        speculative: sampling.speculative,
        ..SequenceRequest::plain(
            prompt_ids,
            max_tokens,
            RunnerSampling { top_logprobs: logprobs, ..runner_sampling(sampling) },
            state.config.ctx_size,
        )
    }
}

/// OpenAI's defaults where the request is silent: temperature 1, no filters, no penalties.
fn runner_sampling(p: &SamplingParams) -> RunnerSampling {
    let defaults = RunnerSampling::default();
    RunnerSampling {
        temperature: p.temperature.unwrap_or(defaults.temperature),
        // vLLM's -1 and OpenAI's absent both mean no limit.
        top_k: p.top_k.map_or(0, |k| k.max(0) as usize),
        top_p: p.top_p.unwrap_or(defaults.top_p),
        min_p: p.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: p.repetition_penalty.unwrap_or(defaults.repetition_penalty),
        presence_penalty: p.presence_penalty.unwrap_or(defaults.presence_penalty),
        frequency_penalty: p.frequency_penalty.unwrap_or(defaults.frequency_penalty),
        // The wire type is signed; its bits seed the RNG, so every value is usable.
        seed: p.seed.map(|s| s as u64),
        top_logprobs: None,
    }
}

/// The fields every chunk and completion of one response repeat.
pub struct ResponseHead {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseHead {
    /// A fresh id such as `chatcmpl-3f2a…` (`prefix` names the endpoint), stamped now, naming
    /// the served model.
    pub fn new(state: &AppState, prefix: &str) -> Self {
        Self {
            id: format!("{prefix}-{:032x}", rand::random::<u128>()),
            created: unix_now(),
            model: state.config.model_id.clone(),
        }
    }
}

/// The request's stop strings; none when it gives none.
fn stop_strings(p: &SamplingParams) -> Vec<String> {
    p.stop.clone().map(|s| s.into_vec()).unwrap_or_default()
}

pub fn finish_reason(reason: spindle_runner::FinishReason) -> FinishReason {
    match reason {
        // OpenAI has no "cancelled"; a cancelled request ended where it was told to.
        spindle_runner::FinishReason::Stop | spindle_runner::FinishReason::Cancelled => {
            FinishReason::Stop
        }
        spindle_runner::FinishReason::Length => FinishReason::Length,
    }
}

pub fn usage(summary: &SequenceSummary) -> Usage {
    let mut usage = Usage::new(summary.prompt_tokens as u32, summary.completion_tokens as u32);
    usage.prompt_tokens_details.cached_tokens = summary.cached_tokens as u32;
    usage.completion_tokens_details.reasoning_tokens = summary.reasoning_tokens as u32;
    usage
}
