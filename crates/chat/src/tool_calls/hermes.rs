//! Hermes / Qwen2.5 calls: one JSON object per `<tool_call>` block.
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! A block is only a call once its JSON is whole, so each block is held until its closing tag
//! and then goes out as a name and one argument fragment. A block that is not a call is given
//! back as content, tags included.

use super::coerce::ToolSchemas;
use super::emit::Emitter;
use super::json_call::JsonCall;
use super::FormatParser;
use crate::stop::partial_match_start;

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

#[derive(Debug)]
enum State {
    Content,
    /// Inside a block; its closing tag does not start before byte `scanned` of the pending text.
    Block {
        scanned: usize,
    },
}

#[derive(Debug)]
pub(super) struct HermesParser {
    schemas: ToolSchemas,
    state: State,
    /// Text received and not consumed yet; in a block, the block's text after the opening tag.
    pending: String,
}

impl FormatParser for HermesParser {
    fn push(&mut self, text: &str, out: &mut Emitter) {
        self.pending.push_str(text);
        loop {
            match self.state {
                State::Content => match self.pending.find(CALL_OPEN) {
                    Some(at) => {
                        out.content(&self.pending[..at]);
                        self.pending.drain(..at + CALL_OPEN.len());
                        self.state = State::Block { scanned: 0 };
                    }
                    None => {
                        let keep = partial_match_start(&self.pending, &[CALL_OPEN]);
                        out.content(&self.pending[..keep]);
                        self.pending.drain(..keep);
                        return;
                    }
                },
                State::Block { scanned } => match self.pending[scanned..].find(CALL_CLOSE) {
                    Some(at) => {
                        let rest = self.pending.split_off(scanned + at + CALL_CLOSE.len());
                        let mut block = std::mem::replace(&mut self.pending, rest);
                        block.truncate(scanned + at);
                        self.emit_block(&block, CALL_CLOSE, out);
                        self.state = State::Content;
                    }
                    None => {
                        self.state = State::Block {
                            scanned: partial_match_start(&self.pending, &[CALL_CLOSE]),
                        };
                        return;
                    }
                },
            }
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        let pending = std::mem::take(&mut self.pending);
        match std::mem::replace(&mut self.state, State::Content) {
            State::Content => out.content(&pending),
            State::Block { .. } => {
                // The closing tag never came, or came only in part.
                let cut = partial_match_start(&pending, &[CALL_CLOSE]);
                let (body, partial_close) = pending.split_at(cut);
                self.emit_block(body, partial_close, out);
            }
        }
    }
}

impl HermesParser {
    pub(super) fn new(schemas: ToolSchemas) -> Self {
        Self { schemas, state: State::Content, pending: String::new() }
    }

    /// A block with text `body`, closed by `close` (the closing tag as far as it came).
    fn emit_block(&self, body: &str, close: &str, out: &mut Emitter) {
        match JsonCall::parse(body, &self.schemas) {
            Some(call) => out.whole_call(&call.name, call.arguments),
            None => out.content(&format!("{CALL_OPEN}{body}{close}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::{ToolEvent, ToolSchema};
    use serde_json::json;

    fn parser() -> HermesParser {
        let parameters = json!({"properties": {"days": {"type": "integer"}}});
        HermesParser::new(ToolSchemas::new(&[ToolSchema {
            name: "get_weather".into(),
            parameters,
        }]))
    }

    fn run(text: &str) -> Vec<ToolEvent> {
        let (mut parser, mut out) = (parser(), Emitter::default());
        parser.push(text, &mut out);
        parser.finish(&mut out);
        out.finish();
        out.take_events()
    }

    fn content(text: &str) -> ToolEvent {
        ToolEvent::Content(text.into())
    }

    fn call(index: usize, name: &str, arguments: &str) -> [ToolEvent; 2] {
        [
            ToolEvent::CallStart { index, name: name.into() },
            ToolEvent::Arguments { index, fragment: arguments.into() },
        ]
    }

    #[test]
    fn block_is_held_until_its_closing_tag() {
        let (mut parser, mut out) = (parser(), Emitter::default());
        parser.push("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": \"2\"}}\n</tool_", &mut out);
        assert_eq!(out.take_events(), [content("Let me look.")]);
        parser.push("call>", &mut out);
        assert_eq!(out.take_events(), call(0, "get_weather", r#"{"days":2}"#));
    }

    #[test]
    fn block_that_is_no_call_is_content() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call> then";
        assert_eq!(run(text), [content(text)]);
        let text = "<tool_call>{\"arguments\": {}}</tool_call>";
        assert_eq!(run(text), [content(text)]);
    }

    #[test]
    fn unclosed_block_is_a_call_when_its_json_is_whole() {
        assert_eq!(run("<tool_call>\n{\"name\": \"f\"}\n</tool"), call(0, "f", "{}"));
        assert_eq!(
            run("<tool_call>\n{\"name\": \"f\""),
            [content("<tool_call>\n{\"name\": \"f\"")]
        );
    }

    #[test]
    fn several_blocks_are_numbered_in_order() {
        let text = "<tool_call>{\"name\": \"a\"}</tool_call>\n<tool_call>{\"name\": \"b\", \"parameters\": {\"x\": [1]}}</tool_call>";
        assert_eq!(run(text), [call(0, "a", "{}"), call(1, "b", r#"{"x":[1]}"#)].concat());
    }
}
