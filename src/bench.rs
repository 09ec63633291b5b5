//! `spindle bench`: prefill and decode speed of one or more models, as medians over repeats.
//! Every run goes through the engine `serve` runs, a fresh one each time, so no run resumes
//! from another's prefix cache: prefill is the prompt's tokens over the time to the first
//! token, decode the tokens after the first over the time they took, generated from a
//! one-token prompt (llama-bench's `tg`: decode at depth 0 unless `--depth` says otherwise).
//! With `--hybrid-blocks N` it also measures a random-weight model with Qwen3.5-35B-A3B's
//! per-layer shape, and prints its speed relative to the first model measured in the same run.
//! `--depth N` measures after an N-token prefix already in the prefix cache (llama-bench's `-d`),
//! `--concurrent N` the aggregate speeds of N requests at once (llama-batched-bench's `-npl`).

use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{single_sequence_cache, Engine, EngineConfig, ModelBundle, SequenceRequest};

#[derive(Args)]
pub struct BenchArgs {
    /// Models to measure (catalogue names or paths).
    #[arg(long, num_args = 1.., default_values_t = ["smollm2-135m".to_string(), "qwen2.5-coder-0.5b".to_string(), "gemma3-270m".to_string()])]
    models: Vec<String>,
    /// Also measure a random-weight Qwen3.5-MoE of this many blocks (3 linear-attention + 1
    /// full-attention layer each) with the real model's per-layer shape; 0 skips it.
    #[arg(long, default_value_t = 0)]
    hybrid_blocks: usize,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 256)]
    prompt_tokens: usize,
    /// Tokens to decode: from a one-token prompt, or at `--depth` after its prefix.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Tokens read (untimed, cached) before the measured prompt; decode is then timed right after
    /// this prefix, so both figures are at this depth.
    #[arg(long, default_value_t = 0)]
    depth: usize,
    /// Requests run at once, each with its own prompt: the figures are their aggregate speeds.
    #[arg(long, default_value_t = 1)]
    concurrent: usize,
}

/// Medians of one model's runs.
struct Speeds {
    prefill: f64,
    decode: f64,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    crate::set_threads(Some(args.threads));
    anyhow::ensure!(
        args.depth == 0 || args.concurrent <= 1,
        "--depth and --concurrent measure separately; give one of them"
    );
    anyhow::ensure!(
        args.concurrent >= 1 && args.decode_tokens >= 2,
        "--concurrent needs 1 or more, --decode-tokens 2 or more"
    );
    println!(
        "threads={} prompt={} decode={} repeats={} depth={} concurrent={}",
        args.threads,
        args.prompt_tokens,
        args.decode_tokens,
        args.repeats,
        args.depth,
        args.concurrent
    );
    println!(
        "{:<34} {:>28} {:>28}",
        "model", "prefill tok/s med [min-max]", "decode tok/s med [min-max]"
    );
    let mut baseline: Option<(String, Speeds)> = None;
    for name in &args.models {
        let files = spindle_hub::resolve(
            name,
            &spindle_hub::spindle_home(),
            spindle_hub::WhenMissing::Download,
        )?;
        let bundle = Arc::new(crate::memory::returning_freed_memory(|| ModelBundle::load(&files))?);
        let prompt = bench_prompt(&bundle, prompt_span(&args))?;
        let speeds = report(name, &bundle, &prompt, &args)?;
        baseline.get_or_insert((name.clone(), speeds));
    }
    if args.hybrid_blocks > 0 {
        let path = crate::random_hybrid::path(args.hybrid_blocks)?;
        let model = spindle_models::load_gguf(&path)?;
        let vocab = model.config().vocab_size as u32;
        // Random weights: any fixed token sequence serves.
        let prompt: Vec<u32> =
            (0..prompt_span(&args) as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let bundle = Arc::new(with_default_tokenizer(model)?);
        let name = format!("qwen3.5-moe shape, {} layers", 4 * args.hybrid_blocks);
        let speeds = report(&name, &bundle, &prompt, &args)?;
        if let Some((base, b)) = &baseline {
            println!(
                "{name} / {base}: prefill {:.2}x, decode {:.2}x",
                speeds.prefill / b.prefill,
                speeds.decode / b.decode
            );
        }
    }
    Ok(())
}

fn report(
    name: &str,
    bundle: &Arc<ModelBundle>,
    prompt: &[u32],
    args: &BenchArgs,
) -> anyhow::Result<Speeds> {
    let runs = (0..args.repeats.max(1))
        .map(|_| measure(bundle, prompt, args))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (prefill, prefill_text) = summary(runs.iter().map(|run| run.prefill).collect());
    let (decode, decode_text) = summary(runs.iter().map(|run| run.decode).collect());
    println!("{name:<34} {prefill_text:>28} {decode_text:>28}");
    Ok(Speeds { prefill, decode })
}

/// The random-weight model has no tokenizer; the engine turns its tokens into text with the
/// default model's (whose vocabulary covers the random model's ids).
fn with_default_tokenizer(model: Box<dyn spindle_models::CausalLm>) -> anyhow::Result<ModelBundle> {
    let files = spindle_hub::resolve(
        spindle_hub::DEFAULT_MODEL,
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )?;
    let ModelBundle { tokenizer, template, sampling, .. } =
        crate::memory::returning_freed_memory(|| ModelBundle::load(&files))?;
    anyhow::ensure!(
        model.config().vocab_size <= tokenizer.vocab_size(),
        "the default model's tokenizer lacks the random model's ids"
    );
    Ok(ModelBundle { model, tokenizer, template, fingerprint: "random-weights".into(), sampling })
}

/// Natural text cut to exactly `len` tokens.
fn bench_prompt(bundle: &ModelBundle, len: usize) -> anyhow::Result<Vec<u32>> {
    let paragraph = "The quick brown fox jumps over the lazy dog while the scheduler decides which request runs next. ";
    let mut ids = bundle.tokenizer.encode(&paragraph.repeat(len / 8 + 1), true)?;
    ids.truncate(len);
    Ok(ids)
}

/// Tokens of text a run needs: the depth's prefix and the prompt, or one prompt per concurrent
/// request, each starting one token later than the one before (so no two share a prefix).
fn prompt_span(args: &BenchArgs) -> usize {
    args.depth + args.prompt_tokens + args.concurrent - 1
}

/// One run on a fresh engine (an empty prefix cache), at the settings `serve` uses.
fn measure(bundle: &Arc<ModelBundle>, text: &[u32], args: &BenchArgs) -> anyhow::Result<Speeds> {
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
        anyhow::ensure!(
            prefill.summary.cached_tokens == 0 && decode.summary.cached_tokens == 0,
            "a benchmark run resumed from the prefix cache"
        );
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
        anyhow::ensure!(
            cached + 64 >= depth,
            "only {cached} of the {depth}-token prefix came from the cache"
        );
    }
    Ok(Speeds {
        prefill: prefill.prefill_tokens_per_second(),
        decode: decode.decode_tokens_per_second(),
    })
}

/// `--concurrent` requests submitted together: prefill is every prompt token over the time to the
/// last first token; decode counts the tokens after that instant, when all of them are decoding.
fn measure_concurrent(
    bundle: &Arc<ModelBundle>,
    text: &[u32],
    args: &BenchArgs,
) -> anyhow::Result<Speeds> {
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
                    anyhow::ensure!(
                        stats.summary.cached_tokens == 0,
                        "a benchmark request resumed from the prefix cache"
                    );
                    Ok(arrivals)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("a benchmark request's thread panicked"))
            .collect::<anyhow::Result<Vec<_>>>()
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

/// The median and its `med [min-max]` text.
fn summary(mut values: Vec<f64>) -> (f64, String) {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    (median, format!("{median:.1} [{:.1}-{:.1}]", values[0], values[values.len() - 1]))
}
