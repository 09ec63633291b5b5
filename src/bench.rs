//! `spindle bench`: prefill and decode speed of one or more models, as medians over repeats.

use clap::Args;
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{GenerationRequest, GenerationStats, ModelBundle};

#[derive(Args)]
pub struct BenchArgs {
    /// Models to measure (catalogue names or paths).
    #[arg(long, num_args = 1.., default_values_t = ["smollm2-135m".to_string(), "qwen2.5-coder-0.5b".to_string(), "gemma3-270m".to_string()])]
    models: Vec<String>,
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

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    crate::set_threads(Some(args.threads));
    println!("threads={} prompt={} decode={} repeats={}", args.threads, args.prompt_tokens, args.decode_tokens, args.repeats);
    println!("{:<22} {:>28} {:>28}", "model", "prefill tok/s med [min-max]", "decode tok/s med [min-max]");
    for name in &args.models {
        let files = spindle_hub::resolve(name, &spindle_hub::spindle_home(), true)?;
        let bundle = ModelBundle::load(&files)?;
        let prompt = bench_prompt(&bundle, args.prompt_tokens)?;
        let runs = (0..args.repeats.max(1))
            .map(|_| measure(&bundle, &prompt, args.decode_tokens))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let prefill = summary(runs.iter().map(GenerationStats::prefill_tokens_per_second).collect());
        let decode = summary(runs.iter().map(GenerationStats::decode_tokens_per_second).collect());
        println!("{name:<22} {prefill:>28} {decode:>28}");
    }
    Ok(())
}

/// Natural text cut to exactly `len` tokens.
fn bench_prompt(bundle: &ModelBundle, len: usize) -> anyhow::Result<Vec<u32>> {
    let paragraph = "The quick brown fox jumps over the lazy dog while the scheduler decides which request runs next. ";
    let mut ids = bundle.tokenizer.encode(&paragraph.repeat(len / 8 + 1), true)?;
    ids.truncate(len);
    Ok(ids)
}

fn measure(bundle: &ModelBundle, prompt: &[u32], decode_tokens: usize) -> anyhow::Result<GenerationStats> {
    let request = GenerationRequest {
        prompt_ids: prompt,
        max_tokens: decode_tokens,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        // No stop ids: always decode the full count so runs are comparable.
        stop_ids: &[],
        context: prompt.len() + decode_tokens + 1,
    };
    Ok(spindle_runner::generate(bundle.model.as_ref(), &request, |_| {})?)
}

fn summary(mut values: Vec<f64>) -> String {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    format!("{median:.1} [{:.1}-{:.1}]", values[0], values[values.len() - 1])
}
