//! One plain generation driven from blocking code (`spindle generate`, `spindle bench`, the
//! reference tests): submitted to the [`Engine`] exactly like a server request, so it runs the
//! scheduler, prefill chunking, paged KV, sampler and prefix cache that serving runs, followed
//! to its end and timed.

use std::time::{Duration, Instant};

use crate::bundle::ModelBundle;
use crate::engine::Engine;
use crate::error::{EngineStopped, Result, RunnerError};
use crate::events::{sequence_channel, SequenceEvent, SequenceSummary};
use crate::prefix_cache::CacheConfig;
use crate::request::SequenceRequest;
use crate::sampler::SampledToken;

/// How a generation ended, and how long its two phases took.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub summary: SequenceSummary,
    /// Submission to the first token: the prefill of the uncached prompt, and one sampling.
    pub time_to_first_token: Duration,
    /// First token to the end: one model step and one sampling per later token.
    pub decode_time: Duration,
}

impl GenerationStats {
    /// Prompt tokens computed (those the prefix cache did not cover) per second to the first token.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        let computed = self.summary.prompt_tokens - self.summary.cached_tokens;
        computed as f64 / self.time_to_first_token.as_secs_f64().max(1e-9)
    }

    /// Tokens per second after the first (which the prefill produced).
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.summary.completion_tokens.saturating_sub(1) as f64
            / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// A cache with room for one sequence of `positions` and nothing more: what a single
/// generation needs, without the server's default gigabyte.
pub fn single_sequence_cache(bundle: &ModelBundle, positions: usize) -> CacheConfig {
    CacheConfig::default().holding(bundle, positions)
}

impl Engine {
    /// Runs `request` to its end, handing each token and the text it completes to `on_token` as
    /// it arrives. Blocks the calling thread, which must not be an async runtime's.
    pub fn generate(
        &self,
        request: SequenceRequest,
        mut on_token: impl FnMut(&SampledToken, &str),
    ) -> Result<GenerationStats> {
        if request.prompt_ids.is_empty() {
            return Err(RunnerError::EmptyPrompt);
        }
        if request.prompt_ids.len() >= request.context {
            let (prompt, context) = (request.prompt_ids.len(), request.context);
            return Err(RunnerError::PromptExceedsContext { prompt, context });
        }
        request.sampling.validate()?;
        let (caller, mut inbox) = sequence_channel();
        let submitted = Instant::now();
        self.submit(request, caller)?;
        let mut first_token: Option<Instant> = None;
        loop {
            // The engine ends every sequence with an event; a closed channel means it died.
            match inbox.blocking_recv().ok_or(EngineStopped)? {
                SequenceEvent::Token { token, text, .. } => {
                    first_token.get_or_insert_with(Instant::now);
                    on_token(&token, &text.content);
                }
                SequenceEvent::Finished(summary) => {
                    let ended = Instant::now();
                    let first = first_token.unwrap_or(ended);
                    return Ok(GenerationStats {
                        summary,
                        time_to_first_token: first - submitted,
                        decode_time: ended - first,
                    });
                }
                SequenceEvent::Failed(error) => return Err(error),
                SequenceEvent::Prefilled { .. } => {}
            }
        }
    }
}
