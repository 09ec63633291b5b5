//! The Chat Completions response to a generation: `chat.completion.chunk`s streamed, or one
//! `chat.completion`.

use axum::response::sse::Event;
use spindle_api::{
    ApiError, AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatDelta, ChoiceLogprobs, Role, ToolCallDelta, Usage,
};
use spindle_runner::{SequenceSummary, TextDelta};

use crate::answer_parts::{chat_finish_reason, staged, staged_tail, usage, ResponseHead};
use crate::pipeline::generation::{Collected, Output};
use crate::pipeline::respond::Protocol;
use crate::pipeline::tool_calls::{assemble_calls, ToolCallStage};
use crate::sse::{done_event, failure_events, json_event};

impl ResponseHead {
    fn chat_chunk(
        &self,
        choices: Vec<ChatChunkChoice>,
        usage: Option<Usage>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage,
            prompt_progress: None,
        }
    }
}

fn delta_choice(
    text: TextDelta,
    tool_calls: Vec<ToolCallDelta>,
    logprobs: Option<ChoiceLogprobs>,
) -> ChatChunkChoice {
    let non_empty = |s: String| (!s.is_empty()).then_some(s);
    ChatChunkChoice {
        index: 0,
        delta: ChatDelta {
            content: non_empty(text.content),
            reasoning_content: non_empty(text.reasoning),
            tool_calls,
            ..Default::default()
        },
        logprobs,
        finish_reason: None,
    }
}

/// The Chat Completions answer. Streamed: a role chunk, a chunk per token that released text
/// (or has logprobs), the finish chunk, the usage chunk when asked for, and `[DONE]`. Whole:
/// the same outputs, concatenated.
pub(crate) struct ChatAnswer {
    pub head: ResponseHead,
    pub tools: Option<ToolCallStage>,
    /// The stream ends with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
}

impl Protocol for ChatAnswer {
    type Whole = ChatCompletion;

    fn opening(&mut self) -> Vec<Event> {
        let role = ChatChunkChoice {
            index: 0,
            delta: ChatDelta {
                role: Some(Role::Assistant),
                content: Some(String::new()),
                ..Default::default()
            },
            logprobs: None,
            finish_reason: None,
        };
        vec![json_event(&self.head.chat_chunk(vec![role], None))]
    }

    fn events(&mut self, output: Output) -> Vec<Event> {
        match output {
            Output::Text { delta, logprob } => {
                let (delta, calls) = staged(&mut self.tools, delta);
                if delta.is_empty() && calls.is_empty() && logprob.is_none() {
                    return vec![];
                }
                let logprobs = logprob.map(|lp| ChoiceLogprobs { content: vec![lp] });
                let choice = delta_choice(delta, calls, logprobs);
                vec![json_event(&self.head.chat_chunk(vec![choice], None))]
            }
            Output::Progress(progress) => {
                let choice = delta_choice(TextDelta::default(), Vec::new(), None);
                let mut chunk = self.head.chat_chunk(vec![choice], None);
                chunk.prompt_progress = Some(progress);
                vec![json_event(&chunk)]
            }
            Output::Done(summary) => self.finish_events(summary),
            Output::Failed(error) => failure_events(&error),
        }
    }

    fn whole(mut self, mut whole: Collected) -> Result<ChatCompletion, ApiError> {
        let reasoning = whole.text(|d| &d.reasoning);
        let mut logprobs = Vec::new();
        let mut content = String::new();
        let mut deltas = Vec::new();
        for (delta, logprob) in std::mem::take(&mut whole.pieces) {
            logprobs.extend(logprob);
            let (text, calls) = staged(&mut self.tools, delta);
            content.push_str(&text.content);
            deltas.extend(calls);
        }
        let (tail, calls) = staged_tail(&mut self.tools, std::mem::take(&mut whole.summary.tail));
        content.push_str(&tail.content);
        deltas.extend(calls);
        let tool_calls = assemble_calls(deltas);
        let finish_reason = chat_finish_reason(whole.summary.finish_reason, &self.tools);
        let head = self.head;
        Ok(ChatCompletion {
            id: head.id,
            created: head.created,
            model: head.model,
            system_fingerprint: None,
            choices: vec![ChatChoice {
                index: 0,
                message: AssistantMessage {
                    // OpenAI sends `null` content for a message that only calls tools.
                    content: (!content.is_empty() || tool_calls.is_empty()).then_some(content),
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls,
                },
                logprobs: whole.logprobs.then_some(ChoiceLogprobs { content: logprobs }),
                finish_reason,
            }],
            usage: usage(&whole.summary),
        })
    }
}

impl ChatAnswer {
    fn finish_events(&mut self, summary: SequenceSummary) -> Vec<Event> {
        let head = &self.head;
        let mut events = Vec::new();
        let usage = usage(&summary);
        let (tail, calls) = staged_tail(&mut self.tools, summary.tail);
        let finish_reason = chat_finish_reason(summary.finish_reason, &self.tools);
        if !tail.is_empty() || !calls.is_empty() {
            events.push(json_event(&head.chat_chunk(vec![delta_choice(tail, calls, None)], None)));
        }
        let mut last = delta_choice(TextDelta::default(), Vec::new(), None);
        last.finish_reason = Some(finish_reason);
        events.push(json_event(&head.chat_chunk(vec![last], None)));
        if self.include_usage {
            events.push(json_event(&head.chat_chunk(vec![], Some(usage))));
        }
        events.push(done_event());
        events
    }
}
