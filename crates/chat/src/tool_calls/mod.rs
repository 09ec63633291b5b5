//! Tool calls read out of generated text, in the formats models are trained to write them:
//! Qwen3-Coder / Qwen3.5 XML, Hermes (Qwen2.5) JSON in `<tool_call>` tags, and Llama-3 JSON.
//!
//! [`ToolCallParser`] works on the text as it streams: plain content is released as soon as it
//! cannot be the start of a call marker, and calls come out as a name followed by argument
//! fragments that concatenate to one JSON object. [`parse_message`] runs the same parser over
//! a whole message, so a streamed response and a whole one always carry the same calls.
//! Argument values written as text are typed by the tool's JSON schema (see `coerce`).
//!
//! Whitespace right before a call and between calls is dropped; so is whitespace at the end of
//! the message after a call.

mod coerce;
mod emit;
mod hermes;
mod json_call;
mod llama3;
mod xml;

use std::fmt::Debug;

use coerce::ToolSchemas;
use emit::Emitter;

/// The syntax a model writes its tool calls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Qwen3-Coder / Qwen3.5: `<function=NAME><parameter=KEY>value</parameter></function>`.
    QwenXml,
    /// Hermes / Qwen2.5: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
    Hermes,
    /// Llama 3.1+: the whole message is `{"name": ..., "parameters": {...}}`.
    Llama3Json,
}

impl ToolCallFormat {
    /// Every format, for tests that run all of them.
    pub const ALL: [Self; 3] = [Self::QwenXml, Self::Hermes, Self::Llama3Json];

    /// Canonical names, for error messages.
    pub const NAMES: &'static [&'static str] = &["qwen3_xml", "hermes", "llama3_json"];

    /// Names accepted by `--tool-call-parser`: "qwen3_xml" (aliases "qwen3_coder", "xml"),
    /// "hermes" (alias "qwen2.5"), "llama3_json" (alias "llama3").
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen3_xml" | "qwen3_coder" | "xml" => Some(Self::QwenXml),
            "hermes" | "qwen2.5" => Some(Self::Hermes),
            "llama3_json" | "llama3" => Some(Self::Llama3Json),
            _ => None,
        }
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::QwenXml => "qwen3_xml",
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
        }
    }

    /// The format a chat template's source teaches the model, judged by the markers the
    /// template writes when it renders tool calls of earlier turns; `None` if it shows none.
    pub fn detect(template_source: &str) -> Option<Self> {
        let has = |marker: &str| template_source.contains(marker);
        if has("<function=") && has("<parameter=") {
            Some(Self::QwenXml)
        } else if has("<tool_call>") {
            Some(Self::Hermes)
        } else if has("<|python_tag|>") || (has("ipython") && has("parameters")) {
            Some(Self::Llama3Json)
        } else {
            None
        }
    }
}

/// A tool the model may call: its name and its JSON-schema `parameters` (`Value::Null` when
/// absent).
#[derive(Debug, Clone)]
pub struct ToolSchema {
    pub name: String,
    pub parameters: serde_json::Value,
}

/// What the parser recognised in the text pushed so far.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolEvent {
    /// Plain assistant text (outside any call), in order.
    Content(String),
    /// A call begins; `index` counts calls in this message from 0. Emitted exactly once per
    /// call, before its arguments.
    CallStart { index: usize, name: String },
    /// A piece of the call's arguments. The concatenation of all fragments of one call is
    /// exactly one valid JSON object (`{}` when it has no arguments).
    Arguments { index: usize, fragment: String },
}

/// One format's reader. It keeps the text it cannot decide on yet and reports what it
/// recognised to the emitter, which numbers calls and places whitespace.
trait FormatParser: Debug + Send + Sync {
    fn push(&mut self, text: &str, out: &mut Emitter);
    /// End of generation: releases or closes whatever is still open.
    fn finish(&mut self, out: &mut Emitter);
}

/// Incremental parser: feed generated text (the answer part only; reasoning is split off
/// before), get events. One parser per message.
#[derive(Debug)]
pub struct ToolCallParser {
    format: Box<dyn FormatParser>,
    out: Emitter,
}

impl ToolCallParser {
    /// A parser for `format`; `tools` supply the schemas argument values are typed by.
    pub fn new(format: ToolCallFormat, tools: &[ToolSchema]) -> Self {
        let schemas = ToolSchemas::new(tools);
        let format: Box<dyn FormatParser> = match format {
            ToolCallFormat::QwenXml => Box::new(xml::XmlParser::new(schemas)),
            ToolCallFormat::Hermes => Box::new(hermes::HermesParser::new(schemas)),
            ToolCallFormat::Llama3Json => Box::new(llama3::Llama3Parser::new(schemas)),
        };
        Self { format, out: Emitter::default() }
    }

    /// Reads newly generated `text`; what could still turn out to be call syntax is held
    /// back for the next push.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.format.push(text, &mut self.out);
        self.out.take_events()
    }

    /// End of generation: flushes held-back text, and closes an unterminated call or gives
    /// its text back as content when it never became one.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        self.format.finish(&mut self.out);
        self.out.finish();
        self.out.take_events()
    }
}

/// A whole message parsed at once (non-streaming): the same events as `push(all)` +
/// `finish()`, collected.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedMessage {
    pub content: String,
    pub calls: Vec<ParsedCall>,
}

/// One call of a [`ParsedMessage`].
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// JSON object text.
    pub arguments: String,
}

impl ParsedMessage {
    /// Folds events into a message (used by [`parse_message`] and by callers collecting a
    /// stream). Fragments for a call that never started are ignored.
    pub fn collect(events: impl IntoIterator<Item = ToolEvent>) -> Self {
        let mut message = Self::default();
        for event in events {
            match event {
                ToolEvent::Content(text) => message.content.push_str(&text),
                ToolEvent::CallStart { name, .. } => {
                    message.calls.push(ParsedCall { name, arguments: String::new() })
                }
                ToolEvent::Arguments { index, fragment } => {
                    if let Some(call) = message.calls.get_mut(index) {
                        call.arguments.push_str(&fragment);
                    }
                }
            }
        }
        message
    }
}

/// Parses a whole generated message.
pub fn parse_message(format: ToolCallFormat, tools: &[ToolSchema], text: &str) -> ParsedMessage {
    let mut parser = ToolCallParser::new(format, tools);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    ParsedMessage::collect(events)
}

#[cfg(test)]
mod tests;
