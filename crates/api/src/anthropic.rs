//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`): the request with its
//! content blocks and tools, the `message` response, the streamed events, and the error body.
//! Like the OpenAI types, requests ignore fields they do not know (`cache_control`, `metadata`
//! keys, new betas) and reject fields of the wrong JSON type.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::common::null_as_default;
use crate::{ApiError, ErrorKind};

/// The body of `POST /v1/messages` (and of `count_tokens`, which needs no `max_tokens`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Seconds the model may stay idle after this request before it is unloaded (LM Studio's
    /// `ttl`, Spindle's extension; 0: never); absent: the server's `--model-ttl`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
    /// Required by [`MessagesRequest::validate`]; optional here so count_tokens can share the type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    pub messages: Vec<InputMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemPrompt>,
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// `{"user_id": …}`; accepted and not used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Whether to decode speculatively (Spindle's extension, as on the other endpoints).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<bool>,
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDefinition>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<ThinkingConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_config: Option<OutputConfig>,
}

impl MessagesRequest {
    /// What a `/v1/messages` request needs beyond its types: `max_tokens`.
    pub fn validate(&self) -> Result<(), ApiError> {
        match self.max_tokens {
            None => Err(ApiError::bad_request("max_tokens: Field required", Some("max_tokens"))),
            Some(_) => Ok(()),
        }
    }
}

/// `system`: a string, or text blocks (with `cache_control`, which Spindle's own prefix cache
/// makes unnecessary).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged, expecting = "a string or an array of text blocks")]
pub enum SystemPrompt {
    Text(String),
    Blocks(Vec<SystemBlock>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemBlock {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

/// One turn of the conversation. The role stays a string so a wrong one gets an error naming
/// the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputMessage {
    pub role: String,
    pub content: Content,
}

/// A message's or tool result's content: a string, or content blocks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<InputBlock>),
}

/// By hand, so a block of an unknown type is named in the error (an untagged enum would only
/// say that nothing matched).
impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Self::Text(text)),
            Value::Array(blocks) => blocks
                .into_iter()
                .enumerate()
                .map(|(i, block)| {
                    InputBlock::deserialize(block)
                        .map_err(|e| D::Error::custom(format!("content[{i}]: {e}")))
                })
                .collect::<Result<_, _>>()
                .map(Self::Blocks),
            other => Err(D::Error::custom(format!(
                "content must be a string or an array of content blocks, not {other}"
            ))),
        }
    }
}

/// A content block a client sends. Image and document blocks parse, so that the server can
/// refuse them by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputBlock {
    Text {
        text: String,
    },
    Image {
        #[serde(default)]
        source: Value,
    },
    Document {
        #[serde(default)]
        source: Value,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<Content>,
        #[serde(default, deserialize_with = "null_as_default")]
        is_error: bool,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
}

/// A tool the model may call. Anthropic's server tools (`web_search_…`, `bash_…`,
/// `text_editor_…`) carry a `type` and no schema; see [`ToolDefinition::is_client_tool`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    pub name: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// Calls always match `input_schema`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ToolDefinition {
    /// A tool the client runs itself (no `type`, or `custom`), as opposed to one Anthropic's
    /// servers would run.
    pub fn is_client_tool(&self) -> bool {
        matches!(self.kind.as_deref(), None | Some("custom"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    Auto {
        #[serde(default, deserialize_with = "null_as_default")]
        disable_parallel_tool_use: bool,
    },
    /// Some tool must be called.
    Any {
        #[serde(default, deserialize_with = "null_as_default")]
        disable_parallel_tool_use: bool,
    },
    Tool {
        name: String,
        #[serde(default, deserialize_with = "null_as_default")]
        disable_parallel_tool_use: bool,
    },
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingConfig {
    Enabled {
        budget_tokens: u32,
    },
    /// The model decides how much to think.
    Adaptive,
    /// Thinking between tool calls; on, for Spindle, as thinking before every answer is.
    BetweenTools,
    Disabled,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effort: Option<Effort>,
    /// `{"type": "json_schema", "schema": {…}}`: the answer follows the schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    Low,
    Medium,
    High,
    #[serde(rename = "xhigh")]
    ExtraHigh,
    Max,
}

/// The body of a `count_tokens` response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCount {
    pub input_tokens: u32,
}

/// The whole response, and (with empty `content`) the message of `message_start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "message")]
pub struct Message {
    pub id: String,
    pub role: AssistantRole,
    pub model: String,
    pub content: Vec<OutputBlock>,
    /// `null` only in `message_start`.
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<String>,
    pub usage: MessagesUsage,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AssistantRole {
    #[default]
    Assistant,
}

/// A block of the answer. Spindle does not sign thinking; `signature` is there because
/// clients expect one and send it back, and Spindle ignores it when they do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputBlock {
    Thinking { thinking: String, signature: String },
    Text { text: String },
    ToolUse { id: String, name: String, input: Value },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
}

/// Token counts. Unlike OpenAI's `prompt_tokens`, `input_tokens` leaves out the tokens read
/// from the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagesUsage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_read_input_tokens: u32,
    /// Always 0: Spindle caches every prompt without being asked, so nothing is "written".
    pub cache_creation_input_tokens: u32,
}

/// One server-sent event of a streamed response; the SSE `event:` line repeats its `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart { message: Message },
    Ping,
    ContentBlockStart { index: u32, content_block: OutputBlock },
    ContentBlockDelta { index: u32, delta: BlockDelta },
    ContentBlockStop { index: u32 },
    MessageDelta { delta: MessageDelta, usage: MessagesUsage },
    MessageStop,
    Error { error: ErrorDetail },
}

impl StreamEvent {
    /// The event's `type`, for the SSE `event:` line.
    pub fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::Ping => "ping",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
            Self::Error { .. } => "error",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta {
        text: String,
    },
    /// A piece of a tool call's `input` JSON; the pieces of one block concatenate to it.
    InputJsonDelta {
        partial_json: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageDelta {
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<String>,
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "error")]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

impl From<&ApiError> for ErrorDetail {
    /// The one mapping from Spindle's errors to Anthropic's types; the HTTP status stays.
    fn from(error: &ApiError) -> Self {
        let kind = match (error.status, error.kind) {
            (413, _) => "request_too_large",
            (_, ErrorKind::InvalidRequest) => "invalid_request_error",
            (_, ErrorKind::NotFound) => "not_found_error",
            (_, ErrorKind::Authentication) => "authentication_error",
            (_, ErrorKind::RateLimit) => "rate_limit_error",
            (_, ErrorKind::Server) => "api_error",
        };
        Self { kind: kind.into(), message: error.message.clone() }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_claude_code_request_parses_and_ignores_what_it_does_not_know() {
        let body = json!({
            "model": "m", "max_tokens": 32000, "stream": true,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"},
                       {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "ok"}], "is_error": true},
                {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}]}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}, {"type": "web_search_20250305", "name": "web_search"}],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "output_config": {"effort": "xhigh", "format": null},
            "metadata": {"user_id": "u"}, "context_management": {"edits": []},
        });
        let request: MessagesRequest = serde_json::from_value(body).unwrap();
        assert_eq!(request.validate(), Ok(()));
        assert!(matches!(&request.system, Some(SystemPrompt::Blocks(b)) if b.len() == 2));
        let Content::Blocks(blocks) = &request.messages[0].content else { panic!() };
        assert!(matches!(
            &blocks[0],
            InputBlock::ToolResult { is_error: true, content: Some(Content::Blocks(_)), .. }
        ));
        assert_eq!(request.tools.iter().filter(|t| t.is_client_tool()).count(), 1);
        assert_eq!(request.thinking, Some(ThinkingConfig::Enabled { budget_tokens: 1024 }));
        assert_eq!(request.output_config.unwrap().effort, Some(Effort::ExtraHigh));
    }

    #[test]
    fn a_block_of_unknown_type_is_named() {
        let body = json!({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "video"}]}]});
        let error = serde_json::from_value::<MessagesRequest>(body).unwrap_err().to_string();
        assert!(
            error.contains("content[1]") && error.contains("unknown variant `video`"),
            "{error}"
        );
    }

    #[test]
    fn max_tokens_is_required_for_messages() {
        let request: MessagesRequest = serde_json::from_value(json!({"messages": []})).unwrap();
        assert_eq!(request.validate().unwrap_err().param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn responses_and_events_have_anthropics_shape() {
        let message = Message {
            id: "msg_1".into(),
            role: AssistantRole::Assistant,
            model: "m".into(),
            content: vec![OutputBlock::ToolUse {
                id: "toolu_1".into(),
                name: "f".into(),
                input: json!({}),
            }],
            stop_reason: Some(StopReason::ToolUse),
            stop_sequence: None,
            usage: MessagesUsage::default(),
        };
        let value = serde_json::to_value(&message).unwrap();
        assert_eq!(value["type"], "message");
        assert_eq!(value["role"], "assistant");
        assert_eq!(
            value["content"][0],
            json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}})
        );
        assert_eq!(value["stop_reason"], "tool_use");
        let delta = StreamEvent::ContentBlockDelta {
            index: 2,
            delta: BlockDelta::InputJsonDelta { partial_json: "{".into() },
        };
        assert_eq!(
            serde_json::to_value(&delta).unwrap(),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{"}})
        );
        assert_eq!(serde_json::to_value(StreamEvent::Ping).unwrap(), json!({"type": "ping"}));
    }

    #[test]
    fn errors_keep_their_status_and_take_anthropics_types() {
        for (error, kind) in [
            (ApiError::bad_request("b", None), "invalid_request_error"),
            (ApiError::unauthorized("u"), "authentication_error"),
            (ApiError::not_found("n"), "not_found_error"),
            (ApiError::rate_limited("r"), "rate_limit_error"),
            (ApiError::too_large("t"), "request_too_large"),
            (ApiError::internal("i"), "api_error"),
        ] {
            let body = ErrorResponse { error: ErrorDetail::from(&error) };
            let value = serde_json::to_value(&body).unwrap();
            assert_eq!(
                value,
                json!({"type": "error", "error": {"type": kind, "message": error.message}})
            );
        }
    }
}
