//! `/v1/chat/completions`: the request, its messages and tools, and the response in both
//! its whole (`chat.completion`) and streamed (`chat.completion.chunk`) forms.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::common::null_as_default;
use crate::validate::{check_range, check_stream_options};
use crate::{
    ApiError, ChoiceLogprobs, FinishReason, SamplingParams, StreamOptions, Usage, MAX_TOP_LOGPROBS,
};

/// The body of `POST /v1/chat/completions`. Fields Spindle does not know are ignored,
/// because real clients send extras.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// Optional: a server with one model serves it whatever the name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Seconds the model may stay idle after this request before it is unloaded (LM Studio's
    /// `ttl`, Spindle's extension; 0: never); absent: the server's `--model-ttl`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
    pub messages: Vec<ChatMessage>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// llama-server's extension: while the prompt is read, the stream carries
    /// `prompt_progress` chunks (OpenAI clients ignore the field).
    #[serde(
        default,
        skip_serializing_if = "std::ops::Not::not",
        deserialize_with = "null_as_default"
    )]
    pub return_progress: bool,
    /// Deprecated by OpenAI in favour of `max_completion_tokens`; see
    /// [`ChatCompletionRequest::max_output_tokens`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(flatten)]
    pub sampling: SamplingParams,
    /// Return the log probability of each content token.
    #[serde(default, deserialize_with = "null_as_default")]
    pub logprobs: bool,
    /// Alternatives per token, up to [`MAX_TOP_LOGPROBS`]; needs `logprobs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": …}}`;
    /// resolved against `tools` by the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// `{"type": "text" | "json_object" | "json_schema", …}`; compiled into a grammar by the
    /// server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// Extra variables for the chat template, e.g. `{"enable_thinking": false}` (vLLM's name).
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Map::is_empty")]
    pub chat_template_kwargs: Map<String, Value>,
    /// Most tokens to spend reasoning before the answer is forced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<u32>,
    /// Another name for `thinking_budget`, used by some clients.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_reasoning_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl ChatCompletionRequest {
    /// Checks what serde cannot: message roles and content parts, ranges, and fields that
    /// need each other. The error names the first offending field.
    pub fn validate(&self) -> Result<(), ApiError> {
        validate_messages(&self.messages)?;
        check_stream_options(self.stream, self.stream_options.as_ref())?;
        check_range(self.max_tokens, 1.., "max_tokens", "at least 1")?;
        check_range(self.max_completion_tokens, 1.., "max_completion_tokens", "at least 1")?;
        self.sampling.validate()?;
        check_range(self.top_logprobs, ..=MAX_TOP_LOGPROBS, "top_logprobs", "at most 20")?;
        if self.top_logprobs.is_some() && !self.logprobs {
            return Err(ApiError::bad_request(
                "top_logprobs requires logprobs to be true",
                Some("top_logprobs"),
            ));
        }
        Ok(())
    }

    /// The output limit the client asked for: `max_completion_tokens`, else the deprecated
    /// `max_tokens`.
    pub fn max_output_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }
}

/// Checks each message's role and content parts; shared with tokenize requests.
pub(crate) fn validate_messages(messages: &[ChatMessage]) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty", Some("messages")));
    }
    for (i, message) in messages.iter().enumerate() {
        if Role::parse(&message.role).is_none() {
            let param = format!("messages[{i}].role");
            return Err(ApiError::bad_request(
                format!(
                    "{param}: unknown role `{}`; expected one of system, developer, user, assistant, tool",
                    message.role
                ),
                Some(&param),
            ));
        }
        if let Some(MessageContent::Parts(parts)) = &message.content {
            for (j, part) in parts.iter().enumerate() {
                part.validate(&format!("messages[{i}].content[{j}]"))?;
            }
        }
    }
    Ok(())
}

/// The author of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    /// OpenAI's newer name for `system`.
    Developer,
    User,
    Assistant,
    /// The result of a tool call, answering `tool_call_id`.
    Tool,
}

impl Role {
    /// The role named `name`, or `None` for a name OpenAI does not define.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "system" => Some(Self::System),
            "developer" => Some(Self::Developer),
            "user" => Some(Self::User),
            "assistant" => Some(Self::Assistant),
            "tool" => Some(Self::Tool),
            _ => None,
        }
    }
}

/// One message of the conversation, as sent by the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// A string rather than [`Role`], so an unknown role gets Spindle's own error naming the
    /// message instead of a serde error; see [`Role::parse`].
    pub role: String,
    /// `null` for an assistant message that only calls tools.
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Calls made by an earlier assistant turn.
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` message: the call it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An earlier assistant turn's reasoning, for templates that replay it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// A message's `content`: a string, or an array of typed parts as multimodal clients send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, expecting = "a string or an array of content parts")]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text of the content. Parts are joined with `\n`, as vLLM does, so a template that
    /// expects a string sees each part on its own line.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Self::Text(text) => Cow::Borrowed(text),
            Self::Parts(parts) => {
                let texts: Vec<&str> = parts.iter().filter_map(|p| p.text.as_deref()).collect();
                Cow::Owned(texts.join("\n"))
            }
        }
    }
}

/// One element of an array `content`. Only `text` parts are served; the type stays a string
/// so an image part gets a clear "not supported" error rather than a serde error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl ContentPart {
    fn validate(&self, param: &str) -> Result<(), ApiError> {
        if self.kind != "text" {
            let param = format!("{param}.type");
            return Err(ApiError::bad_request(
                format!(
                    "{param}: content parts of type `{}` are not supported; only `text`",
                    self.kind
                ),
                Some(&param),
            ));
        }
        if self.text.is_none() {
            let param = format!("{param}.text");
            return Err(ApiError::bad_request(format!("{param} is missing"), Some(&param)));
        }
        Ok(())
    }
}

/// The `type` of tools and tool calls. OpenAI defines other kinds; Spindle serves functions
/// only, so any other kind fails to deserialize.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolType {
    #[default]
    Function,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: ToolType,
    pub function: FunctionDefinition,
}

/// The function behind a [`Tool`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments; absent means no arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Ask for arguments that always match `parameters`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A call the assistant made: in a response, or replayed in a later request's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    /// Defaults to `function` because some clients leave it out when replaying history.
    #[serde(rename = "type", default)]
    pub kind: ToolType,
    pub function: FunctionCall,
}

/// The function and arguments of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text, as OpenAI sends it; not parsed here. Some clients replay history with the
    /// arguments as a JSON object; that is read as its text.
    #[serde(deserialize_with = "arguments_text")]
    pub arguments: String,
}

fn arguments_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a string of JSON or a JSON object")]
    enum Arguments {
        Text(String),
        Object(Map<String, Value>),
    }
    Ok(match Arguments::deserialize(deserializer)? {
        Arguments::Text(text) => text,
        Arguments::Object(object) => Value::Object(object).to_string(),
    })
}

/// The whole response of a non-streaming request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "chat.completion")]
pub struct ChatCompletion {
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    /// Identifies the build and configuration, so a client can tell when determinism may
    /// have changed; `null` when unknown.
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// One choice of a [`ChatCompletion`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    /// `null` unless the request set `logprobs`.
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: FinishReason,
}

/// The generated message. Its `role` is always `assistant`, written by serde from the tag.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename = "assistant")]
pub struct AssistantMessage {
    /// `null` when the model only called tools.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One server-sent event of a streaming response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "chat.completion.chunk")]
pub struct ChatCompletionChunk {
    pub id: String,
    /// Unix seconds; the same in every chunk of one response.
    pub created: u64,
    pub model: String,
    pub system_fingerprint: Option<String>,
    /// Empty in the final usage chunk.
    pub choices: Vec<ChatChunkChoice>,
    /// Only in the final chunk, and only with `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// How far the prompt has been read, with `return_progress` (llama-server's shape).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_progress: Option<PromptProgress>,
}

/// Prompt positions in all, taken from the cache, and read so far (cached ones included), and
/// milliseconds since the request arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptProgress {
    pub total: usize,
    pub cache: usize,
    pub processed: usize,
    pub time_ms: u64,
}

/// One choice of a [`ChatCompletionChunk`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub logprobs: Option<ChoiceLogprobs>,
    /// `null` until the choice's last chunk.
    pub finish_reason: Option<FinishReason>,
}

/// What a chunk adds to the message; fields with nothing new are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// Only in the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A piece of a tool call. The first piece of a call carries `id`, `type` and the function
/// name; later pieces with the same `index` append to `arguments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which call of the message this piece belongs to.
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolType>,
    pub function: FunctionCallDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments' JSON text (empty in the first piece).
    #[serde(default)]
    pub arguments: String,
}
