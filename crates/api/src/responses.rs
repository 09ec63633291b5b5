//! `POST /v1/responses` (OpenAI's Responses API, as the Codex CLI speaks it): the request with
//! its input items and flat function tools. What comes back is in `response_object`.
//!
//! Input items arrive as loose JSON (a message may leave out its `type`, unknown item kinds
//! must be refused by name), so [`ResponsesRequest::input_items`] reads them into
//! [`InputItem`]s and names the offending item in its error.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::common::null_as_default;
use crate::validate::check_range;
use crate::{ApiError, SamplingParams};

/// The body of `POST /v1/responses`. Fields Spindle does not know (`include`,
/// `prompt_cache_key`, `client_metadata`, `service_tier`, `truncation`, …) are ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponsesRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Seconds the model may stay idle after this request before it is unloaded (LM Studio's
    /// `ttl`, Spindle's extension; 0: never); absent: the server's `--model-ttl`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
    /// A string (one user message) or a list of input items, read by
    /// [`ResponsesRequest::input_items`].
    #[serde(default, deserialize_with = "null_as_default")]
    pub input: ResponseInput,
    /// Becomes a leading system message; not carried over by `previous_response_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Continue the stored conversation of that response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
    /// Keep the finished response for `GET` and `previous_response_id`; OpenAI's default is
    /// true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// `temperature`, `top_p`, and the vLLM-style extensions (`seed`, `top_k`, …).
    #[serde(flatten)]
    pub sampling: SamplingParams,
    /// `function` and `namespace` tools are offered to the model; tools of other types
    /// (`web_search`, `custom`, `mcp`, …) are kept here only to be echoed.
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Value>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "name": …}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ReasoningOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<TextOptions>,
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Extra variables for the chat template, as on chat completions.
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Map::is_empty")]
    pub chat_template_kwargs: Map<String, Value>,
}

/// `input`: a string, or a list of items kept as JSON until [`ResponsesRequest::input_items`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged, expecting = "a string or an array of input items")]
pub enum ResponseInput {
    Text(String),
    Items(Vec<Value>),
}

impl Default for ResponseInput {
    fn default() -> Self {
        Self::Items(Vec::new())
    }
}

/// `reasoning`: how hard the model should think. `summary` is accepted; reasoning comes back
/// whole, as `reasoning_text` content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasoningOptions {
    /// `none`, `minimal`, `low`, `medium`, `high` or `xhigh`.
    pub effort: Option<String>,
    pub summary: Option<String>,
}

/// `text`: the answer's format (`{"type": "text" | "json_object" | "json_schema", …}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<String>,
}

/// One item of a conversation, as the server uses it: read from a request's `input`, or
/// turned from an earlier response's output when `previous_response_id` continues it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputItem {
    /// Role `system`, `developer`, `user` or `assistant`; content parts joined by newlines.
    Message {
        role: String,
        content: String,
    },
    FunctionCall {
        call_id: String,
        name: String,
        /// The namespace tool the function belongs to, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        /// JSON text, as the model wrote it.
        arguments: String,
    },
    FunctionCallOutput {
        call_id: String,
        output: String,
    },
    /// An earlier turn's reasoning text.
    Reasoning {
        text: String,
    },
}

/// Item types of OpenAI's hosted tools: Spindle offers none of those tools, so items of these
/// types in a replayed history carry nothing the model can use and are skipped.
const HOSTED_ITEM_TYPES: &[&str] = &[
    "web_search_call",
    "file_search_call",
    "image_generation_call",
    "code_interpreter_call",
    "computer_call",
    "computer_call_output",
    "local_shell_call",
    "local_shell_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "tool_search_call",
    "tool_search_output",
    "custom_tool_call",
    "custom_tool_call_output",
];

impl ResponsesRequest {
    /// Checks ranges; the error names the offending field.
    pub fn validate(&self) -> Result<(), ApiError> {
        check_range(self.max_output_tokens, 1.., "max_output_tokens", "at least 1")?;
        self.sampling.validate()
    }

    /// Whether the finished response is kept (OpenAI keeps it unless told not to).
    pub fn stores(&self) -> bool {
        self.store != Some(false)
    }

    /// The `input` as items; a string is one user message. Items of hosted-tool types are
    /// skipped; anything else unknown, or an unsupported content part, is a 400 naming it.
    pub fn input_items(&self) -> Result<Vec<InputItem>, ApiError> {
        match &self.input {
            ResponseInput::Text(text) => {
                Ok(vec![InputItem::Message { role: "user".into(), content: text.clone() }])
            }
            ResponseInput::Items(items) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    out.extend(read_item(item, &format!("input[{i}]"))?);
                }
                Ok(out)
            }
        }
    }
}

fn read_item(item: &Value, param: &str) -> Result<Option<InputItem>, ApiError> {
    let kind = match item.get("type") {
        None | Some(Value::Null) if item.get("role").is_some() => "message",
        Some(Value::String(kind)) => kind.as_str(),
        _ => return Err(bad(format!("{param} needs a `type` (or a `role` for a message)"), param)),
    };
    match kind {
        "message" => {
            let message: WireMessage = from_item(item, param)?;
            if !["system", "developer", "user", "assistant"].contains(&message.role.as_str()) {
                let param = format!("{param}.role");
                return Err(bad(
                    format!(
                        "{param}: unknown role `{}`; expected system, developer, user or assistant",
                        message.role
                    ),
                    &param,
                ));
            }
            let content = message.content.text(&format!("{param}.content"))?;
            Ok(Some(InputItem::Message { role: message.role, content }))
        }
        "function_call" => {
            let call: WireFunctionCall = from_item(item, param)?;
            Ok(Some(InputItem::FunctionCall {
                call_id: call.call_id,
                name: call.name,
                namespace: call.namespace,
                arguments: call.arguments,
            }))
        }
        "function_call_output" => {
            let output: WireFunctionCallOutput = from_item(item, param)?;
            let text = output.output.text(&format!("{param}.output"))?;
            Ok(Some(InputItem::FunctionCallOutput { call_id: output.call_id, output: text }))
        }
        "reasoning" => {
            let reasoning: WireReasoning = from_item(item, param)?;
            let texts = |parts: &[WirePart]| {
                parts.iter().filter_map(|p| p.text.as_deref()).collect::<Vec<_>>().join("\n")
            };
            let content = texts(&reasoning.content);
            let text = if content.is_empty() { texts(&reasoning.summary) } else { content };
            Ok((!text.is_empty()).then_some(InputItem::Reasoning { text }))
        }
        hosted if HOSTED_ITEM_TYPES.contains(&hosted) => Ok(None),
        other => {
            let param = format!("{param}.type");
            Err(bad(
                format!(
                    "{param}: input items of type `{other}` are not supported; expected message, function_call, \
                     function_call_output or reasoning"
                ),
                &param,
            ))
        }
    }
}

fn bad(message: String, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

fn from_item<T: serde::de::DeserializeOwned>(item: &Value, param: &str) -> Result<T, ApiError> {
    T::deserialize(item).map_err(|e| bad(format!("{param}: {e}"), param))
}

#[derive(Deserialize)]
struct WireMessage {
    role: String,
    content: WireContent,
}

#[derive(Deserialize)]
struct WireFunctionCall {
    call_id: String,
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    arguments: String,
}

#[derive(Deserialize)]
struct WireFunctionCallOutput {
    call_id: String,
    output: WireContent,
}

#[derive(Deserialize)]
struct WireReasoning {
    #[serde(default, deserialize_with = "null_as_default")]
    summary: Vec<WirePart>,
    #[serde(default, deserialize_with = "null_as_default")]
    content: Vec<WirePart>,
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "a string or an array of content parts")]
enum WireContent {
    Text(String),
    Parts(Vec<WirePart>),
}

#[derive(Deserialize)]
struct WirePart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

impl WireContent {
    /// The text, parts joined by newlines; a part that is not text is a 400 naming it.
    fn text(self, param: &str) -> Result<String, ApiError> {
        let parts = match self {
            Self::Text(text) => return Ok(text),
            Self::Parts(parts) => parts,
        };
        let mut texts = Vec::new();
        for (j, part) in parts.into_iter().enumerate() {
            let param = format!("{param}[{j}]");
            if !["input_text", "output_text", "text"].contains(&part.kind.as_str()) {
                let param = format!("{param}.type");
                return Err(bad(
                    format!(
                        "{param}: content parts of type `{}` are not supported; only input_text and output_text",
                        part.kind
                    ),
                    &param,
                ));
            }
            texts.push(part.text.ok_or_else(|| {
                bad(format!("{param}.text is missing"), &format!("{param}.text"))
            })?);
        }
        Ok(texts.join("\n"))
    }
}
