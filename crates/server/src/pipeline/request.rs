//! The one internal generation request every protocol adapter converts its wire request into:
//! the prompt (a conversation for the chat template, or token ids as they are), sampling, the
//! output limit and logprobs, and for a conversation its tools, tool choice, answer format and
//! reasoning options; and the checks every request gets, whatever its protocol. It belongs to
//! the server, so a protocol's own field has a place here without borrowing another
//! protocol's wire type.

use serde_json::{Map, Value};
use spindle_api::{ApiError, ChatMessage, SamplingParams, Tool};

#[derive(Debug)]
pub(crate) struct GenerationRequest {
    /// The model the client named; absent or empty means the first one served.
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Temperature, filters, penalties, seed and stop strings.
    pub sampling: SamplingParams,
    /// The output limit asked for; `None`: the room the prompt leaves in the context.
    pub max_tokens: Option<u32>,
    /// Logprobs of each sampled token with this many alternatives (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// The wire field holding the prompt, which a prompt too long for the context names.
    pub prompt_field: &'static str,
    /// Seconds the model may stay idle after this request before it is unloaded (0: never;
    /// `None`: the server's `--model-ttl`).
    pub ttl: Option<u64>,
    /// The route the request came in by (a batch's: its line's `url`), named in its log line.
    pub endpoint: &'static str,
}

#[derive(Debug)]
pub(crate) enum Prompt {
    /// A conversation the chat template renders (boxed: it is many times the size of the ids).
    Chat(Box<Conversation>),
    /// Token ids read as they are: no template, no reasoning split, no tools.
    Tokens(Vec<u32>),
}

/// A conversation and what shapes its answer.
#[derive(Debug)]
pub(crate) struct Conversation {
    /// In OpenAI's message shape, which is what chat templates are written for.
    pub messages: Vec<ChatMessage>,
    /// Offered to the model, in OpenAI's tool shape (what templates render).
    pub tools: Vec<Tool>,
    /// `None`: the default, `auto` when tools are offered and `none` otherwise.
    pub tool_choice: Option<ToolChoice>,
    /// More than one call per answer allowed.
    pub parallel_tool_calls: bool,
    /// `None`: the server's `--guided-json` if any, else free text.
    pub format: Option<AnswerFormat>,
    /// Template variables (`enable_thinking` among them), over the server's own.
    pub template_kwargs: Map<String, Value>,
    /// Most tokens to spend reasoning (`None`: the server's `--thinking-budget`).
    pub thinking_budget: Option<u32>,
}

/// Whether and which tools the model must call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

impl ToolChoice {
    /// A choice by the name OpenAI's APIs give it (`none`, `auto` or `required`).
    pub fn from_mode(mode: &str) -> Result<Self, ApiError> {
        match mode {
            "none" => Ok(Self::None),
            "auto" => Ok(Self::Auto),
            "required" => Ok(Self::Required),
            other => Err(ApiError::bad_request(
                format!("unknown tool_choice `{other}`; expected none, auto, required or a named function"),
                Some("tool_choice"),
            )),
        }
    }
}

/// The shape the answer's text must take.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AnswerFormat {
    /// Free text, even where the server has a `--guided-json`.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON following this schema (an object).
    JsonSchema(Value),
}

impl GenerationRequest {
    /// What the pipeline needs of any request, whichever protocol's checks ran before: a
    /// conversation with a message, an output of at least one token, sampling in range.
    pub fn validate(&self) -> Result<(), ApiError> {
        if let Prompt::Chat(conversation) = &self.prompt {
            if conversation.messages.is_empty() {
                return Err(ApiError::bad_request("messages must not be empty", Some("messages")));
            }
        }
        if self.max_tokens == Some(0) {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1, got 0",
                Some("max_tokens"),
            ));
        }
        self.sampling.validate()
    }
}
