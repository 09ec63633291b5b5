//! Tool calls read out of the answer as it is generated: content passes through the format's
//! parser, which holds back call syntax and hands out OpenAI tool-call deltas instead. The
//! streamed and the whole response both run the same parser over the same pieces, so they
//! always carry the same calls.

use spindle_api::{FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta, ToolType};
use spindle_chat::{ToolCallParser, ToolEvent};

use crate::pipeline::shape::ToolParsing;

pub struct ToolCallStage {
    parser: ToolCallParser,
    /// Call ids are this plus the call's index: unique per response, stable across replays.
    id_prefix: String,
    calls: usize,
}

/// What a piece of content becomes: text outside calls, and pieces of calls.
#[derive(Default)]
pub struct StagedDelta {
    pub content: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl ToolCallStage {
    pub fn new(parsing: &ToolParsing, response_id: &str) -> Self {
        let suffix = response_id.rsplit('-').next().unwrap_or(response_id);
        Self {
            parser: ToolCallParser::new(parsing.format, &parsing.tools),
            id_prefix: format!("call_{suffix}_"),
            calls: 0,
        }
    }

    pub fn push(&mut self, content: &str) -> StagedDelta {
        let events = self.parser.push(content);
        self.stage(events)
    }

    /// The end of the answer: held-back text, and the close of an unterminated call.
    pub fn finish(&mut self) -> StagedDelta {
        let events = self.parser.finish();
        self.stage(events)
    }

    /// Whether the answer called a tool (its finish reason is then `tool_calls`).
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    fn stage(&mut self, events: Vec<ToolEvent>) -> StagedDelta {
        let mut delta = StagedDelta::default();
        for event in events {
            match event {
                ToolEvent::Content(text) => delta.content.push_str(&text),
                ToolEvent::CallStart { index, name } => {
                    self.calls = self.calls.max(index + 1);
                    delta.tool_calls.push(ToolCallDelta {
                        index: index as u32,
                        id: Some(format!("{}{index}", self.id_prefix)),
                        kind: Some(ToolType::Function),
                        function: FunctionCallDelta { name: Some(name), arguments: String::new() },
                    });
                }
                ToolEvent::Arguments { index, fragment } => match delta.tool_calls.last_mut() {
                    Some(last) if last.index == index as u32 => {
                        last.function.arguments.push_str(&fragment)
                    }
                    _ => delta.tool_calls.push(ToolCallDelta {
                        index: index as u32,
                        id: None,
                        kind: None,
                        function: FunctionCallDelta { name: None, arguments: fragment },
                    }),
                },
            }
        }
        delta
    }
}

/// The calls that a response's deltas add up to, in order.
pub fn assemble_calls(deltas: impl IntoIterator<Item = ToolCallDelta>) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = Vec::new();
    for delta in deltas {
        let index = delta.index as usize;
        if index == calls.len() {
            calls.push(ToolCall {
                id: delta.id.unwrap_or_default(),
                kind: ToolType::Function,
                function: FunctionCall {
                    name: delta.function.name.unwrap_or_default(),
                    arguments: String::new(),
                },
            });
        }
        if let Some(call) = calls.get_mut(index) {
            call.function.arguments.push_str(&delta.function.arguments);
        }
    }
    calls
}
