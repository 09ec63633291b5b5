//! Prefill and decode speed of a model through the engine `serve` runs, a fresh engine per run
//! so no run resumes from another's prefix cache (`spindle bench` without a panel): prefill is
//! the prompt's tokens over the time to the first token, decode the tokens after the first over
//! the time they took, generated from a one-token prompt (llama-bench's `tg`), after a cached
//! prefix of `depth` tokens (llama-bench's `-d`), or for `concurrent` requests at once
//! (llama-batched-bench's `-npl`).

use std::sync::Arc;
use std::time::Instant;

use crate::sampler::SamplingParams;
use crate::{
    single_sequence_cache, Engine, EngineConfig, ModelBundle, Result, RunnerError, SequenceRequest,
};

/// What one run measures.
#[derive(Clone, Copy, Debug)]
pub struct SpeedRun {
    pub prompt_tokens: usize,
    /// Tokens each request decodes, 2 or more.
    pub decode_tokens: usize,
    /// Tokens of a prefix read (and cached) before the measured prompt; 0 with `concurrent`.
    pub depth: usize,
    /// Requests at once, 1 or more.
    pub concurrent: usize,
}

impl SpeedRun {
    /// Tokens of text a run needs: the depth's prefix and the prompt, or one prompt per
    /// concurrent request, each starting one token later than the one before (so no two share
    /// a prefix).
    pub fn text_tokens(&self) -> usize {
        self.depth + self.prompt_tokens + self.concurrent - 1
    }
}

/// Tokens per second of one run.
#[derive(Clone, Copy, Debug)]
pub struct Speeds {
    pub prefill: f64,
    pub decode: f64,
}

/// One run on a fresh engine (an empty prefix cache), at the settings `serve` uses.
pub fn measure(bundle: &Arc<ModelBundle>, text: &[u32], args: &SpeedRun) -> Result<Speeds> {
    if args.concurrent > 1 {
        return measure_concurrent(bundle, text, args);
    }
    let context = text.len() + args.decode_tokens + 1;
    // At depth, room for the prompt's sequence and the decode's beside the prefix they share.
    let positions = if args.depth == 0 { context } else { context + args.decode_tokens + 32 };
    let engine = Engine::start(
        bundle.clone(),
        EngineConfig::new(1, single_sequence_cache(bundle, positions)),
    );
    if args.depth == 0 {
        // Decode from a one-token prompt, as llama-bench's `tg` runs from an empty context:
        // after the prompt it would run at the prompt's depth and pay for its attention too.
        let prefill = engine.generate(greedy(text, 1, context), |_, _| {})?;
        let decode = engine.generate(greedy(&text[..1], args.decode_tokens, context), |_, _| {})?;
        if prefill.summary.cached_tokens + decode.summary.cached_tokens > 0 {
            return Err(RunnerError::Internal(
                "a benchmark run resumed from the prefix cache".into(),
            ));
        }
        return Ok(Speeds {
            prefill: prefill.prefill_tokens_per_second(),
            decode: decode.decode_tokens_per_second(),
        });
    }
    let depth = args.depth;
    engine.generate(greedy(&text[..depth], 1, context), |_, _| {})?;
    let prefill = engine.generate(greedy(text, 1, context), |_, _| {})?;
    let decode =
        engine.generate(greedy(&text[..depth + 1], args.decode_tokens, context), |_, _| {})?;
    for stats in [&prefill, &decode] {
        // The cache keeps whole blocks, so up to a block of the prefix may be read again.
        let cached = stats.summary.cached_tokens;
        if cached + 64 < depth {
            return Err(RunnerError::Internal(format!(
                "only {cached} of the {depth}-token prefix came from the cache"
            )));
        }
    }
    Ok(Speeds {
        prefill: prefill.prefill_tokens_per_second(),
        decode: decode.decode_tokens_per_second(),
    })
}

/// `--concurrent` requests submitted together: prefill is every prompt token over the time to the
/// last first token; decode counts the tokens after that instant, when all of them are decoding.
fn measure_concurrent(bundle: &Arc<ModelBundle>, text: &[u32], args: &SpeedRun) -> Result<Speeds> {
    let (n, len) = (args.concurrent, args.prompt_tokens);
    let context = len + args.decode_tokens + 1;
    let engine = Engine::start(
        bundle.clone(),
        EngineConfig::new(n, single_sequence_cache(bundle, n * context)),
    );
    let start = Instant::now();
    let runs = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (engine, prompt) = (&engine, &text[i..i + len]);
                scope.spawn(move || {
                    let mut arrivals = Vec::new();
                    let stats = engine
                        .generate(greedy(prompt, args.decode_tokens, context), |_, _| {
                            arrivals.push(Instant::now())
                        })?;
                    if stats.summary.cached_tokens > 0 {
                        return Err(RunnerError::Internal(
                            "a benchmark request resumed from the prefix cache".into(),
                        ));
                    }
                    Ok(arrivals)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("a benchmark request's thread panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    let all_decoding =
        runs.iter().filter_map(|arrivals| arrivals.first()).max().copied().unwrap_or(start);
    let end = runs.iter().filter_map(|arrivals| arrivals.last()).max().copied().unwrap_or(start);
    let decoded = runs.iter().flatten().filter(|&&arrival| arrival > all_decoding).count();
    Ok(Speeds {
        prefill: (n * len) as f64 / (all_decoding - start).as_secs_f64().max(1e-9),
        decode: decoded as f64 / (end - all_decoding).as_secs_f64().max(1e-9),
    })
}

/// Greedy decoding of exactly `max_tokens` (no stop ids, so runs are comparable), plain: the
/// figures are set beside llama-bench's, which does not speculate.
fn greedy(prompt: &[u32], max_tokens: usize, context: usize) -> SequenceRequest {
    let sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    SequenceRequest {
        speculative: Some(false),
        ..SequenceRequest::plain(prompt.to_vec(), max_tokens, sampling, context)
    }
}
