//! A generation's outputs as Anthropic stream events: reasoning becomes a `thinking` block,
//! content a `text` block, each parsed tool call a `tool_use` block, one block open at a time.
//! The streamed response sends these events; the whole response is [`assemble`]d from the very
//! same events, so the two always carry the same blocks.

use serde_json::{json, Value};
use spindle_api::anthropic::{
    BlockDelta, Message, MessageDelta, MessagesUsage, OutputBlock, StopReason, StreamEvent,
};
use spindle_api::{FinishReason, ToolCallDelta};
use spindle_runner::{SequenceSummary, TextDelta};

use crate::answer_parts::{chat_finish_reason, staged, staged_tail, ResponseHead};
use crate::pipeline::tool_calls::ToolCallStage;

#[derive(Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Thinking,
    Text,
    ToolUse,
}

/// The event state of one response.
pub(crate) struct MessageEvents {
    head: ResponseHead,
    tools: Option<ToolCallStage>,
    /// The open block: its index and kind.
    open: Option<(u32, BlockKind)>,
    blocks: u32,
    /// The open thinking block's text so far, which its signature digests.
    thinking: String,
}

impl MessageEvents {
    pub fn new(head: ResponseHead, tools: Option<ToolCallStage>) -> Self {
        Self { head, tools, open: None, blocks: 0, thinking: String::new() }
    }

    /// `msg_…`: Anthropic's form of the response id (`msg-…` inside Spindle).
    pub fn message_id(&self) -> String {
        self.head.id.replacen('-', "_", 1)
    }

    /// The message before any content: what `message_start` carries and [`assemble`] starts from.
    pub fn empty_message(&self, prompt_tokens: usize) -> Message {
        Message {
            id: self.message_id(),
            role: Default::default(),
            model: self.head.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            // Cache reads are known only at the end; `message_delta` has the final counts.
            usage: MessagesUsage { input_tokens: prompt_tokens as u32, ..Default::default() },
        }
    }

    /// `message_start`, then a `ping` as Anthropic sends one.
    pub fn start(&self, prompt_tokens: usize) -> Vec<StreamEvent> {
        vec![
            StreamEvent::MessageStart { message: self.empty_message(prompt_tokens) },
            StreamEvent::Ping,
        ]
    }

    /// The events of one generated piece.
    pub fn push(&mut self, delta: TextDelta) -> Vec<StreamEvent> {
        let (text, calls) = staged(&mut self.tools, delta);
        let mut events = Vec::new();
        self.add(text, calls, &mut events);
        events
    }

    /// The last pieces, the close of the open block, `message_delta` and `message_stop`.
    pub fn finish(&mut self, mut summary: SequenceSummary) -> Vec<StreamEvent> {
        let (text, calls) = staged_tail(&mut self.tools, std::mem::take(&mut summary.tail));
        let mut events = Vec::new();
        self.add(text, calls, &mut events);
        self.close(&mut events);
        let stop_reason = match chat_finish_reason(summary.finish_reason, &self.tools) {
            FinishReason::ToolCalls => StopReason::ToolUse,
            FinishReason::Length => StopReason::MaxTokens,
            _ if summary.stop_sequence.is_some() => StopReason::StopSequence,
            _ => StopReason::EndTurn,
        };
        let stop_sequence =
            summary.stop_sequence.filter(|_| stop_reason == StopReason::StopSequence);
        let usage = MessagesUsage {
            input_tokens: (summary.prompt_tokens - summary.cached_tokens) as u32,
            output_tokens: summary.completion_tokens as u32,
            cache_read_input_tokens: summary.cached_tokens as u32,
            cache_creation_input_tokens: 0,
        };
        events.push(StreamEvent::MessageDelta {
            delta: MessageDelta { stop_reason: Some(stop_reason), stop_sequence },
            usage,
        });
        events.push(StreamEvent::MessageStop);
        events
    }

    fn add(&mut self, text: TextDelta, calls: Vec<ToolCallDelta>, events: &mut Vec<StreamEvent>) {
        if let Some(thinking) = self.text_for(BlockKind::Thinking, &text.reasoning, events) {
            self.thinking.push_str(&thinking);
            self.delta(BlockDelta::ThinkingDelta { thinking }, events);
        }
        if let Some(text) = self.text_for(BlockKind::Text, &text.content, events) {
            self.delta(BlockDelta::TextDelta { text }, events);
        }
        for call in calls {
            if let Some(id) = call.id {
                let id = format!("toolu_{}", id.strip_prefix("call_").unwrap_or(&id));
                let name = call.function.name.unwrap_or_default();
                self.open(
                    BlockKind::ToolUse,
                    OutputBlock::ToolUse { id, name, input: json!({}) },
                    events,
                );
            }
            if !call.function.arguments.is_empty() && self.is_open(BlockKind::ToolUse) {
                self.delta(
                    BlockDelta::InputJsonDelta { partial_json: call.function.arguments },
                    events,
                );
            }
        }
    }

    /// `text` to add to a block of `kind`, opening one if needed. A block opens at the first
    /// text that is not whitespace (the newlines after `</think>`, between calls), which is
    /// dropped.
    fn text_for(
        &mut self,
        kind: BlockKind,
        text: &str,
        events: &mut Vec<StreamEvent>,
    ) -> Option<String> {
        if self.is_open(kind) {
            return (!text.is_empty()).then(|| text.to_string());
        }
        let text = text.trim_start();
        if text.is_empty() {
            return None;
        }
        let block = match kind {
            BlockKind::Thinking => {
                OutputBlock::Thinking { thinking: String::new(), signature: String::new() }
            }
            _ => OutputBlock::Text { text: String::new() },
        };
        self.open(kind, block, events);
        Some(text.to_string())
    }

    fn is_open(&self, kind: BlockKind) -> bool {
        self.open.is_some_and(|(_, open)| open == kind)
    }

    fn open(&mut self, kind: BlockKind, content_block: OutputBlock, events: &mut Vec<StreamEvent>) {
        self.close(events);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((index, kind));
        events.push(StreamEvent::ContentBlockStart { index, content_block });
    }

    fn delta(&self, delta: BlockDelta, events: &mut Vec<StreamEvent>) {
        let (index, _) = self.open.expect("a block is open");
        events.push(StreamEvent::ContentBlockDelta { index, delta });
    }

    /// Closes the open block; a thinking block gets its signature first. Spindle does not sign
    /// reasoning (clients send it back, and it is read as plain text); clients require a
    /// signature, so it gets a digest of its text (FNV-1a), the same for the same thinking.
    fn close(&mut self, events: &mut Vec<StreamEvent>) {
        let Some((index, kind)) = self.open.take() else { return };
        if kind == BlockKind::Thinking {
            let digest = std::mem::take(&mut self.thinking)
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                    (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
                });
            let signature = format!("spindle-{digest:016x}");
            events.push(StreamEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::SignatureDelta { signature },
            });
        }
        events.push(StreamEvent::ContentBlockStop { index });
    }
}

/// The whole message that `events` stream, starting from `message` (the one `message_start`
/// carries).
pub(crate) fn assemble(
    mut message: Message,
    events: impl IntoIterator<Item = StreamEvent>,
) -> Message {
    // Each tool_use block's input JSON, as it streams in pieces.
    let mut inputs: Vec<String> = Vec::new();
    for event in events {
        match event {
            StreamEvent::ContentBlockStart { content_block, .. } => {
                message.content.push(content_block);
                inputs.push(String::new());
            }
            StreamEvent::ContentBlockDelta { index, delta } => {
                let index = index as usize;
                match (&mut message.content[index], delta) {
                    (OutputBlock::Text { text }, BlockDelta::TextDelta { text: more }) => {
                        text.push_str(&more)
                    }
                    (
                        OutputBlock::Thinking { thinking, .. },
                        BlockDelta::ThinkingDelta { thinking: more },
                    ) => thinking.push_str(&more),
                    (
                        OutputBlock::Thinking { signature, .. },
                        BlockDelta::SignatureDelta { signature: more },
                    ) => signature.push_str(&more),
                    (OutputBlock::ToolUse { .. }, BlockDelta::InputJsonDelta { partial_json }) => {
                        inputs[index].push_str(&partial_json)
                    }
                    _ => unreachable!("MessageEvents sends each delta to a block of its kind"),
                }
            }
            StreamEvent::ContentBlockStop { index } => {
                let index = index as usize;
                if let OutputBlock::ToolUse { input, .. } = &mut message.content[index] {
                    let json = std::mem::take(&mut inputs[index]);
                    if !json.is_empty() {
                        // The tool-call parser emits one JSON object per call; should a cut-off
                        // call not parse, its text is kept rather than lost.
                        *input = serde_json::from_str(&json).unwrap_or(Value::String(json));
                    }
                }
            }
            StreamEvent::MessageDelta { delta, usage } => {
                message.stop_reason = delta.stop_reason;
                message.stop_sequence = delta.stop_sequence;
                message.usage = usage;
            }
            StreamEvent::MessageStart { .. }
            | StreamEvent::Ping
            | StreamEvent::MessageStop
            | StreamEvent::Error { .. } => {}
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use spindle_api::FunctionCallDelta;
    use spindle_runner::FinishReason as RunnerFinish;

    use super::*;

    fn head() -> ResponseHead {
        ResponseHead { id: "msg-abc".into(), created: 0, model: "m".into() }
    }

    fn piece(reasoning: &str, content: &str) -> TextDelta {
        TextDelta { reasoning: reasoning.into(), content: content.into() }
    }

    fn summary(finish_reason: RunnerFinish, stop_sequence: Option<&str>) -> SequenceSummary {
        SequenceSummary {
            finish_reason,
            tail: piece("", "!"),
            stop_sequence: stop_sequence.map(str::to_owned),
            prompt_tokens: 10,
            completion_tokens: 5,
            reasoning_tokens: 2,
            cached_tokens: 4,
            drafted_tokens: 0,
            accepted_tokens: 0,
        }
    }

    fn names(events: &[StreamEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                StreamEvent::ContentBlockStart { index, .. } => format!("start{index}"),
                StreamEvent::ContentBlockDelta { index, .. } => format!("delta{index}"),
                StreamEvent::ContentBlockStop { index } => format!("stop{index}"),
                other => other.name().to_string(),
            })
            .collect()
    }

    #[test]
    fn thinking_closes_signed_before_text_opens_and_whitespace_opens_nothing() {
        let mut machine = MessageEvents::new(head(), None);
        let mut events = machine.start(10);
        for delta in [
            piece("\n", ""),
            piece("Think", ""),
            piece(" more", "\n\n"),
            piece("", "Hi"),
            piece("", " there"),
        ] {
            events.extend(machine.push(delta));
        }
        events.extend(machine.finish(summary(RunnerFinish::Stop, Some("END"))));
        assert_eq!(
            names(&events),
            [
                "message_start",
                "ping",
                "start0",
                "delta0",
                "delta0",
                "delta0",
                "stop0",
                "start1",
                "delta1",
                "delta1",
                "delta1",
                "stop1",
                "message_delta",
                "message_stop"
            ]
        );
        let start = machine.empty_message(10);
        let message = assemble(start, events);
        assert_eq!(message.id, "msg_abc");
        assert_eq!(
            message.content[0],
            OutputBlock::Thinking {
                thinking: "Think more".into(),
                signature: "spindle-a08a8391d74fdc34".into()
            }
        );
        assert_eq!(message.content[1], OutputBlock::Text { text: "Hi there!".into() });
        assert_eq!(message.stop_reason, Some(StopReason::StopSequence));
        assert_eq!(message.stop_sequence.as_deref(), Some("END"));
        assert_eq!(
            message.usage,
            MessagesUsage {
                input_tokens: 6,
                output_tokens: 5,
                cache_read_input_tokens: 4,
                cache_creation_input_tokens: 0
            }
        );
    }

    #[test]
    fn tool_call_deltas_become_tool_use_blocks_with_object_inputs() {
        let mut machine = MessageEvents::new(head(), None);
        let call =
            |index: u32, id: Option<&str>, name: Option<&str>, arguments: &str| ToolCallDelta {
                index,
                id: id.map(str::to_owned),
                kind: None,
                function: FunctionCallDelta {
                    name: name.map(str::to_owned),
                    arguments: arguments.into(),
                },
            };
        let mut events = Vec::new();
        machine.add(
            piece("", "Let me look."),
            vec![call(0, Some("call_abc_0"), Some("f"), ""), call(0, None, None, "{\"a\":")],
            &mut events,
        );
        machine.add(
            piece("", ""),
            vec![call(0, None, None, "1}"), call(1, Some("call_abc_1"), Some("g"), "{}")],
            &mut events,
        );
        machine.close(&mut events);
        assert_eq!(
            names(&events),
            [
                "start0", "delta0", "stop0", "start1", "delta1", "delta1", "stop1", "start2",
                "delta2", "stop2"
            ]
        );
        let message = assemble(machine.empty_message(0), events);
        assert_eq!(
            message.content[1],
            OutputBlock::ToolUse {
                id: "toolu_abc_0".into(),
                name: "f".into(),
                input: json!({"a": 1})
            }
        );
        assert_eq!(
            message.content[2],
            OutputBlock::ToolUse { id: "toolu_abc_1".into(), name: "g".into(), input: json!({}) }
        );
    }

    #[test]
    fn stop_reasons() {
        for (finish, stop, expected) in [
            (RunnerFinish::Stop, None, StopReason::EndTurn),
            (RunnerFinish::Cancelled, None, StopReason::EndTurn),
            (RunnerFinish::Length, None, StopReason::MaxTokens),
            (RunnerFinish::Stop, Some("x"), StopReason::StopSequence),
        ] {
            let events = MessageEvents::new(head(), None).finish(summary(finish, stop));
            let message = assemble(MessageEvents::new(head(), None).empty_message(10), events);
            assert_eq!(message.stop_reason, Some(expected));
            assert_eq!(message.stop_sequence.is_some(), expected == StopReason::StopSequence);
        }
    }
}
