//! `spindle bench`: prefill and decode speed of one or more models, as medians over repeats
//! of `spindle_runner::speed` runs. With `--hybrid-blocks N` it also measures a random-weight
//! model with Qwen3.5-35B-A3B's per-layer shape, and prints its speed relative to the first
//! model measured in the same run. `--device gpu` runs them on the GPU, a hybrid's routed
//! experts placed by the placement flags as `serve` places them; with `--bandwidth-gbs` the
//! hybrid's decode is also given as a share of what its weights' bytes per token allow.

use std::sync::Arc;

use clap::Args;
use spindle_gpu::{Gpu, ModelBytes, Placement, PlacementRequest};
use spindle_hub::ModelFiles;
use spindle_runner::speed::{self, SpeedRun, Speeds};
use spindle_runner::ModelBundle;

use crate::bench_roofline::TokenBytes;
use crate::device_flag::{load_on_gpu, plan_placement, DeviceChoice};
use crate::placement_flags::{placement_line, PlacementFlags};

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
    /// Where the models run: cpu, gpu or gpu:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    #[command(flatten)]
    placement: PlacementFlags,
    /// The device's memory bandwidth in GB/s (H200: 4800): the hybrid's decode is then also
    /// printed as a share of the rate its bytes read per token allow.
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
    /// The host's memory bandwidth in GB/s, for the routed experts left in system RAM.
    #[arg(long)]
    host_bandwidth_gbs: Option<f64>,
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
    let gpu = crate::device_flag::open(args.device)?;
    if let Some(gpu) = &gpu {
        println!("GPU {}", gpu.adapter());
    }
    let request = args.placement.request(gpu.is_some(), 0, args.concurrent)?;
    let on = Device { gpu, request };
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
        let bundle = Arc::new(crate::memory::returning_freed_memory(|| on.bundle(&files))?);
        let prompt = bench_prompt(&bundle, speed_run(&args).text_tokens())?;
        let speeds = report(name, &bundle, &prompt, &args)?;
        baseline.get_or_insert((name.clone(), speeds));
    }
    if args.hybrid_blocks > 0 {
        let path = crate::random_hybrid::path(args.hybrid_blocks)?;
        let (model, placement) = on.random_hybrid(&path)?;
        let vocab = model.config().vocab_size as u32;
        // Random weights: any fixed token sequence serves.
        let prompt: Vec<u32> =
            (0..speed_run(&args).text_tokens() as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let bundle = Arc::new(with_default_tokenizer(model)?);
        let name = format!("qwen3.5-moe shape, {} layers", 4 * args.hybrid_blocks);
        let speeds = report(&name, &bundle, &prompt, &args)?;
        if let (Some(placement), Some(gbs)) = (&placement, args.bandwidth_gbs) {
            let (cfg, weights) = spindle_models::open_hybrid(&path)?;
            let bytes = ModelBytes::of_hybrid(&cfg, &weights);
            let routing = (cfg.num_experts_per_tok, cfg.num_experts);
            let token = TokenBytes::of(&bytes, placement, routing);
            let roofline = token.roofline(gbs, args.host_bandwidth_gbs);
            println!(
                "{name}: decode reads {:.1} MiB a token on the device, {:.1} MiB in system RAM; \
                 the bandwidths allow {roofline:.1} tok/s, measured {:.0}% of it",
                token.device / (1 << 20) as f64,
                token.host / (1 << 20) as f64,
                100.0 * speeds.decode / roofline
            );
        }
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
        .map(|_| speed::measure(bundle, prompt, &speed_run(args)))
        .collect::<Result<Vec<_>, _>>()?;
    let (prefill, prefill_text) = summary(runs.iter().map(|run| run.prefill).collect());
    let (decode, decode_text) = summary(runs.iter().map(|run| run.decode).collect());
    println!("{name:<34} {prefill_text:>28} {decode_text:>28}");
    Ok(Speeds { prefill, decode })
}

/// Where the models load: the CPU, or a GPU with the placement asked for.
struct Device {
    gpu: Option<Arc<Gpu>>,
    request: PlacementRequest,
}

impl Device {
    /// The model of `files` with its tokenizer.
    fn bundle(&self, files: &ModelFiles) -> anyhow::Result<ModelBundle> {
        match &self.gpu {
            None => Ok(ModelBundle::load(files)?),
            Some(gpu) => {
                let placement = self.placed(gpu, files)?;
                Ok(ModelBundle::load_with(files, |f| load_on_gpu(gpu, f, placement.as_ref()))?)
            }
        }
    }

    /// The random-weight hybrid at `path`, and on a GPU its placement.
    fn random_hybrid(
        &self,
        path: &std::path::Path,
    ) -> anyhow::Result<(Box<dyn spindle_models::CausalLm>, Option<Placement>)> {
        let Some(gpu) = &self.gpu else { return Ok((spindle_models::load_gguf(path)?, None)) };
        let files = ModelFiles::Gguf(path.to_path_buf());
        let placement = self.placed(gpu, &files)?;
        Ok((load_on_gpu(gpu, &files, placement.as_ref())?, placement))
    }

    /// The placement of a hybrid of `files` on `gpu` (printed), `None` for a dense model.
    fn placed(&self, gpu: &Gpu, files: &ModelFiles) -> anyhow::Result<Option<Placement>> {
        let placement = plan_placement(gpu, files, &self.request)?;
        if let Some(placement) = &placement {
            println!("{}", placement_line(placement));
        }
        Ok(placement)
    }
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
fn speed_run(args: &BenchArgs) -> SpeedRun {
    SpeedRun {
        prompt_tokens: args.prompt_tokens,
        decode_tokens: args.decode_tokens,
        depth: args.depth,
        concurrent: args.concurrent,
    }
}

/// The median and its `med [min-max]` text.
fn summary(mut values: Vec<f64>) -> (f64, String) {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    (median, format!("{median:.1} [{:.1}-{:.1}]", values[0], values[values.len() - 1]))
}
