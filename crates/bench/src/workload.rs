//! The agent pattern and the burst, run against a [`Client`].
//!
//! ```text
//! agent:  warm-up ─▶ cold ─▶ warm (same messages) ─▶ prefix-test 1..3 (same system, new user)
//!         ─▶ [server restart] ─▶ warm-up ─▶ cold-prefix (same system, new user)
//! burst:  warm (new system) ─▶ single (new user, alone) ─▶ N at once (new users)
//! ```
//! Each burst has its own system prompt (another salt), so its warm-up is the only call that
//! must compute it and the bursts do not depend on their order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agentic::{Phase, PhaseKind, PREFIX_CALLS};
use crate::client::Client;
use crate::error::BenchError;
use crate::prompt::{system_prompt, user_message, CHARS_PER_TOKEN};
use crate::sse::Measurement;

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

/// One burst: its warm-up, a lone call, and the concurrent calls (an error as its text).
#[derive(Debug, Clone)]
pub struct BurstRun {
    pub concurrency: usize,
    pub warm: Measurement,
    pub single: Measurement,
    pub calls: Vec<Result<Measurement, String>>,
    /// From the start of the burst to the end of its last call.
    pub wall: Duration,
}

/// Below this many cached tokens short of the whole system prompt, a call counts as having
/// re-read the prompt. The slack admits caches that keep only whole blocks (up to 64 tokens)
/// or stop at the message boundary rather than after the next role header.
pub const REREAD_SLACK_TOKENS: usize = 64;

impl BurstRun {
    pub fn succeeded(&self) -> impl Iterator<Item = &Measurement> {
        self.calls.iter().filter_map(|c| c.as_ref().ok())
    }

    pub fn errors(&self) -> Vec<&str> {
        self.calls.iter().filter_map(|c| c.as_ref().err().map(String::as_str)).collect()
    }

    /// Successful calls that got less than the system prompt (`system_tokens`, less
    /// [`REREAD_SLACK_TOKENS`]) from the server's cache.
    pub fn rereads(&self, system_tokens: usize) -> usize {
        let needed = system_tokens.saturating_sub(REREAD_SLACK_TOKENS);
        self.succeeded().filter(|m| (m.cached_tokens as usize) < needed).count()
    }

    /// Completion tokens of all successful calls over the burst's wall time.
    pub fn aggregate_tokens_per_second(&self) -> f64 {
        let tokens: u32 = self.succeeded().map(|m| m.completion_tokens).sum();
        tokens as f64 / self.wall.as_secs_f64()
    }

    /// Completion tokens of the lone call over its latency.
    pub fn single_tokens_per_second(&self) -> f64 {
        self.single.completion_tokens as f64 / self.single.latency.as_secs_f64()
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

    /// After a [`Workload::warm_up`]: cold, warm, and [`PREFIX_CALLS`] new-user calls, one
    /// after another.
    pub async fn agent(&self, client: &Client) -> Result<Vec<Phase>, BenchError> {
        self.warm_up(client).await?;
        let mut phases = Vec::new();
        for (kind, user) in [(PhaseKind::Cold, 0), (PhaseKind::Warm, 0)]
            .into_iter()
            .chain((1..=PREFIX_CALLS).map(|n| (PhaseKind::Prefix(n), n)))
        {
            let measurement =
                client.chat(&self.system, &user_message(user), self.max_tokens).await?;
            phases.push(Phase { kind, measurement });
        }
        Ok(phases)
    }

    /// The call after a restart (and a [`Workload::warm_up`]): the agent's system prompt with
    /// yet another user message.
    pub async fn after_restart(&self, client: &Client) -> Result<Phase, BenchError> {
        self.warm_up(client).await?;
        let measurement =
            client.chat(&self.system, &user_message(PREFIX_CALLS + 1), self.max_tokens).await?;
        Ok(Phase { kind: PhaseKind::ColdPrefix, measurement })
    }

    /// Burst number `index` of `concurrency` calls. Fails only when the warm-up or the lone
    /// call fails; the concurrent calls' errors are counted in the result.
    pub async fn burst(
        &self,
        client: &Client,
        index: usize,
        concurrency: usize,
    ) -> Result<BurstRun, BenchError> {
        let salt = self.salt.wrapping_add(1 + index as u64);
        let system: Arc<str> = system_prompt(salt, self.target_tokens, self.chars_per_token).into();
        let warm = client.chat(&system, &user_message(0), self.max_tokens).await?;
        let single = client.chat(&system, &user_message(1), self.max_tokens).await?;
        let start = Instant::now();
        let tasks: Vec<_> = (0..concurrency)
            .map(|i| {
                let (client, system, max_tokens) =
                    (client.clone(), system.clone(), self.max_tokens);
                tokio::spawn(
                    async move { client.chat(&system, &user_message(2 + i), max_tokens).await },
                )
            })
            .collect();
        let mut calls = Vec::with_capacity(concurrency);
        for task in tasks {
            calls.push(match task.await {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(join) => Err(join.to_string()),
            });
        }
        Ok(BurstRun { concurrency, warm, single, calls, wall: start.elapsed() })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::agentic::tests::m;

    pub fn burst() -> BurstRun {
        BurstRun {
            concurrency: 4,
            warm: m(900, 1000, 0, 16),
            single: m(100, 500, 600, 16),
            calls: vec![
                Ok(m(100, 800, 640, 16)),
                Ok(m(200, 1600, 0, 16)),
                Ok(m(150, 1200, 576, 8)),
                Err("status 429: full".into()),
            ],
            wall: Duration::from_millis(2000),
        }
    }

    #[test]
    fn burst_counts() {
        let b = burst();
        assert_eq!(b.errors(), ["status 429: full"]);
        assert_eq!(b.succeeded().count(), 3);
        // Needed: 640 - 64 = 576 cached tokens; only the call with 0 falls short.
        assert_eq!(b.rereads(640), 1);
        assert_eq!(b.rereads(641), 2);
        assert_eq!(b.rereads(10), 0);
        assert_eq!(b.aggregate_tokens_per_second(), 20.0);
        assert_eq!(b.single_tokens_per_second(), 32.0);
    }
}
