//! The sampling flags of `spindle serve` (the defaults of a request that leaves a parameter out)
//! and `spindle generate` (its one request's values), checked against the ranges a request's own
//! fields have.

use clap::Args;
use spindle_runner::model_sampling::SamplingPreset;

/// The sampling settings a model's files may publish, as flags that go over the model's own
/// (`general.sampling.*` in a GGUF, `generation_config.json` beside safetensors) and Spindle's
/// built-in ones (temperature 1, no filters, no penalty); serve's are the defaults of requests
/// that leave a parameter out.
#[derive(Args)]
pub struct SamplingFlags {
    /// Temperature, 0 to 2 (0: greedy).
    #[arg(long)]
    temperature: Option<f32>,
    /// Top-k (0: no limit).
    #[arg(long)]
    top_k: Option<u32>,
    /// Nucleus mass, in (0, 1].
    #[arg(long)]
    top_p: Option<f32>,
    /// Min-p, 0 to 1.
    #[arg(long)]
    min_p: Option<f32>,
    /// Repetition penalty (> 0; 1: none).
    #[arg(long, alias = "repetition-penalty")]
    repeat_penalty: Option<f32>,
}

impl SamplingFlags {
    /// The flags as a preset, each checked against the range a request's field has.
    pub fn preset(&self) -> anyhow::Result<SamplingPreset> {
        let as_request = spindle_api::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k.map(|k| k.min(i32::MAX as u32) as i32),
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            ..Default::default()
        };
        if let Err(e) = as_request.validate() {
            let flag = e.param.as_deref().map_or("a sampling flag".into(), |p| match p {
                "repetition_penalty" => "--repeat-penalty".to_string(),
                other => format!("--{}", other.replace('_', "-")),
            });
            anyhow::bail!("{flag}: {}", e.message);
        }
        Ok(SamplingPreset {
            temperature: self.temperature,
            top_k: self.top_k.map(|k| k as usize),
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
        })
    }
}
