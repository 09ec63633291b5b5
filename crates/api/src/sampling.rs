//! Sampling parameters accepted by both generation endpoints, and their range checks.

use std::ops::Bound;

use serde::{Deserialize, Serialize};

use crate::validate::check_range;
use crate::ApiError;

/// Most stop sequences a request may give, as in OpenAI.
pub const MAX_STOP_SEQUENCES: usize = 4;

/// Most alternatives per token a request may ask for (`top_logprobs`, or legacy `logprobs`).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// The sampling fields of a chat or legacy completion request, flattened into it on the
/// wire. Every field is optional; `None` means the server's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 to 2; 0 means greedy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens; 0 or -1 (vLLM's convention) means no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 to 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// Multiplicative penalty on tokens already present (> 0; 1 disables).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// -2 to 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// -2 to 2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Same seed, same request ⇒ same output. A signed 64-bit integer, as in OpenAI's spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Number of choices; only 1 is supported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopSequences>,
    /// Whether to decode speculatively (Spindle's extension); the output is the same either
    /// way, only its speed differs. `None`: the server's default (on unless `--no-speculate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<bool>,
}

impl SamplingParams {
    /// Checks every range; the error names the first field out of range.
    pub fn validate(&self) -> Result<(), ApiError> {
        check_range(self.temperature, 0.0..=2.0, "temperature", "between 0 and 2")?;
        check_range(
            self.top_p,
            (Bound::Excluded(0.0), Bound::Included(1.0)),
            "top_p",
            "in (0, 1]",
        )?;
        check_range(self.top_k, -1.., "top_k", "at least -1")?;
        check_range(self.min_p, 0.0..=1.0, "min_p", "between 0 and 1")?;
        check_range(
            self.repetition_penalty,
            (Bound::Excluded(0.0), Bound::Unbounded),
            "repetition_penalty",
            "greater than 0",
        )?;
        check_range(self.presence_penalty, -2.0..=2.0, "presence_penalty", "between -2 and 2")?;
        check_range(self.frequency_penalty, -2.0..=2.0, "frequency_penalty", "between -2 and 2")?;
        check_range(self.n, 1..=1, "n", "1")?;
        match &self.stop {
            Some(stop) if stop.len() > MAX_STOP_SEQUENCES => Err(ApiError::bad_request(
                format!("stop accepts at most {MAX_STOP_SEQUENCES} sequences, got {}", stop.len()),
                Some("stop"),
            )),
            _ => Ok(()),
        }
    }
}

/// `stop`: OpenAI accepts one string or an array of strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, expecting = "a string or an array of strings")]
pub enum StopSequences {
    One(String),
    Many(Vec<String>),
}

impl StopSequences {
    /// The sequences as a list, whichever form the client sent.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Many(v) => v.len(),
        }
    }
}
