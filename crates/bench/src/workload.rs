//! The system prompt of a run, sized with the server's tokenizer, and the warm-up call that
//! every panel makes before it measures.

use crate::client::Client;
use crate::error::BenchError;
use crate::prompt::{system_prompt, user_message, CHARS_PER_TOKEN};

/// The user message of [`Workload::warm_up`].
const WARM_UP_TEXT: &str = "Good morning! Before we start, a quick question about the weather in \
    Lisbon, the history of the printing press, prime numbers below 100, a recipe for lentil soup, \
    and why the sky looks blue at noon but red at sunset. One line each, please.";

/// A count of tokens, and whether the server counted it or it was estimated from characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCount {
    Counted(usize),
    Estimated(usize),
}

impl TokenCount {
    pub fn value(self) -> usize {
        match self {
            TokenCount::Counted(n) | TokenCount::Estimated(n) => n,
        }
    }
}

/// The system prompt and its sizes, fixed for a run.
#[derive(Debug, Clone)]
pub struct Workload {
    salt: u64,
    target_tokens: usize,
    chars_per_token: f64,
    max_tokens: u32,
    /// The agent phases' system prompt.
    pub system: String,
    /// Tokens a call with a new user message shares with earlier calls (see
    /// [`Client::shared_prefix_tokens`]).
    pub system_tokens: TokenCount,
}

impl Workload {
    /// Builds the system prompt for `salt`. When the server can count tokens, the prompt is
    /// sized with its tokenizer's characters per token instead of the default estimate.
    pub async fn prepare(
        client: &Client,
        salt: u64,
        target_tokens: usize,
        max_tokens: u32,
    ) -> Self {
        let first = system_prompt(salt, target_tokens, CHARS_PER_TOKEN);
        let chars_per_token = match client.count_tokens(&first).await {
            Some(n) if n > 0 => first.len() as f64 / n as f64,
            _ => CHARS_PER_TOKEN,
        };
        let system = system_prompt(salt, target_tokens, chars_per_token);
        let system_tokens = match client
            .shared_prefix_tokens(&system, &user_message(0), &user_message(1))
            .await
        {
            Some(n) => TokenCount::Counted(n),
            None => TokenCount::Estimated((system.len() as f64 / chars_per_token).round() as usize),
        };
        Self { salt, target_tokens, chars_per_token, max_tokens, system, system_tokens }
    }

    /// The salt of the system prompt.
    pub fn salt(&self) -> u64 {
        self.salt
    }

    /// Completion tokens per call at most.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// Another system prompt of this size, for `salt`.
    pub fn system_for(&self, salt: u64) -> String {
        system_prompt(salt, self.target_tokens, self.chars_per_token)
    }

    /// Characters per token of the server's tokenizer (or the default estimate).
    pub fn chars_per_token(&self) -> f64 {
        self.chars_per_token
    }

    /// A one-token call with an unrelated short prompt, so the first measured call pays for
    /// its prompt and not for a fresh process (weights paged in, buffers allocated). The text is
    /// long enough (~60 tokens) for a mixture of experts to touch most of its experts.
    pub async fn warm_up(&self, client: &Client) -> Result<(), BenchError> {
        client.chat("You are a helpful assistant.", WARM_UP_TEXT, 1).await.map(drop)
    }
}
