//! The engine request a generation request becomes: its prompt's token ids (and the positions
//! where the prefix cache keeps snapshots), the output limit fitted into the context, the
//! reasoning budget, the grammar, and sampling with OpenAI's defaults.

use spindle_api::{ApiError, SamplingParams};
use spindle_constrain::Constraint;
use spindle_runner::model_sampling::ThinkingMode;
use spindle_runner::sampler::SamplingParams as RunnerSampling;
use spindle_runner::{ReasoningBudget, ReasoningMode, RunnerError, SequenceRequest};

use crate::error::{failure, prompt_too_long};
use crate::loaded_model::LoadedModel;
use crate::pipeline::render::render_prompt;
use crate::pipeline::request::{Conversation, GenerationRequest, Prompt};
use crate::sampling_defaults::SamplingDefaults;
use crate::state::AppState;

/// Renders and tokenizes the prompt and decides everything the engine needs; a prompt too long
/// for the context is refused naming the request's prompt field.
pub(crate) fn plan(
    state: &AppState,
    model: &LoadedModel,
    request: &GenerationRequest,
    constraint: Option<Constraint>,
) -> Result<SequenceRequest, ApiError> {
    let conversation = match &request.prompt {
        Prompt::Tokens(ids) => {
            let max_tokens = fit_max_tokens(model, ids.len(), request)?;
            // A raw prompt has no reasoning block the server opens.
            let mode = ThinkingMode::NonThinking;
            return Ok(sequence_request(state, model, ids.clone(), max_tokens, request, mode));
        }
        Prompt::Chat(conversation) => conversation,
    };
    let Conversation { messages, tools, template_kwargs, .. } = conversation.as_ref();
    let rendered = render_prompt(state, model, messages, tools, template_kwargs)?;
    // The template writes BOS itself where the model wants one.
    let (prompt_ids, spans) =
        model.model.tokenizer.encode_with_spans(&rendered.text).map_err(failure)?;
    let snapshot_positions = token_positions(&rendered.message_ends, &spans);
    let max_tokens = fit_max_tokens(model, prompt_ids.len(), request)?;

    let reasoning = rendered.reasoning;
    let mode = match reasoning {
        ReasoningMode::Tagged { .. } => ThinkingMode::Thinking,
        ReasoningMode::Off => ThinkingMode::NonThinking,
    };
    let reasoning_budget = match (&reasoning, &model.profile.reasoning) {
        (ReasoningMode::Tagged { .. }, Some(tags)) => Some(ReasoningBudget {
            max_tokens: conversation
                .thinking_budget
                .map(|n| n as usize)
                .or(state.config.thinking_budget),
            close_ids: tags.close_ids.clone(),
        }),
        _ => None,
    };
    if let Some(budget) = &reasoning_budget {
        check_room_to_answer(max_tokens, budget)?;
    }
    Ok(SequenceRequest {
        snapshot_positions,
        reasoning,
        reasoning_budget,
        constraint,
        ..sequence_request(state, model, prompt_ids, max_tokens, request, mode)
    })
}

/// The output limit: what the client asked for, capped by the room the prompt leaves in the
/// context; a prompt that leaves no room is a 400 `context_length_exceeded` naming the request
/// field that holds the prompt.
fn fit_max_tokens(
    model: &LoadedModel,
    prompt_tokens: usize,
    request: &GenerationRequest,
) -> Result<usize, ApiError> {
    let context = model.ctx_size.min(model.model.max_positions);
    if prompt_tokens >= context {
        let error = RunnerError::PromptExceedsContext { prompt: prompt_tokens, context };
        return Err(prompt_too_long(&error, request.prompt_field));
    }
    // Generated tokens take blocks as they come (a full pool preempts the newest sequence), but
    // a prompt must fit the whole pool on its own.
    let kv_tokens = model.model.kv_tokens;
    if prompt_tokens >= kv_tokens {
        let error = RunnerError::PromptExceedsKvPool { prompt: prompt_tokens, kv_tokens };
        return Err(prompt_too_long(&error, request.prompt_field));
    }
    let room = context - prompt_tokens;
    Ok(request.max_tokens.map_or(room, |n| (n as usize).min(room)))
}

/// The engine request for `prompt_ids`: the request's sampling (the defaults of an answer in
/// `mode` where it is silent) and stop strings, logprobs when asked for, ending at the model's
/// end-of-text tokens or the served context.
fn sequence_request(
    state: &AppState,
    model: &LoadedModel,
    prompt_ids: Vec<u32>,
    max_tokens: usize,
    request: &GenerationRequest,
    mode: ThinkingMode,
) -> SequenceRequest {
    let sampling = &request.sampling;
    let defaults = model.sampling_defaults(&state.config.sampling, mode);
    SequenceRequest {
        stop_ids: model.model.tokenizer.eos_token_ids().to_vec(),
        stop_strings: sampling.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
        speculative: sampling.speculative,
        ..SequenceRequest::plain(
            prompt_ids,
            max_tokens,
            RunnerSampling {
                top_logprobs: request.logprobs,
                ..runner_sampling(sampling, &defaults)
            },
            model.ctx_size,
        )
    }
}

/// The request's sampling, and `defaults` (flag, model or built-in) where it is silent; the
/// penalties a model's files cannot set default to none.
fn runner_sampling(p: &SamplingParams, defaults: &SamplingDefaults) -> RunnerSampling {
    let built_in = RunnerSampling::default();
    RunnerSampling {
        temperature: p.temperature.unwrap_or(defaults.temperature.value),
        // vLLM's -1 (and 0) mean no limit.
        top_k: p.top_k.map_or(defaults.top_k.value, |k| k.max(0) as usize),
        top_p: p.top_p.unwrap_or(defaults.top_p.value),
        min_p: p.min_p.unwrap_or(defaults.min_p.value),
        repetition_penalty: p.repetition_penalty.unwrap_or(defaults.repetition_penalty.value),
        presence_penalty: p.presence_penalty.unwrap_or(built_in.presence_penalty),
        frequency_penalty: p.frequency_penalty.unwrap_or(built_in.frequency_penalty),
        // The wire type is signed; its bits seed the RNG, so every value is usable.
        seed: p.seed.map(|s| s as u64),
        top_logprobs: None,
    }
}

/// With thinking on, the engine may have to close the reasoning block itself and then owes the
/// answer a token: `max_tokens` too small for both could only end in an empty answer.
fn check_room_to_answer(max_tokens: usize, budget: &ReasoningBudget) -> Result<(), ApiError> {
    let needed = budget.close_ids.len() + 1;
    if max_tokens >= needed {
        return Ok(());
    }
    Err(ApiError::bad_request(
        format!(
            "the output may have {max_tokens} tokens (max_tokens, or the room the prompt leaves \
             in the context), but with thinking on it needs at least {needed}: {} to close the \
             reasoning block and one to answer; raise max_tokens or turn thinking off",
            budget.close_ids.len()
        ),
        Some("max_tokens"),
    ))
}

/// The token positions of the byte offsets `ends` in a prompt whose tokens cover `spans`: the
/// count of tokens before each, where a token ends exactly there and none straddles it (an end
/// inside a token has no position).
fn token_positions(ends: &[usize], spans: &[(usize, usize)]) -> Vec<usize> {
    ends.iter()
        .filter_map(|&end| {
            let position = spans.partition_point(|&(_, token_end)| token_end <= end);
            let ends_here = position > 0 && spans[position - 1].1 == end;
            let straddled = spans.get(position).is_some_and(|&(start, _)| start < end);
            (ends_here && !straddled).then_some(position)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::token_positions;

    #[test]
    fn offsets_map_to_the_tokens_before_them_unless_inside_a_token() {
        // "ab|cd|e" as tokens "ab", "cd", "e"; a multi-byte character split in two tokens shares
        // its span ("é" at 5..7).
        let spans = [(0, 2), (2, 4), (4, 5), (5, 7), (5, 7)];
        assert_eq!(token_positions(&[2, 4, 5, 7], &spans), vec![1, 2, 3, 5]);
        // Inside "cd", inside the split character, and at the start: no position.
        assert_eq!(token_positions(&[3, 6, 0], &spans), Vec::<usize>::new());
    }
}
