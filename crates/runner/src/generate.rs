//! Single-sequence generation: prefill the prompt, then decode one token at a time until an
//! end-of-sequence token or the token limit.

use std::time::{Duration, Instant};

use spindle_models::CausalLm;

use crate::error::{Result, RunnerError};
use crate::sampler::{SampledToken, Sampler, SamplingParams};

/// What to generate.
pub struct GenerationRequest<'a> {
    pub prompt_ids: &'a [u32],
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (not emitted).
    pub stop_ids: &'a [u32],
    /// Positions the sequence may use in all (prompt + generated).
    pub context: usize,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was sampled.
    Stop,
    /// `max_tokens` or the context limit was reached.
    Length,
    /// The request was cancelled while running.
    Cancelled,
}

/// Counts and timings of one generation.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    pub finish_reason: FinishReason,
}

impl GenerationStats {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Decode speed over the tokens produced after the first (which the prefill produced).
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Runs one request to completion, calling `on_token` with each generated token as soon as it
/// is sampled.
pub fn generate(
    model: &dyn CausalLm,
    req: &GenerationRequest,
    mut on_token: impl FnMut(&SampledToken),
) -> Result<GenerationStats> {
    if req.prompt_ids.is_empty() {
        return Err(RunnerError::EmptyPrompt);
    }
    req.sampling.validate()?;
    let mut cache = model.new_cache(req.context);
    cache.check_room(req.prompt_ids.len())?;
    let mut sampler = Sampler::new(req.sampling.clone(), req.prompt_ids);

    let started = Instant::now();
    let mut logits = model.forward(req.prompt_ids, &mut cache)?;
    let prefill_time = started.elapsed();

    let started = Instant::now();
    let mut generated = 0;
    let finish_reason = loop {
        if generated >= req.max_tokens || cache.len() >= cache.limit() {
            break FinishReason::Length;
        }
        let token = sampler.sample(&logits);
        if req.stop_ids.contains(&token.id) {
            break FinishReason::Stop;
        }
        generated += 1;
        on_token(&token);
        if generated < req.max_tokens && cache.len() < cache.limit() {
            logits = model.forward(&[token.id], &mut cache)?;
        }
    };
    Ok(GenerationStats {
        prompt_tokens: req.prompt_ids.len(),
        generated_tokens: generated,
        prefill_time,
        decode_time: started.elapsed(),
        finish_reason,
    })
}
