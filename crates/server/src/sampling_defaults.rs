//! The sampling a request gets for each parameter it leaves out, and where that value comes
//! from. Precedence, highest first: the request's own field, the server's flag
//! (`--temperature`, `--top-k`, `--top-p`, `--min-p`, `--repeat-penalty`), the model's files
//! (their preset for the answer's thinking mode, see `spindle_runner::model_sampling`), and
//! Spindle's built-in default (OpenAI's: temperature 1, no filters, no penalty). The startup
//! summary and `/v1/models` show the result.

use serde::Serialize;
use serde_json::{json, Value};
use spindle_runner::model_sampling::{ModelSampling, SamplingPreset, ThinkingMode};
use spindle_runner::sampler::SamplingParams as RunnerSampling;

/// Where a default comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DefaultSource {
    /// The server's command-line flag.
    Flag,
    /// The model's files.
    Model,
    /// Spindle's own default.
    BuiltIn,
}

/// One parameter's default and its source.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Setting<T> {
    pub value: T,
    pub source: DefaultSource,
}

/// The default of every parameter a model's files or a flag can set, for one thinking mode.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SamplingDefaults {
    pub temperature: Setting<f32>,
    /// 0: no limit.
    pub top_k: Setting<usize>,
    pub top_p: Setting<f32>,
    pub min_p: Setting<f32>,
    pub repetition_penalty: Setting<f32>,
}

impl SamplingDefaults {
    /// The defaults for answers in `mode`: each flag over the model's value over the built-in.
    pub fn resolve(flags: &SamplingPreset, model: &ModelSampling, mode: ThinkingMode) -> Self {
        let model = model.preset(mode);
        let built_in = RunnerSampling::default();
        Self {
            temperature: pick(flags.temperature, model.temperature, built_in.temperature),
            top_k: pick(flags.top_k, model.top_k, built_in.top_k),
            top_p: pick(flags.top_p, model.top_p, built_in.top_p),
            min_p: pick(flags.min_p, model.min_p, built_in.min_p),
            repetition_penalty: pick(
                flags.repetition_penalty,
                model.repetition_penalty,
                built_in.repetition_penalty,
            ),
        }
    }

    /// `temperature 0.7 (generation_config.json), top_k 20 (--top-k), …`: each value and where
    /// it came from, the model's files named by `model_source`.
    pub fn summary(&self, model_source: &str) -> String {
        let named = |name: &str, flag: &str, value: String, source: DefaultSource| {
            let from = match source {
                DefaultSource::Flag => flag,
                DefaultSource::Model => model_source,
                DefaultSource::BuiltIn => "built-in",
            };
            format!("{name} {value} ({from})")
        };
        let s = self;
        [
            named(
                "temperature",
                "--temperature",
                s.temperature.value.to_string(),
                s.temperature.source,
            ),
            named("top_k", "--top-k", s.top_k.value.to_string(), s.top_k.source),
            named("top_p", "--top-p", s.top_p.value.to_string(), s.top_p.source),
            named("min_p", "--min-p", s.min_p.value.to_string(), s.min_p.source),
            named(
                "repetition_penalty",
                "--repeat-penalty",
                s.repetition_penalty.value.to_string(),
                s.repetition_penalty.source,
            ),
        ]
        .join(", ")
    }
}

fn pick<T>(flag: Option<T>, model: Option<T>, built_in: T) -> Setting<T> {
    match (flag, model) {
        (Some(value), _) => Setting { value, source: DefaultSource::Flag },
        (None, Some(value)) => Setting { value, source: DefaultSource::Model },
        (None, None) => Setting { value: built_in, source: DefaultSource::BuiltIn },
    }
}

/// The defaults of both modes as `/v1/models` shows them: `{"non_thinking": {"temperature":
/// {"value": 0.7, "source": "model"}, …}, "thinking": {…}}`.
pub fn card(flags: &SamplingPreset, model: &ModelSampling) -> Value {
    let mode = |mode| serde_json::to_value(SamplingDefaults::resolve(flags, model, mode));
    json!({
        "non_thinking": mode(ThinkingMode::NonThinking).unwrap_or_default(),
        "thinking": mode(ThinkingMode::Thinking).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_beats_the_model_which_beats_the_built_in() {
        let flags = SamplingPreset { top_p: Some(0.5), ..Default::default() };
        let model = ModelSampling {
            general: SamplingPreset {
                temperature: Some(0.7),
                top_p: Some(0.8),
                ..Default::default()
            },
            thinking: SamplingPreset { temperature: Some(0.6), ..Default::default() },
            source: Some("generation_config.json"),
            ..Default::default()
        };
        let plain = SamplingDefaults::resolve(&flags, &model, ThinkingMode::NonThinking);
        assert_eq!(plain.temperature, Setting { value: 0.7, source: DefaultSource::Model });
        assert_eq!(plain.top_p, Setting { value: 0.5, source: DefaultSource::Flag });
        assert_eq!(plain.top_k, Setting { value: 0, source: DefaultSource::BuiltIn });
        let thinking = SamplingDefaults::resolve(&flags, &model, ThinkingMode::Thinking);
        assert_eq!(thinking.temperature.value, 0.6);
        assert_eq!(
            plain.summary("generation_config.json"),
            "temperature 0.7 (generation_config.json), top_k 0 (built-in), top_p 0.5 (--top-p), \
             min_p 0 (built-in), repetition_penalty 1 (built-in)"
        );
    }
}
