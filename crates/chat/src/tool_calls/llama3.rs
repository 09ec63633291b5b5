//! Llama-3 calls: the whole message is the calls, as JSON objects, after an optional
//! `<|python_tag|>`.
//!
//! ```text
//! <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}
//! ```
//!
//! Whether a message is calls shows in its first characters: one that starts with `{` or the
//! tag is held whole and parsed at the end (and given back as content if it is no calls);
//! any other message is content and streams as it comes.

use serde_json::Value;

use super::coerce::ToolSchemas;
use super::emit::Emitter;
use super::json_call::JsonCall;
use super::FormatParser;

const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Whitespace, perhaps a partial tag: the message's kind is not known yet.
    Start,
    /// The message looks like calls and is held to the end.
    Calls,
    /// The message is content.
    Content,
}

#[derive(Debug)]
pub(super) struct Llama3Parser {
    schemas: ToolSchemas,
    mode: Mode,
    pending: String,
}

impl FormatParser for Llama3Parser {
    fn push(&mut self, text: &str, out: &mut Emitter) {
        if self.mode == Mode::Content {
            out.content(text);
            return;
        }
        self.pending.push_str(text);
        if self.mode == Mode::Start {
            let body = self.pending.trim_start();
            if body.starts_with('{') || body.starts_with(PYTHON_TAG) {
                self.mode = Mode::Calls;
            } else if !PYTHON_TAG.starts_with(body) {
                self.mode = Mode::Content;
                out.content(&std::mem::take(&mut self.pending));
            }
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        let pending = std::mem::take(&mut self.pending);
        let calls =
            if self.mode == Mode::Calls { parse_calls(&pending, &self.schemas) } else { None };
        match calls {
            Some(calls) => {
                calls.into_iter().for_each(|call| out.whole_call(&call.name, call.arguments))
            }
            None => out.content(&pending),
        }
    }
}

impl Llama3Parser {
    pub(super) fn new(schemas: ToolSchemas) -> Self {
        Self { schemas, mode: Mode::Start, pending: String::new() }
    }
}

/// The calls `text` consists of: objects separated by `;` or whitespace; `None` if anything
/// else is in it, or no call.
fn parse_calls(text: &str, schemas: &ToolSchemas) -> Option<Vec<JsonCall>> {
    let text = text.trim_start();
    let mut rest = text.strip_prefix(PYTHON_TAG).unwrap_or(text);
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ';' || c.is_whitespace());
        if rest.is_empty() {
            break;
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        calls.push(JsonCall::from_value(value, schemas)?);
        rest = &rest[values.byte_offset()..];
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::{ToolEvent, ToolSchema};
    use serde_json::json;

    fn schemas() -> ToolSchemas {
        let parameters = json!({"properties": {"days": {"type": "integer"}}});
        ToolSchemas::new(&[ToolSchema { name: "get_weather".into(), parameters }])
    }

    fn names_and_arguments(text: &str) -> Option<Vec<(String, Value)>> {
        let calls = parse_calls(text, &schemas())?;
        Some(calls.into_iter().map(|call| (call.name, Value::Object(call.arguments))).collect())
    }

    #[test]
    fn calls_are_separated_by_semicolons_or_whitespace() {
        let expected =
            vec![("get_weather".to_string(), json!({"days": 2})), ("now".to_string(), json!({}))];
        let semicolons = r#"<|python_tag|>{"name": "get_weather", "parameters": {"days": "2"}}; {"name": "now", "parameters": {}};"#;
        assert_eq!(names_and_arguments(semicolons), Some(expected.clone()));
        let lines =
            "\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}\n{\"name\": \"now\"}\n";
        assert_eq!(names_and_arguments(lines), Some(expected));
    }

    #[test]
    fn anything_else_is_no_calls() {
        for text in [
            "<|python_tag|>",
            "{\"name\": \"f\"} and more",
            "{\"name\": \"f\"} 3",
            "{\"x\": 1}",
            "{\"name\": \"f\"",
        ] {
            assert_eq!(names_and_arguments(text), None, "{text}");
        }
    }

    #[test]
    fn prose_streams_and_calls_wait_for_the_end() {
        let (mut parser, mut out) = (Llama3Parser::new(schemas()), Emitter::default());
        parser.push("  <|python", &mut out);
        parser.push("_tag|>{\"name\": \"now\"}", &mut out);
        assert_eq!(out.take_events(), []);
        parser.finish(&mut out);
        assert_eq!(out.take_events()[0], ToolEvent::CallStart { index: 0, name: "now".into() });

        let (mut parser, mut out) = (Llama3Parser::new(schemas()), Emitter::default());
        parser.push(" <|py", &mut out);
        parser.push("thon is fun\n", &mut out);
        assert_eq!(out.take_events(), [ToolEvent::Content(" <|python is fun".into())]);
    }
}
