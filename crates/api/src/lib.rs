//! OpenAI-compatible wire types: what clients send to Spindle and what it sends back.
//! Serde types and request validation only; the server and the benchmark client share them.
//!
//! Requests ignore fields they do not know (real clients send extras) but reject fields of
//! the wrong JSON type. Serde cannot check ranges or fields that depend on each other, so
//! each request has a `validate` method whose [`ApiError`] names the offending field.
//! Responses serialize to OpenAI's shapes, `null`s included; the `object` (and the
//! assistant message's `role`) are serde tags, so they cannot be set wrong.
//!
//! ```
//! use spindle_api::{ChatCompletionChunk, ChatChunkChoice, ChatCompletionRequest, ChatDelta, Role};
//!
//! let body = r#"{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "stream": true}"#;
//! let request: ChatCompletionRequest = serde_json::from_str(body).unwrap();
//! if let Err(error) = request.validate() {
//!     // Send `error.status` with `error.to_response_body()`.
//!     panic!("{error}");
//! }
//! let first = ChatCompletionChunk {
//!     id: "chatcmpl-1".into(),
//!     created: 1_700_000_000,
//!     model: "smollm2".into(),
//!     system_fingerprint: None,
//!     choices: vec![ChatChunkChoice {
//!         index: 0,
//!         delta: ChatDelta { role: Some(Role::Assistant), content: Some(String::new()), ..Default::default() },
//!         logprobs: None,
//!         finish_reason: None,
//!     }],
//!     usage: None,
//!     prompt_progress: None,
//! };
//! let event = serde_json::to_string(&first).unwrap();
//! assert!(event.starts_with(r#"{"object":"chat.completion.chunk","id":"chatcmpl-1""#));
//! ```

/// Anthropic's Messages API, in its own namespace (its `Message`, `ErrorResponse`… are not OpenAI's).
pub mod anthropic;
mod batch;
mod chat;
mod common;
mod completions;
mod error;
mod response_object;
mod responses;
mod sampling;
mod tokenize;
mod validate;

pub use batch::{
    Batch, BatchError, BatchErrors, BatchInputLine, BatchLineError, BatchLineResponse,
    BatchOutputLine, BatchStatus, CreateBatchRequest, FileDeleted, FileObject, ListPage, ListQuery,
    RequestCounts, BATCH_ENDPOINT, COMPLETION_WINDOW,
};
pub use chat::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, ChatDelta, ChatMessage, ContentPart, FunctionCall, FunctionCallDelta,
    FunctionDefinition, MessageContent, PromptProgress, Role, Tool, ToolCall, ToolCallDelta,
    ToolType,
};
pub use common::{
    ChoiceLogprobs, CompletionTokensDetails, FinishReason, ModelCard, ModelList,
    PromptTokensDetails, StreamOptions, TokenLogprob, TopLogprob, Usage,
};
pub use completions::{
    Completion, CompletionChoice, CompletionChunk, CompletionLogprobs, CompletionRequest,
    LegacyTopLogprobs, Prompt, DEFAULT_COMPLETION_MAX_TOKENS,
};
pub use error::{ApiError, ErrorBody, ErrorKind, ErrorResponse};
pub use response_object::{
    IncompleteDetails, InputTokensDetails, ItemStatus, OutputItem, OutputPart, OutputTokensDetails,
    ReasoningPart, Response, ResponseDeleted, ResponseError, ResponseEvent, ResponseStatus,
    ResponseUsage, StreamEvent, SummaryPart,
};
pub use responses::{InputItem, ReasoningOptions, ResponseInput, ResponsesRequest, TextOptions};
pub use sampling::{SamplingParams, StopSequences, MAX_STOP_SEQUENCES, MAX_TOP_LOGPROBS};
pub use tokenize::{
    DetokenizeRequest, DetokenizeResponse, RenderedPrompt, TokenizeRequest, TokenizeResponse,
};
