//! What shape the answer must take, from `response_format`, `tools` and `tool_choice`: the
//! grammar the engine enforces token by token, and the tool-call parser that turns the text
//! back into calls. Everything a client can get wrong here is a 400 naming the field.

use serde_json::{json, Value};
use spindle_api::{ApiError, ChatCompletionRequest};
use spindle_chat::{ToolCallFormat, ToolSchema};
use spindle_constrain::{grammar, CallMode, Constraint, ToolRule, TopLevelGrammar};

use crate::error::internal;
use crate::state::AppState;

/// How the answer is shaped.
pub struct AnswerShape {
    pub constraint: Option<Constraint>,
    /// Parse tool calls out of the answer (`tool_choice` other than `none`).
    pub tool_calls: Option<ToolParsing>,
}

/// The parser's inputs: the model's call syntax and the tools' schemas (for coercion).
pub struct ToolParsing {
    pub format: ToolCallFormat,
    pub tools: Vec<ToolSchema>,
}

/// `tool_choice`, resolved.
enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

pub fn answer_shape(
    state: &AppState,
    request: &ChatCompletionRequest,
) -> Result<AnswerShape, ApiError> {
    let choice = tool_choice(request)?;
    let format = state.profile.tool_call_format;
    let rules: Vec<ToolRule> = request
        .tools
        .iter()
        .map(|t| ToolRule {
            name: t.function.name.clone(),
            parameters: Some(
                t.function
                    .parameters
                    .clone()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            ),
        })
        .collect();
    let parallel = request.parallel_tool_calls != Some(false);
    let schema = response_schema(state, request.response_format.as_ref())?;
    let document = schema.as_ref().map(grammar::json_schema);
    let strict = request.tools.iter().any(|t| t.function.strict == Some(true));
    let grammar = match &choice {
        Choice::None => document,
        Choice::Required => Some(grammar::tool_calls(format, &rules, CallMode::Required, parallel)),
        Choice::Named(name) => {
            let named: Vec<ToolRule> = rules.iter().filter(|r| &r.name == name).cloned().collect();
            Some(grammar::tool_calls(format, &named, CallMode::Required, false))
        }
        Choice::Auto => match &schema {
            // A JSON answer or calls: the two start differently, so the model picks by its
            // first token and the grammar holds it to that choice.
            Some(schema) => Some(grammar::tool_calls_or_json(format, &rules, parallel, schema)),
            None if strict => {
                Some(grammar::tool_calls(format, &rules, CallMode::Optional, parallel))
            }
            None => None,
        },
    };
    let constraint = match grammar {
        Some(grammar) => Some(compile(state, grammar, constrained_field(&choice))?),
        None => None,
    };
    let tool_calls = match choice {
        Choice::None => None,
        _ => Some(ToolParsing {
            format,
            tools: request
                .tools
                .iter()
                .map(|t| ToolSchema {
                    name: t.function.name.clone(),
                    parameters: t.function.parameters.clone().unwrap_or(Value::Null),
                })
                .collect(),
        }),
    };
    Ok(AnswerShape { constraint, tool_calls })
}

fn constrained_field(choice: &Choice) -> &'static str {
    match choice {
        Choice::None => "response_format",
        _ => "tools",
    }
}

fn tool_choice(request: &ChatCompletionRequest) -> Result<Choice, ApiError> {
    let bad = |message: String| ApiError::bad_request(message, Some("tool_choice"));
    let choice = match &request.tool_choice {
        None | Some(Value::Null) if request.tools.is_empty() => Choice::None,
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => return Err(bad(format!("unknown tool_choice `{other}`; expected none, auto, required or a named function"))),
        },
        Some(value) => match value["function"]["name"].as_str() {
            Some(name) if value["type"] == "function" => Choice::Named(name.to_string()),
            _ => return Err(bad("tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}".into())),
        },
    };
    match &choice {
        Choice::Required | Choice::Named(_) if request.tools.is_empty() => {
            Err(bad("tool_choice asks for a tool call but the request lists no tools".into()))
        }
        Choice::Named(name) if !request.tools.iter().any(|t| &t.function.name == name) => {
            Err(bad(format!("tool_choice names `{name}`, which is not among the request's tools")))
        }
        _ => Ok(choice),
    }
}

/// The JSON schema the answer must follow, if any: `response_format`'s, or the server's
/// `--guided-json` when the request has none; `None` for free text.
fn response_schema(state: &AppState, format: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let bad = |message: &str| ApiError::bad_request(message.to_string(), Some("response_format"));
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(state.config.guided_json.clone());
    };
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => match &format["json_schema"]["schema"] {
            schema @ Value::Object(_) => Ok(Some(schema.clone())),
            Value::Null => Err(bad("response_format json_schema needs json_schema.schema")),
            _ => Err(bad("response_format json_schema.schema must be an object")),
        },
        Some(other) => Err(bad(&format!(
            "unknown response_format type `{other}`; expected text, json_object or json_schema"
        ))),
        None => Err(bad("response_format needs a type")),
    }
}

fn compile(
    state: &AppState,
    grammar: TopLevelGrammar,
    field: &str,
) -> Result<Constraint, ApiError> {
    let grammars = state.grammars().map_err(internal)?;
    grammars.compile(grammar).map_err(|e| {
        ApiError::bad_request(format!("{field}: the schema can't be enforced: {e}"), Some(field))
    })
}
