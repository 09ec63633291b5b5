//! `/tokenize`, `/detokenize` and the render endpoints, vLLM's extensions for counting and
//! inspecting tokens without generating.

use serde::{Deserialize, Serialize};

use crate::chat::validate_messages;
use crate::{ApiError, ChatMessage};

/// The body of `POST /tokenize`: either raw text or chat messages, which are rendered
/// through the chat template first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizeRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// Whether the tokenizer adds BOS and the like; `None` means the server's default for
    /// the input kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
}

impl TokenizeRequest {
    /// Requires exactly one of `prompt` and `messages`, and checks the messages as a chat
    /// request would.
    pub fn validate(&self) -> Result<(), ApiError> {
        match (&self.prompt, &self.messages) {
            (Some(_), None) => Ok(()),
            (None, Some(messages)) => validate_messages(messages),
            (Some(_), Some(_)) => Err(ApiError::bad_request(
                "give either prompt or messages, not both",
                Some("messages"),
            )),
            (None, None) => {
                Err(ApiError::bad_request("give either prompt or messages", Some("prompt")))
            }
        }
    }
}

/// The body of `POST /detokenize`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetokenizeRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// The answer to a [`TokenizeRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    pub tokens: Vec<u32>,
    /// `tokens.len()`, so a client counting tokens need not read the array.
    pub count: usize,
    /// The served context length, to compare `count` against.
    pub max_model_len: usize,
}

/// The answer to a [`DetokenizeRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// The answer to `POST /v1/chat/completions/render` (one) and `POST /v1/completions/render` (a
/// list, one per prompt): the token ids a generation request would start from, in vLLM's
/// layout, which routers (vllm-router's `cache_aware`, llm-d's token producer) read to match a
/// request against the blocks a replica caches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderedPrompt {
    pub request_id: String,
    pub model: String,
    pub token_ids: Vec<u32>,
}
