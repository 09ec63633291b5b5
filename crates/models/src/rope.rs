//! RoPE frequency scaling, read from an HF config (`rope_scaling` / `rope_parameters`) or a GGUF
//! header (`{arch}.rope.scaling.*`), and the inverse frequencies it gives.

use std::collections::HashMap;
use std::f64::consts::PI;

use candle_core::quantized::gguf_file::Value;

use crate::error::{ModelError, Result};
use crate::gguf_metadata::{meta_f64, meta_usize};

/// How rotary frequencies are stretched beyond the pretraining context.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions are divided by the factor.
    Linear(f64),
    /// YaRN (arXiv 2309.00071): low frequencies interpolated, high ones kept, a linear ramp
    /// between, and cos/sin multiplied by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_positions: usize,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
}

impl RopeScaling {
    /// Reads one HF rope dictionary (`rope_scaling`, or `rope_parameters` / one of its per-layer
    /// entries). `max_positions` stands in for an absent `original_max_position_embeddings`.
    pub fn from_hf(rope: &serde_json::Value, max_positions: usize) -> Result<Self> {
        let f = |k: &str| rope.get(k).and_then(|v| v.as_f64());
        let kind = rope
            .get("rope_type")
            .or(rope.get("type"))
            .and_then(|t| t.as_str())
            .unwrap_or("default");
        match kind {
            "default" => Ok(Self::None),
            "linear" => Ok(Self::Linear(f("factor").unwrap_or(1.0))),
            // The stated factor wins over max_position_embeddings / original, as in transformers
            // 5.24 (earlier versions took the ratio), vLLM and llama.cpp.
            "yarn" => {
                let factor = f("factor").ok_or_else(|| {
                    ModelError::BadConfig("yarn rope scaling has no factor".into())
                })?;
                let original =
                    f("original_max_position_embeddings").map_or(max_positions, |n| n as usize);
                let (mscale, mscale_all_dim) = (f("mscale"), f("mscale_all_dim"));
                let attention_factor =
                    f("attention_factor").unwrap_or(match (mscale, mscale_all_dim) {
                        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                            yarn_mscale(factor, m) / yarn_mscale(factor, all)
                        }
                        _ => yarn_mscale(factor, 1.0),
                    });
                Ok(Self::Yarn {
                    factor,
                    original_max_positions: original,
                    // transformers reads these with `or`, so 0 or null also mean the default.
                    beta_fast: f("beta_fast").filter(|b| *b != 0.0).unwrap_or(32.0),
                    beta_slow: f("beta_slow").filter(|b| *b != 0.0).unwrap_or(1.0),
                    attention_factor,
                    truncate: rope.get("truncate").and_then(|t| t.as_bool()).unwrap_or(true),
                })
            }
            other => Err(ModelError::BadConfig(format!(
                "rope type '{other}' is not supported (supported: default, linear, yarn)"
            ))),
        }
    }

    /// Reads `{arch}.rope.scaling.*` as llama.cpp's converter writes them.
    pub fn from_gguf(
        meta: &HashMap<String, Value>,
        arch: &str,
        max_positions: usize,
    ) -> Result<Self> {
        let key = |k: &str| format!("{arch}.rope.scaling.{k}");
        let factor = meta_f64(meta, &key("factor")).unwrap_or(1.0);
        match meta.get(&key("type")) {
            None => Ok(Self::None),
            Some(Value::String(t)) if t == "none" => Ok(Self::None),
            Some(Value::String(t)) if t == "linear" => Ok(Self::Linear(factor)),
            Some(Value::String(t)) if t == "yarn" => Ok(Self::Yarn {
                factor,
                original_max_positions: meta_usize(meta, &key("original_context_length"))
                    .unwrap_or(max_positions),
                beta_fast: meta_f64(meta, &format!("{arch}.rope.scaling.yarn_beta_fast"))
                    .unwrap_or(32.0),
                beta_slow: meta_f64(meta, &format!("{arch}.rope.scaling.yarn_beta_slow"))
                    .unwrap_or(1.0),
                attention_factor: meta_f64(meta, &key("attn_factor"))
                    .unwrap_or_else(|_| yarn_mscale(factor, 1.0)),
                truncate: true,
            }),
            Some(Value::String(other)) => Err(ModelError::BadConfig(format!(
                "rope scaling type '{other}' is not supported (supported: none, linear, yarn)"
            ))),
            Some(other) => {
                Err(ModelError::BadConfig(format!("rope.scaling.type is not a string: {other:?}")))
            }
        }
    }

    /// Inverse frequencies of the `dim` rotating dimensions (one per pair) and the factor cos/sin
    /// are multiplied by; follows transformers' `_compute_*_parameters`.
    pub fn inv_freq(&self, dim: usize, theta: f64) -> (Vec<f64>, f64) {
        let pos_freqs: Vec<f64> =
            (0..dim / 2).map(|i| theta.powf(2.0 * i as f64 / dim as f64)).collect();
        match *self {
            Self::None => (pos_freqs.iter().map(|p| 1.0 / p).collect(), 1.0),
            Self::Linear(factor) => (pos_freqs.iter().map(|p| 1.0 / p / factor).collect(), 1.0),
            Self::Yarn {
                factor,
                original_max_positions,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                // The dimension (fractional) at which a wavelength makes `rotations` turns over the
                // original context.
                let correction_dim = |rotations: f64| {
                    dim as f64 * (original_max_positions as f64 / (rotations * 2.0 * PI)).ln()
                        / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
                if low == high {
                    high += 0.001;
                }
                let inv_freq = pos_freqs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let extrapolation = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        (1.0 / (factor * p)) * (1.0 - extrapolation) + (1.0 / p) * extrapolation
                    })
                    .collect();
                (inv_freq, attention_factor)
            }
        }
    }
}

/// YaRN's attention temperature: `0.1·m·ln(s) + 1`, 1 when not stretched.
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<RopeScaling> {
        RopeScaling::from_hf(&serde_json::from_str(json).unwrap(), 4096)
    }

    #[test]
    fn yarn_defaults_follow_transformers() {
        let yarn =
            parse(r#"{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32}"#)
                .unwrap();
        let RopeScaling::Yarn {
            beta_fast,
            beta_slow,
            attention_factor,
            original_max_positions,
            ..
        } = yarn
        else {
            panic!("{yarn:?}")
        };
        assert_eq!((beta_fast, beta_slow, original_max_positions), (32.0, 1.0, 32));
        assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        let given = parse(r#"{"type":"yarn","factor":4.0,"attention_factor":1.5}"#).unwrap();
        assert!(matches!(
            given,
            RopeScaling::Yarn { attention_factor: 1.5, original_max_positions: 4096, .. }
        ));
    }

    #[test]
    fn yarn_keeps_high_frequencies_and_interpolates_low_ones() {
        let plain = RopeScaling::None.inv_freq(64, 10_000.0).0;
        let (yarn, scale) = RopeScaling::Yarn {
            factor: 4.0,
            original_max_positions: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.2,
            truncate: true,
        }
        .inv_freq(64, 10_000.0);
        assert_eq!(scale, 1.2);
        assert_eq!(yarn[0], plain[0]);
        assert!((yarn[31] - plain[31] / 4.0).abs() < 1e-15);
        assert!(
            yarn[20] < plain[20] && yarn[20] > plain[20] / 4.0,
            "{} vs {}",
            yarn[20],
            plain[20]
        );
    }

    #[test]
    fn gguf_yarn_keys_are_read() {
        let mut meta = HashMap::new();
        meta.insert("qwen2.rope.scaling.type".to_string(), Value::String("yarn".into()));
        meta.insert("qwen2.rope.scaling.factor".to_string(), Value::F32(4.0));
        meta.insert("qwen2.rope.scaling.original_context_length".to_string(), Value::U32(32768));
        let yarn = RopeScaling::from_gguf(&meta, "qwen2", 131072).unwrap();
        assert!(
            matches!(
                yarn,
                RopeScaling::Yarn {
                    factor: 4.0,
                    original_max_positions: 32768,
                    beta_fast: 32.0,
                    ..
                }
            ),
            "{yarn:?}"
        );
        meta.insert("qwen2.rope.scaling.attn_factor".to_string(), Value::F32(1.5));
        assert!(matches!(
            RopeScaling::from_gguf(&meta, "qwen2", 131072).unwrap(),
            RopeScaling::Yarn { attention_factor: 1.5, .. }
        ));
        meta.insert("qwen2.rope.scaling.type".to_string(), Value::String("longrope".into()));
        let err = RopeScaling::from_gguf(&meta, "qwen2", 131072).unwrap_err();
        assert!(err.to_string().contains("'longrope'"), "{err}");
    }

    #[test]
    fn unknown_rope_type_is_named() {
        let err = parse(r#"{"rope_type":"longrope","factor":4.0}"#).unwrap_err();
        assert!(err.to_string().contains("'longrope'"), "{err}");
    }
}
