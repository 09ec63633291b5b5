//! Pieces shared by the chat and legacy completion endpoints: finish reasons, token usage,
//! per-token log probabilities, stream options, and the `/v1/models` listing.

use serde::{Deserialize, Deserializer, Serialize};

/// Why a choice stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop sequence or an end-of-sequence token.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The model called one or more tools.
    ToolCalls,
    /// Never produced by Spindle; listed so a client can read OpenAI's own responses.
    ContentFilter,
}

/// Token counts for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    /// Servers that lack the details send `null` or leave them out.
    #[serde(default, deserialize_with = "null_as_default")]
    pub prompt_tokens_details: PromptTokensDetails,
    #[serde(default, deserialize_with = "null_as_default")]
    pub completion_tokens_details: CompletionTokensDetails,
}

impl Usage {
    /// Usage with `total_tokens` summed and the details zero; set the details afterwards.
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            ..Self::default()
        }
    }
}

/// Breakdown of [`Usage::prompt_tokens`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache instead of being computed.
    pub cached_tokens: u32,
}

/// Breakdown of [`Usage::completion_tokens`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionTokensDetails {
    /// Completion tokens spent inside the reasoning (thinking) section.
    pub reasoning_tokens: u32,
}

/// The `logprobs` of a chat choice or chunk choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChoiceLogprobs {
    /// One entry per generated content token, in order.
    pub content: Vec<TokenLogprob>,
}

/// A generated token with its log probability and the most likely alternatives.
///
/// Log probabilities must be finite: JSON has no `-inf`, so the engine clamps masked
/// tokens (OpenAI sends `-9999.0`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// The token's UTF-8 bytes, which may be part of a character `token` cannot show.
    pub bytes: Vec<u8>,
    /// Most likely first; as many as the request's `top_logprobs`.
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative in [`TokenLogprob::top_logprobs`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `stream_options` of a streaming request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send one last chunk with empty `choices` and the request's [`Usage`].
    #[serde(default, deserialize_with = "null_as_default")]
    pub include_usage: bool,
}

/// The body of `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "list")]
pub struct ModelList {
    pub data: Vec<ModelCard>,
}

/// One served model in a [`ModelList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "model")]
pub struct ModelCard {
    /// The name clients pass as `model`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub owned_by: String,
    /// Positions one request may use, prompt and answer together (vLLM's field); other
    /// servers may leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
    /// Spindle's extension: per thinking mode, the value a request that leaves a sampling
    /// parameter out gets and its source (`flag`, `model` or `built_in`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_defaults: Option<serde_json::Value>,
    /// Spindle's extension: `loaded`, `loading` or `not-loaded` (a model loads when a request
    /// names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// Reads `null` as the field's default. The OpenAI spec marks almost every request field
/// nullable, and clients do send `"stream": null` or `"tools": null`.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
