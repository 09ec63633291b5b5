//! `spindle generate`: one prompt through the serving engine, streamed to stdout, then a line of
//! statistics.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use spindle_chat::TemplateInput;
use spindle_runner::model_sampling::ThinkingMode;
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{single_sequence_cache, Engine, EngineConfig, ModelBundle, SequenceRequest};
use spindle_server::sampling_defaults::SamplingDefaults;

use crate::sampling_flags::SamplingFlags;

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

/// Sampling: the flags a model's files may publish go over the model's values (see
/// [`SamplingFlags`]); the penalties and the seed are generate's own.
#[derive(Args)]
pub struct SamplingArgs {
    #[command(flatten)]
    published: SamplingFlags,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
}

impl SamplingArgs {
    fn params(&self, defaults: &SamplingDefaults) -> SamplingParams {
        SamplingParams {
            temperature: defaults.temperature.value,
            top_k: defaults.top_k.value,
            top_p: defaults.top_p.value,
            min_p: defaults.min_p.value,
            repetition_penalty: defaults.repetition_penalty.value,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            top_logprobs: None,
        }
    }
}

/// Whether the answer thinks: a chat prompt does unless `enable_thinking` is false (a model
/// without a thinking preset has the same values either way); a raw prompt does not.
fn thinking_mode(
    args: &GenerateArgs,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> ThinkingMode {
    match args.chat && extra.get("enable_thinking") != Some(&serde_json::Value::Bool(false)) {
        true => ThinkingMode::Thinking,
        false => ThinkingMode::NonThinking,
    }
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    crate::set_threads(args.threads);
    let extra = template_kwargs(&args)?;
    let files = spindle_hub::resolve(
        &args.model,
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )?;
    // Flags are checked before the weights are read.
    let flags = args.sampling.published.preset()?;
    let bundle = Arc::new(crate::memory::returning_freed_memory(|| ModelBundle::load(&files))?);
    let mode = thinking_mode(&args, &extra);
    let defaults = SamplingDefaults::resolve(&flags, &bundle.sampling, mode);
    let sampling = args.sampling.params(&defaults);
    sampling.validate().context("the model's published sampling settings")?;
    let request = SequenceRequest {
        stop_ids: bundle.tokenizer.eos_token_ids().to_vec(),
        ..SequenceRequest::plain(
            prompt_ids(&bundle, &args, &extra)?,
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
    // After the run, so that a request refused (a prompt over the context) prints only why.
    eprintln!("sampling: {}", defaults.summary(bundle.sampling.source.unwrap_or("the model")));
    eprintln!(
        "prompt tokens: {}, generated tokens: {}, prefill: {:.1} tok/s, decode: {:.1} tok/s",
        stats.summary.prompt_tokens,
        stats.summary.completion_tokens,
        stats.prefill_tokens_per_second(),
        stats.decode_tokens_per_second()
    );
    Ok(())
}

/// `--chat-template-kwargs` as a JSON object (empty when absent).
fn template_kwargs(
    args: &GenerateArgs,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    match &args.chat_template_kwargs {
        Some(text) => {
            serde_json::from_str(text).context("--chat-template-kwargs is not a JSON object")
        }
        None => Ok(serde_json::Map::new()),
    }
}

fn prompt_ids(
    bundle: &ModelBundle,
    args: &GenerateArgs,
    extra: &serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<Vec<u32>> {
    if !args.chat {
        return Ok(bundle.tokenizer.encode(&args.prompt, true)?);
    }
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(serde_json::json!({"role": "system", "content": system}));
    }
    messages.push(serde_json::json!({"role": "user", "content": args.prompt}));
    let text = bundle.template.render(&TemplateInput {
        messages: &messages,
        tools: None,
        add_generation_prompt: true,
        extra,
    })?;
    // The template writes the BOS token itself where the model wants one.
    Ok(bundle.tokenizer.encode(&text, false)?)
}
