//! What the protocol adapters share in their answers: the response's id, time and model, the
//! tool-call stage's routing of generated text, and the OpenAI finish reason and usage.

use spindle_api::{FinishReason, ToolCallDelta, Usage};
use spindle_runner::{SequenceSummary, TextDelta};

use crate::clock::unix_now;
use crate::pipeline::tool_calls::ToolCallStage;

/// The fields every chunk and completion of one response repeat.
pub struct ResponseHead {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseHead {
    /// A fresh id such as `chatcmpl-3f2a…` (`prefix` names the endpoint).
    pub fn fresh_id(prefix: &str) -> String {
        format!("{prefix}-{:032x}", rand::random::<u128>())
    }

    /// The head of response `id`, stamped now, naming the model that answers it.
    pub fn new(id: String, model: &str) -> Self {
        Self { id, created: unix_now(), model: model.to_string() }
    }
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

/// Routes a delta's content through the tool-call stage, when the request has one.
pub(crate) fn staged(
    tools: &mut Option<ToolCallStage>,
    mut text: TextDelta,
) -> (TextDelta, Vec<ToolCallDelta>) {
    match tools {
        Some(stage) => {
            let staged = stage.push(&text.content);
            text.content = staged.content;
            (text, staged.tool_calls)
        }
        None => (text, Vec::new()),
    }
}

/// The end of the answer: the text released last, and what the tool-call stage held back.
pub(crate) fn staged_tail(
    tools: &mut Option<ToolCallStage>,
    tail: TextDelta,
) -> (TextDelta, Vec<ToolCallDelta>) {
    let (mut text, mut calls) = staged(tools, tail);
    if let Some(stage) = tools {
        let rest = stage.finish();
        text.content.push_str(&rest.content);
        calls.extend(rest.tool_calls);
    }
    (text, calls)
}

/// `tool_calls` when the model stopped after calling a tool (call it after the stage's end).
pub(crate) fn chat_finish_reason(
    reason: spindle_runner::FinishReason,
    tools: &Option<ToolCallStage>,
) -> FinishReason {
    match (reason, tools) {
        (spindle_runner::FinishReason::Stop, Some(stage)) if stage.called() => {
            FinishReason::ToolCalls
        }
        (reason, _) => finish_reason(reason),
    }
}
