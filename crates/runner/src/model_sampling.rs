//! The sampling settings a model's authors publish with it: a GGUF header's `general.sampling.*`
//! keys (llama.cpp's converter fills them from `generation_config.json`) or a safetensors
//! folder's `generation_config.json`. Only the parameters the sampler implements are taken
//! (temperature, top-k, top-p, min-p, repetition penalty); any other sampling key is listed as
//! ignored, by name, so the load can say so.
//!
//! Thinking models publish one preset for thinking and another without (Qwen3.5: 0.6 / 0.95 /
//! 20 thinking, 0.7 / 0.8 / 20 not). No file format names them yet, so Spindle reads them under
//! its own names beside the general values: `general.sampling.thinking.*` and
//! `general.sampling.non_thinking.*` in GGUF, `"thinking": {...}` and `"non_thinking": {...}`
//! objects in `generation_config.json`; a mode's value wins over the general one.

use std::path::Path;

use serde_json::Value;
use spindle_chat::{read_gguf_keys, ChatError, GgufMetadata};
use spindle_hub::ModelFiles;

/// The prefix of the GGUF keys read here.
pub const GGUF_SAMPLING_PREFIX: &str = "general.sampling.";

/// Sampling values one source sets; `None` leaves the parameter to the next source.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingPreset {
    pub temperature: Option<f32>,
    /// 0: no limit.
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl SamplingPreset {
    /// This preset's values, and `fallback`'s where this one sets none.
    pub fn or(self, fallback: &Self) -> Self {
        Self {
            temperature: self.temperature.or(fallback.temperature),
            top_k: self.top_k.or(fallback.top_k),
            top_p: self.top_p.or(fallback.top_p),
            min_p: self.min_p.or(fallback.min_p),
            repetition_penalty: self.repetition_penalty.or(fallback.repetition_penalty),
        }
    }

    /// Sets the parameter Spindle calls `name` from a number; false when the name is not one
    /// Spindle implements or the value is out of its range (the preset is then unchanged).
    fn set(&mut self, name: &str, value: f64) -> bool {
        let probability = (0.0..=1.0).contains(&value).then_some(value as f32);
        match name {
            "temperature" => {
                put(&mut self.temperature, (0.0..=2.0).contains(&value).then_some(value as f32))
            }
            // llama.cpp's `<= 0` and vLLM's -1 both mean no limit.
            "top_k" => put(&mut self.top_k, Some(if value >= 1.0 { value as usize } else { 0 })),
            "top_p" => put(&mut self.top_p, probability.filter(|&p| p > 0.0)),
            "min_p" => put(&mut self.min_p, probability),
            "repetition_penalty" => {
                put(&mut self.repetition_penalty, (value > 0.0).then_some(value as f32))
            }
            _ => false,
        }
    }
}

/// Stores `value` in `slot` when there is one; whether it did.
fn put<T>(slot: &mut Option<T>, value: Option<T>) -> bool {
    let taken = value.is_some();
    if taken {
        *slot = value;
    }
    taken
}

/// Which mode a request's answer runs in: thinking models publish a preset for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkingMode {
    Thinking,
    NonThinking,
}

/// What a model's files say about sampling.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelSampling {
    /// Values for every mode.
    pub general: SamplingPreset,
    pub thinking: SamplingPreset,
    pub non_thinking: SamplingPreset,
    /// Where they were read (`general.sampling.*` or `generation_config.json`); `None` when the
    /// model's files set none.
    pub source: Option<&'static str>,
    /// Sampling keys the files set that Spindle does not implement or whose value is out of
    /// range, as the files name them.
    pub ignored: Vec<String>,
}

impl ModelSampling {
    /// The preset for answers in `mode`: the mode's own values over the general ones.
    pub fn preset(&self, mode: ThinkingMode) -> SamplingPreset {
        let own = match mode {
            ThinkingMode::Thinking => self.thinking,
            ThinkingMode::NonThinking => self.non_thinking,
        };
        own.or(&self.general)
    }

    /// What `files` publish, read from the GGUF header or `generation_config.json` alone (no
    /// weights, no tokenizer): `/v1/models` shows it for models not loaded yet.
    pub fn read(files: &ModelFiles) -> Result<Self, ChatError> {
        Ok(match files {
            ModelFiles::Gguf(path) => {
                Self::from_gguf(&read_gguf_keys(path, &[GGUF_SAMPLING_PREFIX])?)
            }
            ModelFiles::Safetensors { dir } => Self::from_generation_config(dir),
        })
    }

    /// Reads the `general.sampling.*` keys of a GGUF header (the keys of other groups are
    /// skipped).
    pub fn from_gguf(meta: &GgufMetadata) -> Self {
        let mut sampling = Self::default();
        let mut keys: Vec<_> =
            meta.keys().filter_map(|k| k.strip_prefix(GGUF_SAMPLING_PREFIX)).collect();
        // Ignored keys are reported in a stable order.
        keys.sort_unstable();
        for key in keys {
            let value = &meta[&format!("{GGUF_SAMPLING_PREFIX}{key}")];
            let number = value.as_f32().map(f64::from).or_else(|| value.as_i32().map(f64::from));
            let (preset, name) = match key.split_once('.') {
                Some(("thinking", name)) => (&mut sampling.thinking, name),
                Some(("non_thinking", name)) => (&mut sampling.non_thinking, name),
                _ => (&mut sampling.general, key),
            };
            let taken = gguf_name(name).zip(number).is_some_and(|(n, v)| preset.set(n, v));
            if !taken {
                sampling.ignored.push(format!("{GGUF_SAMPLING_PREFIX}{key}"));
            }
        }
        sampling.source = sampling.sets_any().then_some("general.sampling.*");
        sampling
    }

    /// Reads `generation_config.json` in `dir`; a folder without one sets nothing, and one that
    /// is not a JSON object is reported as ignored (the model still loads).
    pub fn from_generation_config(dir: &Path) -> Self {
        let mut sampling = Self::default();
        let Ok(text) = std::fs::read_to_string(dir.join(GENERATION_CONFIG)) else {
            return sampling;
        };
        let Ok(Value::Object(config)) = serde_json::from_str::<Value>(&text) else {
            sampling.ignored.push(format!("{GENERATION_CONFIG} (not a JSON object)"));
            return sampling;
        };
        for (key, value) in &config {
            let mode = match (key.as_str(), value) {
                ("thinking", Value::Object(mode)) => Some((mode, &mut sampling.thinking)),
                ("non_thinking", Value::Object(mode)) => Some((mode, &mut sampling.non_thinking)),
                _ => None,
            };
            match mode {
                Some((entries, preset)) => {
                    for (name, value) in entries {
                        if !read_json_value(preset, name, value) {
                            sampling.ignored.push(format!("{key}.{name}"));
                        }
                    }
                }
                None if NOT_SAMPLING.contains(&key.as_str()) => {}
                None => {
                    if !read_json_value(&mut sampling.general, key, value) {
                        sampling.ignored.push(key.clone());
                    }
                }
            }
        }
        sampling.source = sampling.sets_any().then_some(GENERATION_CONFIG);
        sampling
    }

    fn sets_any(&self) -> bool {
        [self.general, self.thinking, self.non_thinking]
            .iter()
            .any(|p| *p != SamplingPreset::default())
    }
}

const GENERATION_CONFIG: &str = "generation_config.json";

/// Keys of `generation_config.json` that are not sampling settings: token ids and lengths
/// (the tokenizer and the request say those), and the writer's own bookkeeping.
const NOT_SAMPLING: [&str; 8] = [
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "transformers_version",
    "_from_model_config",
    "max_length",
    "max_new_tokens",
];

/// Sets `name` in `preset` from a JSON number; false when it is not taken.
fn read_json_value(preset: &mut SamplingPreset, name: &str, value: &Value) -> bool {
    value.as_f64().is_some_and(|v| preset.set(name, v))
}

/// Spindle's name of a `general.sampling.*` key llama.cpp writes, where the sampler implements
/// it (`penalty_last_n`, `sequence`, `xtc_*` and `mirostat*` it does not).
fn gguf_name(key: &str) -> Option<&'static str> {
    Some(match key {
        "temp" => "temperature",
        "top_k" => "top_k",
        "top_p" => "top_p",
        "min_p" => "min_p",
        "penalty_repeat" => "repetition_penalty",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use spindle_chat::GgufValue;

    use super::*;

    #[test]
    fn gguf_keys_spindle_implements_are_taken_and_the_rest_named() {
        let meta: GgufMetadata = [
            ("general.sampling.temp", GgufValue::Float(0.7)),
            ("general.sampling.top_k", GgufValue::Int(20)),
            ("general.sampling.top_p", GgufValue::Float(0.8)),
            ("general.sampling.penalty_last_n", GgufValue::Int(64)),
            ("general.sampling.sequence", GgufValue::String("kpt".into())),
            ("general.sampling.thinking.temp", GgufValue::Float(0.6)),
            ("general.sampling.min_p", GgufValue::Float(3.0)),
            ("tokenizer.ggml.model", GgufValue::String("gpt2".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let sampling = ModelSampling::from_gguf(&meta);
        let non_thinking = sampling.preset(ThinkingMode::NonThinking);
        assert_eq!(non_thinking.temperature, Some(0.7));
        assert_eq!(non_thinking.top_k, Some(20));
        assert_eq!(non_thinking.top_p, Some(0.8));
        assert_eq!(non_thinking.min_p, None, "3.0 is out of range");
        assert_eq!(sampling.preset(ThinkingMode::Thinking).temperature, Some(0.6));
        assert_eq!(sampling.source, Some("general.sampling.*"));
        assert_eq!(
            sampling.ignored,
            [
                "general.sampling.min_p",
                "general.sampling.penalty_last_n",
                "general.sampling.sequence"
            ]
        );
    }

    #[test]
    fn generation_config_sets_modes_and_skips_token_ids() {
        let dir = tempfile::tempdir().unwrap();
        let config = r#"{"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": true,
            "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
            "thinking": {"temperature": 0.6, "top_p": 0.95, "typical_p": 0.9}}"#;
        std::fs::write(dir.path().join(GENERATION_CONFIG), config).unwrap();
        let sampling = ModelSampling::from_generation_config(dir.path());
        let thinking = sampling.preset(ThinkingMode::Thinking);
        assert_eq!(
            (thinking.temperature, thinking.top_p, thinking.top_k),
            (Some(0.6), Some(0.95), Some(20))
        );
        let plain = sampling.preset(ThinkingMode::NonThinking);
        assert_eq!((plain.temperature, plain.repetition_penalty), (Some(0.7), Some(1.05)));
        assert_eq!(sampling.ignored, ["do_sample", "thinking.typical_p"]);
        assert_eq!(sampling.source, Some(GENERATION_CONFIG));
    }

    #[test]
    fn a_folder_without_generation_config_sets_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ModelSampling::from_generation_config(dir.path()), ModelSampling::default());
        std::fs::write(dir.path().join(GENERATION_CONFIG), "[1]").unwrap();
        let sampling = ModelSampling::from_generation_config(dir.path());
        assert_eq!(sampling.ignored, ["generation_config.json (not a JSON object)"]);
        assert_eq!(sampling.source, None);
    }
}
