//! `spindle generate`: one prompt through the serving engine, streamed to stdout, then a line of
//! statistics.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use spindle_chat::TemplateInput;
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{single_sequence_cache, Engine, EngineConfig, ModelBundle, SequenceRequest};

#[derive(Args)]
pub struct GenerateArgs {
    /// Catalogue name, .gguf file, or folder with config.json + safetensors + tokenizer.json.
    #[arg(long, default_value = spindle_hub::DEFAULT_MODEL)]
    model: String,
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    system: Option<String>,
    /// Extra chat template variables as JSON, e.g. '{"enable_thinking": false}'.
    #[arg(long)]
    chat_template_kwargs: Option<String>,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// CPU threads for the kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Context size in tokens (prompt + generation).
    #[arg(long, default_value_t = 4096)]
    ctx_size: usize,
}

#[derive(Args)]
pub struct SamplingArgs {
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 disables.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
}

impl SamplingArgs {
    fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            top_logprobs: None,
        }
    }
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    crate::set_threads(args.threads);
    let sampling = args.sampling.params();
    sampling.validate()?;
    let files = spindle_hub::resolve(
        &args.model,
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )?;
    let bundle = Arc::new(crate::memory::returning_freed_memory(|| ModelBundle::load(&files))?);
    let request = SequenceRequest {
        stop_ids: bundle.tokenizer.eos_token_ids().to_vec(),
        ..SequenceRequest::plain(
            prompt_ids(&bundle, &args)?,
            args.max_tokens,
            sampling,
            args.ctx_size,
        )
    };
    // The engine `serve` runs, for this one sequence.
    let engine = Engine::start(
        bundle.clone(),
        EngineConfig::new(1, single_sequence_cache(&bundle, args.ctx_size)),
    );
    let mut out = std::io::stdout().lock();
    let stats = engine.generate(request, |_, text| {
        // A closed stdout (e.g. `| head`) must not abort generation with a panic.
        let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
    })?;
    let _ = writeln!(out, "{}", stats.summary.tail.content);
    eprintln!(
        "prompt tokens: {}, generated tokens: {}, prefill: {:.1} tok/s, decode: {:.1} tok/s",
        stats.summary.prompt_tokens,
        stats.summary.completion_tokens,
        stats.prefill_tokens_per_second(),
        stats.decode_tokens_per_second()
    );
    Ok(())
}

fn prompt_ids(bundle: &ModelBundle, args: &GenerateArgs) -> anyhow::Result<Vec<u32>> {
    if !args.chat {
        return Ok(bundle.tokenizer.encode(&args.prompt, true)?);
    }
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(serde_json::json!({"role": "system", "content": system}));
    }
    messages.push(serde_json::json!({"role": "user", "content": args.prompt}));
    let extra = match &args.chat_template_kwargs {
        Some(text) => {
            serde_json::from_str(text).context("--chat-template-kwargs is not a JSON object")?
        }
        None => serde_json::Map::new(),
    };
    let text = bundle.template.render(&TemplateInput {
        messages: &messages,
        tools: None,
        add_generation_prompt: true,
        extra: &extra,
    })?;
    // The template writes the BOS token itself where the model wants one.
    Ok(bundle.tokenizer.encode(&text, false)?)
}
