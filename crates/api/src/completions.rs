//! `/v1/completions`, OpenAI's legacy text-in, text-out endpoint: the request, and the
//! response (`text_completion`) whole and streamed.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::common::null_as_default;
use crate::validate::{check_range, check_stream_options};
use crate::{ApiError, FinishReason, SamplingParams, StreamOptions, Usage, MAX_TOP_LOGPROBS};

/// `max_tokens` when the client leaves it out, as in OpenAI.
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

fn default_max_tokens() -> Option<u32> {
    Some(DEFAULT_COMPLETION_MAX_TOKENS)
}

/// The body of `POST /v1/completions`. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Seconds the model may stay idle after this request before it is unloaded (LM Studio's
    /// `ttl`, Spindle's extension; 0: never); absent: the server's `--model-ttl`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
    pub prompt: Prompt,
    /// [`DEFAULT_COMPLETION_MAX_TOKENS`] when absent; an explicit `null` means no limit but
    /// the context length, as in vLLM. So `None` is written as `null`, never left out.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: Option<u32>,
    #[serde(flatten)]
    pub sampling: SamplingParams,
    #[serde(default, deserialize_with = "null_as_default")]
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// The legacy form: how many alternatives to return per token (0 returns only the
    /// sampled token's log probability), up to [`MAX_TOP_LOGPROBS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Put the prompt in front of the generated text (and its tokens in front of the
    /// log probabilities).
    #[serde(default, deserialize_with = "null_as_default")]
    pub echo: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl Default for CompletionRequest {
    fn default() -> Self {
        Self {
            model: None,
            ttl: None,
            prompt: Prompt::Text(String::new()),
            max_tokens: default_max_tokens(),
            sampling: SamplingParams::default(),
            stream: false,
            stream_options: None,
            logprobs: None,
            echo: false,
            user: None,
        }
    }
}

impl CompletionRequest {
    /// Checks what serde cannot; the error names the first offending field.
    pub fn validate(&self) -> Result<(), ApiError> {
        if let Prompt::Texts(texts) = &self.prompt {
            if texts.len() != 1 {
                return Err(ApiError::bad_request(
                    format!(
                        "prompt must be one string; batches are not supported, got {} strings",
                        texts.len()
                    ),
                    Some("prompt"),
                ));
            }
        }
        check_stream_options(self.stream, self.stream_options.as_ref())?;
        check_range(self.max_tokens, 1.., "max_tokens", "at least 1")?;
        self.sampling.validate()?;
        check_range(self.logprobs, ..=MAX_TOP_LOGPROBS, "logprobs", "at most 20")
    }
}

/// `prompt`: text, an array holding one text, or token ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, expecting = "a string, an array of strings, or an array of token ids")]
pub enum Prompt {
    Text(String),
    /// Accepted on the wire for compatibility; validation allows exactly one element.
    Texts(Vec<String>),
    TokenIds(Vec<u32>),
}

impl Prompt {
    /// The prompt's text, whether sent as a string or a one-element array; `None` for
    /// token ids or a batch.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text(text) => Some(text),
            Self::Texts(texts) if texts.len() == 1 => Some(&texts[0]),
            _ => None,
        }
    }
}

/// The whole response of a non-streaming request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "text_completion")]
pub struct Completion {
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub system_fingerprint: Option<String>,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

/// One server-sent event of a streaming response; OpenAI names its object
/// `text_completion` too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "text_completion")]
pub struct CompletionChunk {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: Option<String>,
    /// Empty in the final usage chunk.
    pub choices: Vec<CompletionChoice>,
    /// Only in the final chunk, and only with `stream_options.include_usage`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One choice of a [`Completion`] or [`CompletionChunk`]: in a chunk, `text` is the new
/// piece.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub text: String,
    pub index: u32,
    /// `null` unless the request set `logprobs`.
    pub logprobs: Option<CompletionLogprobs>,
    /// `null` in every chunk but the choice's last.
    pub finish_reason: Option<FinishReason>,
}

/// The legacy log-probability shape: parallel arrays, one entry per token of `text`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// `null` for the first echoed prompt token, which has no context to be predicted from.
    pub token_logprobs: Vec<Option<f32>>,
    /// `null` where `token_logprobs` is.
    pub top_logprobs: Vec<Option<LegacyTopLogprobs>>,
    /// Character offset of each token in the choice's `text`.
    pub text_offset: Vec<u32>,
}

/// One token's alternatives, written as a JSON object from token text to log probability,
/// most likely first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LegacyTopLogprobs(pub Vec<(String, f32)>);

impl Serialize for LegacyTopLogprobs {
    /// Different tokens can decode to the same text (e.g. partial UTF-8 bytes); a JSON object
    /// cannot repeat a key, so only the first (most likely) of them is written.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (i, (token, logprob)) in self.0.iter().enumerate() {
            if !self.0[..i].iter().any(|(earlier, _)| earlier == token) {
                map.serialize_entry(token, logprob)?;
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for LegacyTopLogprobs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesInOrder;

        impl<'de> Visitor<'de> for EntriesInOrder {
            type Value = LegacyTopLogprobs;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object from token text to log probability")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(LegacyTopLogprobs(entries))
            }
        }

        deserializer.deserialize_map(EntriesInOrder)
    }
}
