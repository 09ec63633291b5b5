//! Architecture-independent hyper-parameters, read from a GGUF header or an HF `config.json`.
//!
//! Field names follow HF `config.json`; the GGUF keys they come from are the ones llama.cpp
//! writes (`{arch}.block_count`, `{arch}.attention.head_count`, ...).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use serde::Deserialize;

use crate::error::{ModelError, Result};
use crate::gguf_metadata::{meta_f64, meta_str, meta_usize};
use crate::rope::RopeScaling;

/// The largest head dimension accepted. Released models use 64 to 512; RoPE frequency tables
/// are sized from it before any weight is read, so a damaged config's 2^32 would be allocated.
pub(crate) const MAX_HEAD_DIM: usize = 4096;

/// The most values per token all heads of one attention projection may have. The largest
/// released models have 16K-32K (128 heads of 128, q and gate together); shapes and KV caches
/// are sized from the config's heads before any weight is checked, so a damaged head count
/// would overflow or be allocated.
pub(crate) const MAX_ATTENTION_WIDTH: usize = 1 << 20;

/// Refuses `heads` of `head_dim` values (times `per_head`, 2 where a head also has a gate)
/// wider than [`MAX_ATTENTION_WIDTH`].
pub(crate) fn check_attention_width(
    what: &str,
    heads: usize,
    head_dim: usize,
    per_head: usize,
) -> Result<()> {
    match heads.checked_mul(head_dim).and_then(|w| w.checked_mul(per_head)) {
        Some(width) if width <= MAX_ATTENTION_WIDTH => Ok(()),
        _ => Err(ModelError::BadConfig(format!(
            "{heads} {what} of {head_dim} values are wider than the {MAX_ATTENTION_WIDTH} any \
             model uses"
        ))),
    }
}

/// The model families this crate can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// Llama / SmolLM2 / Mistral-style decoder.
    Llama,
    /// Qwen2 / Qwen2.5: Llama plus biases on q, k, v.
    Qwen2,
    /// Gemma 3: sandwich norms, q/k norms, interleaved sliding-window and global layers.
    Gemma3,
    /// Qwen3-Next / Qwen3.5 / Qwen3.6: Gated DeltaNet and gated attention layers, MoE.
    Qwen3Next,
}

impl Architecture {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" | "LlamaForCausalLM" | "mistral" | "MistralForCausalLM" => Ok(Self::Llama),
            "qwen2" | "Qwen2ForCausalLM" => Ok(Self::Qwen2),
            "gemma3" | "gemma3_text" | "Gemma3ForCausalLM" => Ok(Self::Gemma3),
            "qwen3_next" | "qwen3_5_moe" | "qwen3_5_moe_text" | "qwen3_5" | "qwen3_5_text" => {
                Ok(Self::Qwen3Next)
            }
            other => Err(ModelError::UnknownArchitecture(other.to_string())),
        }
    }
}

/// Hyper-parameters of a dense decoder-only transformer.
#[derive(Clone, Debug, Deserialize)]
pub struct TransformerConfig {
    #[serde(skip, default = "default_arch")]
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(alias = "rms_norm_eps", default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// Gemma 3: rotary base of the sliding-window layers.
    #[serde(default = "default_local_rope_theta")]
    pub rope_local_base_freq: f64,
    /// Frequency scaling of the global-attention rotary embedding.
    #[serde(skip, default = "no_rope_scaling")]
    pub rope_scaling: RopeScaling,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Gemma 3: every n-th layer is global, the others slide.
    #[serde(default = "default_sliding_pattern")]
    pub sliding_window_pattern: usize,
    /// Gemma 3: attention scores are scaled by `query_pre_attn_scalar^-0.5`.
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_arch() -> Architecture {
    Architecture::Llama
}
fn default_eps() -> f64 {
    1e-6
}
fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_local_rope_theta() -> f64 {
    10_000.0
}
fn no_rope_scaling() -> RopeScaling {
    RopeScaling::None
}
fn default_max_positions() -> usize {
    4096
}
fn default_sliding_pattern() -> usize {
    6
}

#[derive(Deserialize)]
struct HfHeader {
    #[serde(default)]
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    /// transformers ≥ 5 writes rotary settings here (per layer type for Gemma 3) instead of
    /// `rope_theta` / `rope_scaling`.
    #[serde(default)]
    rope_parameters: Option<serde_json::Value>,
}

impl TransformerConfig {
    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Parses an HF `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let bad = |e: serde_json::Error| ModelError::BadConfig(e.to_string());
        let header: HfHeader = serde_json::from_str(text).map_err(bad)?;
        let arch_name = header
            .model_type
            .or_else(|| header.architectures.first().cloned())
            .ok_or_else(|| ModelError::BadConfig("config.json names no model_type".into()))?;
        let mut cfg: Self = serde_json::from_str(text).map_err(bad)?;
        cfg.architecture = Architecture::parse(&arch_name)?;
        if let Some(rope) = &header.rope_scaling {
            cfg.rope_scaling = RopeScaling::from_hf(rope, cfg.max_position_embeddings)?;
        }
        if let Some(params) = &header.rope_parameters {
            let global = params.get("full_attention").unwrap_or(params);
            if let Some(theta) = global.get("rope_theta").and_then(|t| t.as_f64()) {
                cfg.rope_theta = theta;
            }
            cfg.rope_scaling = RopeScaling::from_hf(global, cfg.max_position_embeddings)?;
            if let Some(theta) = params
                .get("sliding_attention")
                .and_then(|p| p.get("rope_theta"))
                .and_then(|t| t.as_f64())
            {
                cfg.rope_local_base_freq = theta;
            }
        }
        cfg.validate()
    }

    /// Reads the `{arch}.*` keys of a GGUF header.
    pub fn from_gguf(meta: &HashMap<String, Value>) -> Result<Self> {
        let arch_name = meta_str(meta, "general.architecture")?;
        let architecture = Architecture::parse(arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let num_attention_heads = meta_usize(meta, &key("attention.head_count"))?;
        let hidden_size = meta_usize(meta, &key("embedding_length"))?;
        let vocab_size = match meta.get("tokenizer.ggml.tokens") {
            Some(Value::Array(tokens)) => tokens.len(),
            _ => meta_usize(meta, &key("vocab_size"))?,
        };
        let cfg = Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: meta_usize(meta, &key("feed_forward_length"))?,
            num_hidden_layers: meta_usize(meta, &key("block_count"))?,
            num_attention_heads,
            num_key_value_heads: meta_usize(meta, &key("attention.head_count_kv")).ok(),
            head_dim: meta_usize(meta, &key("attention.key_length")).ok(),
            rms_norm_eps: meta_f64(meta, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6),
            rope_theta: meta_f64(meta, &key("rope.freq_base")).unwrap_or(10_000.0),
            // llama.cpp hard-codes Gemma 3's local base too.
            rope_local_base_freq: 10_000.0,
            rope_scaling: RopeScaling::from_gguf(
                meta,
                arch_name,
                meta_usize(meta, &key("context_length")).unwrap_or(4096),
            )?,
            max_position_embeddings: meta_usize(meta, &key("context_length")).unwrap_or(4096),
            sliding_window: meta_usize(meta, &key("attention.sliding_window")).ok(),
            sliding_window_pattern: 6,
            query_pre_attn_scalar: None,
            tie_word_embeddings: false,
        };
        cfg.validate()
    }

    fn validate(self) -> Result<Self> {
        let bad = |m: String| Err(ModelError::BadConfig(m));
        if self.num_attention_heads == 0 || self.num_kv_heads() == 0 {
            return bad("attention head count is zero".into());
        }
        if !self.num_attention_heads.is_multiple_of(self.num_kv_heads()) {
            return bad(format!(
                "{} attention heads are not a multiple of {} key/value heads",
                self.num_attention_heads,
                self.num_kv_heads()
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!("head dimension {} is odd", self.head_dim()));
        }
        // Zero when the heads outnumber the hidden size's values; attention's shapes would then
        // have no elements per head, and candle's shape arithmetic overflows on such reshapes.
        if self.head_dim() == 0 {
            return bad(format!(
                "head dimension is zero ({} attention heads for a hidden size of {})",
                self.num_attention_heads, self.hidden_size
            ));
        }
        if self.head_dim() > MAX_HEAD_DIM {
            return bad(format!(
                "head dimension {} is above the {MAX_HEAD_DIM} any model uses",
                self.head_dim()
            ));
        }
        check_attention_width("attention heads", self.num_attention_heads, self.head_dim(), 1)?;
        check_attention_width("key/value heads", self.num_kv_heads(), self.head_dim(), 1)?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_config_reads_sizes_and_architecture() {
        let cfg = TransformerConfig::from_hf_json(
            r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"rope_theta":1000000.0}"#,
        )
        .unwrap();
        assert_eq!(cfg.architecture, Architecture::Qwen2);
        assert_eq!(cfg.head_dim(), 2);
        assert_eq!(cfg.num_kv_heads(), 2);
        assert_eq!(cfg.rope_theta, 1e6);
    }

    /// Issue #20's fuzzing: head dimensions of zero (more heads than hidden values) and of
    /// 2^32 came through, and panicked in a reshape or allocated 8 GiB of RoPE frequencies.
    #[test]
    fn head_dimensions_of_zero_or_absurd_size_are_refused() {
        let config = |heads: usize, head_dim: usize| {
            TransformerConfig::from_hf_json(&format!(
                r#"{{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
                "num_hidden_layers":1,"num_attention_heads":{heads},"head_dim":{head_dim}}}"#
            ))
        };
        assert!(config(4, 2).is_ok());
        assert!(config(4, MAX_HEAD_DIM).is_ok());
        let zero = config(4, 0).unwrap_err().to_string();
        assert!(zero.contains("head dimension is zero"), "{zero}");
        let huge = config(4, 1 << 32).unwrap_err().to_string();
        assert!(huge.contains("head dimension 4294967296"), "{huge}");
        let many_heads = TransformerConfig::from_hf_json(
            r#"{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":16}"#,
        );
        assert!(many_heads.unwrap_err().to_string().contains("16 attention heads"));
    }

    #[test]
    fn transformers_5_rope_parameters_are_read() {
        let base = r#""vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":4"#;
        let qwen = format!(
            r#"{{"model_type":"qwen2",{base},"rope_parameters":{{"rope_type":"default","rope_theta":1000000.0}}}}"#
        );
        assert_eq!(TransformerConfig::from_hf_json(&qwen).unwrap().rope_theta, 1e6);
        let gemma = format!(
            r#"{{"model_type":"gemma3_text",{base},"rope_parameters":{{
            "full_attention":{{"rope_type":"linear","factor":8.0,"rope_theta":1000000.0}},
            "sliding_attention":{{"rope_type":"default","rope_theta":10000.0}}}}}}"#
        );
        let cfg = TransformerConfig::from_hf_json(&gemma).unwrap();
        assert_eq!(
            (cfg.rope_theta, &cfg.rope_scaling, cfg.rope_local_base_freq),
            (1e6, &RopeScaling::Linear(8.0), 1e4)
        );
    }

    #[test]
    fn unknown_architecture_is_named() {
        let err = TransformerConfig::from_hf_json(
            r#"{"model_type":"rwkv","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":2,"num_attention_heads":4}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("'rwkv'"), "{err}");
    }

    #[test]
    fn heads_must_divide() {
        let err = TransformerConfig::from_hf_json(
            r#"{"model_type":"llama","vocab_size":10,"hidden_size":12,"intermediate_size":16,
            "num_hidden_layers":2,"num_attention_heads":3,"num_key_value_heads":2}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("not a multiple"), "{err}");
    }
}
