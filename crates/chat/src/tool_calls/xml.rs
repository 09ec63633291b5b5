//! Qwen3-Coder / Qwen3.5 calls: XML-like tags around bare parameter values.
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! A call starts once its `<function=NAME>` tag is complete, and each parameter goes out as
//! one argument fragment when its value ends, so a client sees the call grow parameter by
//! parameter. Values are raw text up to `</parameter>` (they may hold newlines and `<`); the
//! one newline the template puts on each side is not part of the value. Models sometimes skip
//! tags: `<tool_call>` may be missing, and a value also ends at the next `<parameter=` or at
//! `</function>`.

use std::collections::HashSet;

use super::coerce::ToolSchemas;
use super::emit::Emitter;
use super::FormatParser;
use crate::stop::partial_match_start;

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAMETER_OPEN: &str = "<parameter=";
const PARAMETER_CLOSE: &str = "</parameter>";

/// Markers that start a call in content.
const CALL_STARTS: [&str; 2] = [CALL_OPEN, FUNCTION_OPEN];
/// Markers that matter between parameters. A function that forgot its `</function>` is
/// closed by `</tool_call>` or by the next `<function=`.
const FUNCTION_PARTS: [&str; 4] = [PARAMETER_OPEN, FUNCTION_CLOSE, CALL_CLOSE, FUNCTION_OPEN];
/// Markers that end a parameter value.
const VALUE_ENDS: [&str; 3] = [PARAMETER_CLOSE, PARAMETER_OPEN, FUNCTION_CLOSE];

#[derive(Debug)]
enum State {
    /// Plain text, looking for a call.
    Content,
    /// After `<tool_call>`: whitespace, then `<function=` must come.
    CallOpened,
    /// After `<function=`, reading the name up to `>`.
    FunctionName,
    /// Inside a function, between parameters.
    Function,
    /// After `<parameter=`, reading the name up to `>`.
    ParameterName,
    /// Reading the value of parameter `name`; no end marker starts before byte `scanned`.
    ParameterValue { name: String, scanned: usize },
    /// After `</function>`: an optional `</tool_call>` may follow.
    FunctionClosed,
}

/// What one step decided: the next state, and whether the pending text may decide more.
enum Next {
    Go(State),
    Wait(State),
}

#[derive(Debug)]
pub(super) struct XmlParser {
    schemas: ToolSchemas,
    state: State,
    /// Text received and not consumed yet.
    pending: String,
    /// The tags of a call whose name is not complete yet: content if it never becomes a call.
    opening: String,
    /// The open call's name.
    function: String,
    /// Parameters the open call has sent.
    sent: HashSet<String>,
}

impl FormatParser for XmlParser {
    fn push(&mut self, text: &str, out: &mut Emitter) {
        self.pending.push_str(text);
        loop {
            let state = std::mem::replace(&mut self.state, State::Content);
            match self.step(state, out) {
                Next::Go(state) => self.state = state,
                Next::Wait(state) => {
                    self.state = state;
                    break;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Emitter) {
        let pending = std::mem::take(&mut self.pending);
        match std::mem::replace(&mut self.state, State::Content) {
            State::Content => out.content(&pending),
            State::CallOpened | State::FunctionName => {
                out.content(&std::mem::take(&mut self.opening));
                out.content(&pending);
            }
            State::Function | State::ParameterName => out.close_call(),
            State::ParameterValue { name, .. } => {
                // What arrived of the value, less a closing tag cut off halfway.
                let received = &pending[..partial_match_start(&pending, &VALUE_ENDS)];
                self.add_parameter(&name, received, out);
                out.close_call();
            }
            State::FunctionClosed => {}
        }
    }
}

impl XmlParser {
    pub(super) fn new(schemas: ToolSchemas) -> Self {
        Self {
            schemas,
            state: State::Content,
            pending: String::new(),
            opening: String::new(),
            function: String::new(),
            sent: HashSet::new(),
        }
    }

    fn step(&mut self, state: State, out: &mut Emitter) -> Next {
        match state {
            State::Content => self.content(out),
            State::CallOpened => self.call_opened(out),
            State::FunctionName => self.function_name(out),
            State::Function => self.function(out),
            State::ParameterName => self.parameter_name(),
            State::ParameterValue { name, scanned } => self.parameter_value(name, scanned, out),
            State::FunctionClosed => self.function_closed(),
        }
    }

    /// Releases text up to a call marker, or up to what could still become one.
    fn content(&mut self, out: &mut Emitter) -> Next {
        let Some((at, marker)) = earliest(&self.pending, &CALL_STARTS) else {
            let keep = partial_match_start(&self.pending, &CALL_STARTS);
            out.content(&self.pending[..keep]);
            self.pending.drain(..keep);
            return Next::Wait(State::Content);
        };
        out.content(&self.pending[..at]);
        self.pending.drain(..at + marker.len());
        self.opening = marker.to_string();
        Next::Go(if marker == CALL_OPEN { State::CallOpened } else { State::FunctionName })
    }

    fn call_opened(&mut self, out: &mut Emitter) -> Next {
        let body = self.pending.trim_start();
        if body.starts_with(FUNCTION_OPEN) {
            let end = self.pending.len() - body.len() + FUNCTION_OPEN.len();
            self.opening.extend(self.pending.drain(..end));
            Next::Go(State::FunctionName)
        } else if FUNCTION_OPEN.starts_with(body) {
            Next::Wait(State::CallOpened)
        } else {
            // Something else inside the tag: the tag was text after all.
            out.content(&std::mem::take(&mut self.opening));
            Next::Go(State::Content)
        }
    }

    fn function_name(&mut self, out: &mut Emitter) -> Next {
        let Some(end) = self.pending.find(['>', '<', '\n']) else {
            return Next::Wait(State::FunctionName);
        };
        let name = self.pending[..end].trim();
        if !self.pending[end..].starts_with('>') || name.is_empty() {
            // Not a name (`<function=` in prose, say): the marker is text.
            out.content(&std::mem::take(&mut self.opening));
            return Next::Go(State::Content);
        }
        out.open_call(name);
        self.function = name.to_string();
        self.sent.clear();
        self.opening.clear();
        self.pending.drain(..=end);
        Next::Go(State::Function)
    }

    /// Between parameters; text that is no marker belongs to nothing and is dropped.
    fn function(&mut self, out: &mut Emitter) -> Next {
        let Some((at, marker)) = earliest(&self.pending, &FUNCTION_PARTS) else {
            let keep = partial_match_start(&self.pending, &FUNCTION_PARTS);
            self.pending.drain(..keep);
            return Next::Wait(State::Function);
        };
        self.pending.drain(..at + marker.len());
        if marker == PARAMETER_OPEN {
            return Next::Go(State::ParameterName);
        }
        out.close_call();
        Next::Go(match marker {
            FUNCTION_CLOSE => State::FunctionClosed,
            FUNCTION_OPEN => {
                self.opening = marker.to_string();
                State::FunctionName
            }
            _ => State::Content,
        })
    }

    fn parameter_name(&mut self) -> Next {
        let Some(end) = self.pending.find('>') else {
            return Next::Wait(State::ParameterName);
        };
        let name = self.pending[..end].trim().to_string();
        self.pending.drain(..=end);
        Next::Go(State::ParameterValue { name, scanned: 0 })
    }

    /// Waits for the value's end; values go out whole, as the arguments' JSON needs them.
    fn parameter_value(&mut self, name: String, scanned: usize, out: &mut Emitter) -> Next {
        let Some((at, marker)) = earliest(&self.pending[scanned..], &VALUE_ENDS) else {
            // Only the tail that could start a marker needs searching again.
            let scanned = partial_match_start(&self.pending, &VALUE_ENDS);
            return Next::Wait(State::ParameterValue { name, scanned });
        };
        let rest = self.pending.split_off(scanned + at);
        let value = std::mem::replace(&mut self.pending, rest);
        self.add_parameter(&name, &value, out);
        // A missing `</parameter>`: the marker found belongs to what comes next.
        if marker == PARAMETER_CLOSE {
            self.pending.drain(..marker.len());
        }
        Next::Go(State::Function)
    }

    fn function_closed(&mut self) -> Next {
        let body = self.pending.trim_start();
        if body.starts_with(CALL_CLOSE) {
            let end = self.pending.len() - body.len() + CALL_CLOSE.len();
            self.pending.drain(..end);
            Next::Go(State::Content)
        } else if CALL_CLOSE.starts_with(body) {
            Next::Wait(State::FunctionClosed)
        } else {
            Next::Go(State::Content)
        }
    }

    /// Sends parameter `name` of the open call, unless it was sent already: the first value
    /// has gone out, so a repeat is dropped.
    fn add_parameter(&mut self, name: &str, raw: &str, out: &mut Emitter) {
        let value = raw.strip_prefix('\n').unwrap_or(raw);
        let value = value.strip_suffix('\n').unwrap_or(value);
        if self.sent.insert(name.to_string()) {
            out.argument(name, &self.schemas.coerce_text(&self.function, name, value));
        }
    }
}

/// The earliest complete occurrence of any of `markers` in `text`: its offset and the marker.
fn earliest(text: &str, markers: &[&'static str]) -> Option<(usize, &'static str)> {
    markers
        .iter()
        .filter_map(|&marker| Some((text.find(marker)?, marker)))
        .min_by_key(|&(at, _)| at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::{ToolEvent, ToolSchema};
    use serde_json::json;

    fn parser() -> XmlParser {
        let parameters =
            json!({"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}});
        XmlParser::new(ToolSchemas::new(&[ToolSchema { name: "get_weather".into(), parameters }]))
    }

    /// Events of all `pieces` taken at once, so that adjacent content is merged.
    fn run(pieces: &[&str]) -> Vec<ToolEvent> {
        let (mut parser, mut out) = (parser(), Emitter::default());
        for piece in pieces {
            parser.push(piece, &mut out);
        }
        parser.finish(&mut out);
        out.finish();
        out.take_events()
    }

    fn content(text: &str) -> ToolEvent {
        ToolEvent::Content(text.into())
    }

    fn start(index: usize, name: &str) -> ToolEvent {
        ToolEvent::CallStart { index, name: name.into() }
    }

    fn args(index: usize, fragment: &str) -> ToolEvent {
        ToolEvent::Arguments { index, fragment: fragment.into() }
    }

    #[test]
    fn each_parameter_goes_out_when_its_value_ends() {
        let (mut parser, mut out) = (parser(), Emitter::default());
        parser.push("Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", &mut out);
        assert_eq!(out.take_events(), [content("Sure."), start(0, "get_weather")]);
        parser.push("is\n</parameter>\n<parameter=days>\n3\n</para", &mut out);
        assert_eq!(out.take_events(), [args(0, r#"{"city": "Paris""#)]);
        parser.push("meter>\n</function>\n</tool_call>", &mut out);
        assert_eq!(out.take_events(), [args(0, r#", "days": 3"#), args(0, "}")]);
        parser.finish(&mut out);
        out.finish();
        assert_eq!(out.take_events(), []);
    }

    #[test]
    fn values_keep_inner_newlines_and_angle_brackets() {
        let events = run(&["<function=f>\n<parameter=code>\n\nif a < b:\n    x = '</p>'\n\n</parameter>\n</function>"]);
        assert_eq!(
            events,
            [start(0, "f"), args(0, r#"{"code": "\nif a < b:\n    x = '</p>'\n""#), args(0, "}")]
        );
    }

    #[test]
    fn missing_parameter_close_ends_at_next_tag() {
        let events =
            run(&["<function=get_weather><parameter=city>Paris<parameter=days>2</function>"]);
        assert_eq!(
            events,
            [
                start(0, "get_weather"),
                args(0, r#"{"city": "Paris""#),
                args(0, r#", "days": 2"#),
                args(0, "}")
            ]
        );
    }

    #[test]
    fn repeated_parameter_keeps_the_first() {
        let events = run(&["<function=get_weather><parameter=days>1</parameter><parameter=days>2</parameter></function>"]);
        assert_eq!(events, [start(0, "get_weather"), args(0, r#"{"days": 1"#), args(0, "}")]);
    }

    #[test]
    fn function_without_parameters_has_empty_arguments() {
        assert_eq!(
            run(&["<tool_call><function=now></function></tool_call>"]),
            [start(0, "now"), args(0, "{}")]
        );
    }

    #[test]
    fn call_close_or_next_function_closes_a_function_left_open() {
        let events = run(&["<tool_call><function=a><parameter=x>1</parameter></tool_call>\nok <function=b></function>"]);
        assert_eq!(
            events,
            [
                start(0, "a"),
                args(0, r#"{"x": "1""#),
                args(0, "}"),
                content("\nok"),
                start(1, "b"),
                args(1, "{}")
            ]
        );
        let events = run(&["<function=a><function=b>"]);
        assert_eq!(events, [start(0, "a"), args(0, "{}"), start(1, "b"), args(1, "{}")]);
    }

    #[test]
    fn unterminated_value_becomes_the_value() {
        let events = run(&["<function=get_weather>\n<parameter=city>\nLyon\n</param"]);
        assert_eq!(events, [start(0, "get_weather"), args(0, r#"{"city": "Lyon""#), args(0, "}")]);
    }

    #[test]
    fn opening_that_never_names_a_function_is_content() {
        assert_eq!(run(&["a <tool_call>\n<func"]), [content("a <tool_call>\n<func")]);
        assert_eq!(
            run(&["<tool_call>{\"name\": 1}</tool_call>"]),
            [content("<tool_call>{\"name\": 1}</tool_call>")]
        );
        assert_eq!(run(&["x <function=\nf>"]), [content("x <function=\nf>")]);
        assert_eq!(run(&["<function=> y"]), [content("<function=> y")]);
    }

    #[test]
    fn partial_marker_is_held_then_released() {
        let (mut parser, mut out) = (parser(), Emitter::default());
        parser.push("see <func", &mut out);
        assert_eq!(out.take_events(), [content("see")]);
        parser.push("tor", &mut out);
        assert_eq!(out.take_events(), [content(" <functor")]);
    }
}
