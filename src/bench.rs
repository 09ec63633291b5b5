//! `spindle bench`: prefill and decode speed of one or more models, as medians over repeats.
//! With `--hybrid-blocks N` it also measures a random-weight model with Qwen3.5-35B-A3B's
//! per-layer shape, and prints its speed relative to the first model measured in the same run.

use clap::Args;
use spindle_models::CausalLm;
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{GenerationRequest, GenerationStats, ModelBundle};

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
    /// Tokens to decode after the prompt.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// Medians of one model's runs.
struct Speeds {
    prefill: f64,
    decode: f64,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    crate::set_threads(Some(args.threads));
    println!("threads={} prompt={} decode={} repeats={}", args.threads, args.prompt_tokens, args.decode_tokens, args.repeats);
    println!("{:<34} {:>28} {:>28}", "model", "prefill tok/s med [min-max]", "decode tok/s med [min-max]");
    let mut baseline: Option<(String, Speeds)> = None;
    for name in &args.models {
        let files = spindle_hub::resolve(name, &spindle_hub::spindle_home(), true)?;
        let bundle = ModelBundle::load(&files)?;
        let prompt = bench_prompt(&bundle, args.prompt_tokens)?;
        let speeds = report(name, bundle.model.as_ref(), &prompt, &args)?;
        baseline.get_or_insert((name.clone(), speeds));
    }
    if args.hybrid_blocks > 0 {
        let path = crate::random_hybrid::path(args.hybrid_blocks)?;
        let model = spindle_models::load_gguf(&path)?.model;
        let vocab = model.config().vocab_size as u32;
        // Random weights: any fixed token sequence serves.
        let prompt: Vec<u32> = (0..args.prompt_tokens as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let name = format!("qwen3.5-moe shape, {} layers", 4 * args.hybrid_blocks);
        let speeds = report(&name, model.as_ref(), &prompt, &args)?;
        if let Some((base, b)) = &baseline {
            println!("{name} / {base}: prefill {:.2}x, decode {:.2}x", speeds.prefill / b.prefill, speeds.decode / b.decode);
        }
    }
    Ok(())
}

fn report(name: &str, model: &dyn CausalLm, prompt: &[u32], args: &BenchArgs) -> anyhow::Result<Speeds> {
    let runs = (0..args.repeats.max(1)).map(|_| measure(model, prompt, args.decode_tokens)).collect::<anyhow::Result<Vec<_>>>()?;
    let (prefill, prefill_text) = summary(runs.iter().map(GenerationStats::prefill_tokens_per_second).collect());
    let (decode, decode_text) = summary(runs.iter().map(GenerationStats::decode_tokens_per_second).collect());
    println!("{name:<34} {prefill_text:>28} {decode_text:>28}");
    Ok(Speeds { prefill, decode })
}

/// Natural text cut to exactly `len` tokens.
fn bench_prompt(bundle: &ModelBundle, len: usize) -> anyhow::Result<Vec<u32>> {
    let paragraph = "The quick brown fox jumps over the lazy dog while the scheduler decides which request runs next. ";
    let mut ids = bundle.tokenizer.encode(&paragraph.repeat(len / 8 + 1), true)?;
    ids.truncate(len);
    Ok(ids)
}

fn measure(model: &dyn CausalLm, prompt: &[u32], decode_tokens: usize) -> anyhow::Result<GenerationStats> {
    let request = GenerationRequest {
        prompt_ids: prompt,
        max_tokens: decode_tokens,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        // No stop ids: always decode the full count so runs are comparable.
        stop_ids: &[],
        context: prompt.len() + decode_tokens + 1,
    };
    Ok(spindle_runner::generate(model, &request, |_| {})?)
}

/// The median and its `med [min-max]` text.
fn summary(mut values: Vec<f64>) -> (f64, String) {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    (median, format!("{median:.1} [{:.1}-{:.1}]", values[0], values[values.len() - 1]))
}
