//! What `/v1/responses` sends back: the `response` object with its output items (returned
//! whole, or carried by the first and last events of a stream), and the typed server-sent
//! events of a streamed response.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{InputItem, ReasoningOptions, Role, TextOptions};

/// A response: returned whole, carried by the stream's first and last events, and kept for
/// `GET /v1/responses/{id}` and `previous_response_id`. The request's settings are echoed,
/// as OpenAI does and its SDKs expect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "response")]
pub struct Response {
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    pub status: ResponseStatus,
    /// `null` unless the response failed.
    pub error: Option<ResponseError>,
    /// Why the response is `incomplete`; `null` otherwise.
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: ReasoningOptions,
    pub store: bool,
    pub temperature: Option<f32>,
    pub text: TextOptions,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_p: Option<f32>,
    /// Always `disabled`: a conversation longer than the context is an error, not cut.
    pub truncation: String,
    /// `null` until the response is finished.
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncompleteDetails {
    /// `max_output_tokens` when the output limit (or the context) cut the answer.
    pub reason: String,
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    /// Input tokens served from the prefix cache.
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

/// The status of one output item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

/// One item of a response's `output`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Reasoning {
        id: String,
        /// Always empty: the reasoning is returned whole in `content`.
        summary: Vec<SummaryPart>,
        content: Vec<ReasoningPart>,
        status: ItemStatus,
    },
    Message {
        id: String,
        /// Always `assistant`.
        role: Role,
        status: ItemStatus,
        content: Vec<OutputPart>,
    },
    FunctionCall {
        id: String,
        /// Never empty: the client answers with a `function_call_output` naming it.
        call_id: String,
        name: String,
        /// The namespace tool `name` belongs to; absent for a top-level function.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        arguments: String,
        status: ItemStatus,
    },
}

impl OutputItem {
    /// The item as the next request's input (what `previous_response_id` replays).
    pub fn to_input(&self) -> Option<InputItem> {
        match self {
            Self::Reasoning { content, .. } => {
                let text: String = content
                    .iter()
                    .map(|ReasoningPart::ReasoningText { text }| text.as_str())
                    .collect();
                (!text.is_empty()).then_some(InputItem::Reasoning { text })
            }
            Self::Message { content, .. } => Some(InputItem::Message {
                role: "assistant".into(),
                content: content
                    .iter()
                    .map(|OutputPart::OutputText { text, .. }| text.as_str())
                    .collect(),
            }),
            Self::FunctionCall { call_id, name, namespace, arguments, .. } => {
                Some(InputItem::FunctionCall {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    namespace: namespace.clone(),
                    arguments: arguments.clone(),
                })
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SummaryPart {
    SummaryText { text: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReasoningPart {
    ReasoningText { text: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputPart {
    OutputText { text: String, annotations: Vec<Value> },
}

/// One server-sent event of a streamed response, numbered from 0 in the order sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamEvent {
    pub sequence_number: u64,
    #[serde(flatten)]
    pub event: ResponseEvent,
}

/// What a [`StreamEvent`] says; its `type` is also the SSE `event:` name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ResponseEvent {
    #[serde(rename = "response.created")]
    Created { response: Response },
    #[serde(rename = "response.in_progress")]
    InProgress { response: Response },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded { output_index: usize, item: OutputItem },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone { output_index: usize, item: OutputItem },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputPart,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone { item_id: String, output_index: usize, content_index: usize, part: OutputPart },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta { item_id: String, output_index: usize, content_index: usize, delta: String },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone { item_id: String, output_index: usize, content_index: usize, text: String },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta { item_id: String, output_index: usize, delta: String },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone { item_id: String, output_index: usize, arguments: String },
    #[serde(rename = "response.completed")]
    Completed { response: Response },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Response },
    /// A failure before the response was created (its model did not load): OpenAI's `error`
    /// event.
    #[serde(rename = "error")]
    Error { code: String, message: String, param: Option<String> },
    #[serde(rename = "response.failed")]
    Failed { response: Response },
}

/// The body of `DELETE /v1/responses/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "response.deleted")]
pub struct ResponseDeleted {
    pub id: String,
    pub deleted: bool,
}
