//! What shape a conversation's answer must take, from its answer format, tools and tool
//! choice: the grammar the engine enforces token by token, and the tool-call parser that turns
//! the text back into calls. Everything a client can get wrong here is a 400 naming the field.

use serde_json::{json, Value};
use spindle_api::ApiError;
use spindle_chat::{ToolCallFormat, ToolSchema};
use spindle_constrain::{grammar, CallMode, Constraint, ToolRule, TopLevelGrammar};

use crate::error::internal;
use crate::loaded_model::LoadedModel;
use crate::pipeline::request::{AnswerFormat, Conversation, ToolChoice};
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

pub fn answer_shape(
    state: &AppState,
    model: &LoadedModel,
    request: &Conversation,
) -> Result<AnswerShape, ApiError> {
    let choice = tool_choice(request)?;
    let format = model.profile.tool_call_format;
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
    let parallel = request.parallel_tool_calls;
    let schema = response_schema(state, request.format.as_ref());
    let document = schema.as_ref().map(grammar::json_schema);
    let strict = request.tools.iter().any(|t| t.function.strict == Some(true));
    let grammar = match &choice {
        ToolChoice::None => document,
        ToolChoice::Required => {
            Some(grammar::tool_calls(format, &rules, CallMode::Required, parallel))
        }
        ToolChoice::Named(name) => {
            let named: Vec<ToolRule> = rules.iter().filter(|r| &r.name == name).cloned().collect();
            Some(grammar::tool_calls(format, &named, CallMode::Required, false))
        }
        ToolChoice::Auto => match &schema {
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
        Some(grammar) => Some(compile(model, grammar, constrained_field(&choice))?),
        None => None,
    };
    let tool_calls = match choice {
        ToolChoice::None => None,
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

fn constrained_field(choice: &ToolChoice) -> &'static str {
    match choice {
        ToolChoice::None => "response_format",
        _ => "tools",
    }
}

/// The request's tool choice, or its default; a call it asks for must be of an offered tool.
fn tool_choice(request: &Conversation) -> Result<ToolChoice, ApiError> {
    let bad = |message: String| ApiError::bad_request(message, Some("tool_choice"));
    let choice = match &request.tool_choice {
        None if request.tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(choice) => choice.clone(),
    };
    match &choice {
        ToolChoice::Required | ToolChoice::Named(_) if request.tools.is_empty() => {
            Err(bad("tool_choice asks for a tool call but the request lists no tools".into()))
        }
        ToolChoice::Named(name) if !request.tools.iter().any(|t| &t.function.name == name) => {
            Err(bad(format!("tool_choice names `{name}`, which is not among the request's tools")))
        }
        _ => Ok(choice),
    }
}

/// The JSON schema the answer must follow, if any: the request's, or the server's
/// `--guided-json` when the request names no format; `None` for free text.
fn response_schema(state: &AppState, format: Option<&AnswerFormat>) -> Option<Value> {
    match format {
        None => state.config.guided_json.clone(),
        Some(AnswerFormat::Text) => None,
        Some(AnswerFormat::JsonObject) => Some(json!({"type": "object"})),
        Some(AnswerFormat::JsonSchema(schema)) => Some(schema.clone()),
    }
}

fn compile(
    model: &LoadedModel,
    grammar: TopLevelGrammar,
    field: &str,
) -> Result<Constraint, ApiError> {
    let grammars = model.grammars().map_err(internal)?;
    grammars.compile(grammar).map_err(|e| {
        ApiError::bad_request(format!("{field}: the schema can't be enforced: {e}"), Some(field))
    })
}
