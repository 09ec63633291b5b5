//! Hyper-parameters of the hybrid models from HF `config.json`: `qwen3_next`, `qwen3_5_moe`
//! (its `text_config`), `qwen3_5_moe_text`, `qwen3_5` and `qwen3_5_text`.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value as GgufValue;
use serde::Deserialize;
use serde_json::Value;

use crate::cache::RecurrentState;
use crate::config::{check_attention_width, MAX_HEAD_DIM};
use crate::delta_rule::DeltaHeads;
use crate::error::{ModelError, Result};
use crate::gated_deltanet::DeltaNetShape;
use crate::gguf_metadata::{meta_f64, meta_str, meta_usize};
use crate::rope::RopeScaling;

/// Which token mixer a layer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    Linear,
    Full,
}

#[derive(Clone, Debug, Deserialize)]
pub struct HybridConfig {
    #[serde(skip)]
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    full_attention_interval: Option<usize>,
    pub linear_conv_kernel_dim: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    #[serde(default)]
    pub num_experts: usize,
    #[serde(default)]
    pub num_experts_per_tok: usize,
    #[serde(default)]
    pub moe_intermediate_size: usize,
    #[serde(default)]
    norm_topk_prob: Option<bool>,
    /// Width of the dense MLP (layers without experts).
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    #[serde(default)]
    rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    /// Frequency scaling of the attention layers' rotary embedding.
    #[serde(skip, default = "no_rope_scaling")]
    pub rope_scaling: RopeScaling,
    /// Multi-token-prediction layers the checkpoint carries (Qwen3.5's `mtp_num_hidden_layers`,
    /// GGUF `nextn_predict_layers`); Qwen3-Next's config does not say, its tensors do.
    #[serde(default, alias = "num_nextn_predict_layers")]
    pub mtp_num_hidden_layers: Option<usize>,
    /// Value heads in llama.cpp's tiled order (Qwen3.5 GGUFs); see [`DeltaHeads::tiled`].
    #[serde(skip)]
    pub tiled_value_heads: bool,
}

#[derive(Clone, Debug, Deserialize)]
struct RopeParameters {
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_positions() -> usize {
    32768
}
fn no_rope_scaling() -> RopeScaling {
    RopeScaling::None
}
fn one() -> usize {
    1
}

/// `model_type`s of the hybrid family.
const MODEL_TYPES: [&str; 5] =
    ["qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_text"];

impl HybridConfig {
    /// The config when `config.json` describes a hybrid model, `None` for any other model.
    pub fn detect(text: &str) -> Result<Option<Self>> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| ModelError::BadConfig(e.to_string()))?;
        let model_type = root.get("model_type").and_then(Value::as_str).unwrap_or_default();
        if MODEL_TYPES.contains(&model_type) {
            Self::from_hf_json(text).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Reads the `{arch}.*` keys llama.cpp writes for `qwen3next`, `qwen35moe` and `qwen35`.
    pub fn from_gguf(
        meta: &HashMap<String, GgufValue>,
        vocab_size: usize,
        tied: bool,
    ) -> Result<Self> {
        let arch = meta_str(meta, "general.architecture")?;
        let key = |k: &str| format!("{arch}.{k}");
        let usize_of = |k: &str| meta_usize(meta, &key(k));
        let head_dim = usize_of("attention.key_length")?;
        let v_heads = usize_of("ssm.time_step_rank")?;
        // llama.cpp counts the MTP block (the last) in `block_count` and in the layer pattern.
        let blocks = usize_of("block_count")?;
        let mtp_layers = usize_of("nextn_predict_layers").unwrap_or(0);
        let layers = blocks.checked_sub(mtp_layers).filter(|&n| n > 0).ok_or_else(|| {
            ModelError::BadConfig(format!(
                "{arch}.nextn_predict_layers {mtp_layers} leaves none of the {blocks} blocks"
            ))
        })?;
        let layer_types = match meta.get(&key("attention.recurrent_layers")) {
            Some(GgufValue::Array(flags)) => Some(
                flags
                    .iter()
                    .take(layers)
                    .map(|f| {
                        if matches!(f, GgufValue::Bool(true)) {
                            "linear_attention"
                        } else {
                            "full_attention"
                        }
                        .to_string()
                    })
                    .collect(),
            ),
            _ => None,
        };
        let cfg = Self {
            model_type: arch.to_string(),
            vocab_size,
            hidden_size: usize_of("embedding_length")?,
            num_hidden_layers: layers,
            num_attention_heads: usize_of("attention.head_count")?,
            num_key_value_heads: usize_of("attention.head_count_kv")?,
            head_dim,
            rms_norm_eps: meta_f64(meta, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6),
            max_position_embeddings: usize_of("context_length").unwrap_or(default_max_positions()),
            tie_word_embeddings: tied,
            layer_types,
            full_attention_interval: usize_of("full_attention_interval").ok(),
            linear_conv_kernel_dim: usize_of("ssm.conv_kernel")?,
            linear_key_head_dim: usize_of("ssm.state_size")?,
            linear_value_head_dim: usize_of("ssm.inner_size")? / v_heads.max(1),
            linear_num_key_heads: usize_of("ssm.group_count")?,
            linear_num_value_heads: v_heads,
            num_experts: usize_of("expert_count").unwrap_or(0),
            num_experts_per_tok: usize_of("expert_used_count").unwrap_or(0),
            moe_intermediate_size: usize_of("expert_feed_forward_length").unwrap_or(0),
            // llama.cpp always renormalises the top-k weights of these architectures.
            norm_topk_prob: Some(true),
            intermediate_size: usize_of("feed_forward_length").ok(),
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
            rope_parameters: None,
            rope_theta: meta_f64(meta, &key("rope.freq_base")).ok(),
            partial_rotary_factor: Some(usize_of("rope.dimension_count")? as f64 / head_dim as f64),
            rope_scaling: RopeScaling::from_gguf(
                meta,
                arch,
                usize_of("context_length").unwrap_or(default_max_positions()),
            )?,
            mtp_num_hidden_layers: Some(mtp_layers),
            tiled_value_heads: arch != "qwen3next",
        };
        cfg.validate()
    }

    /// Parses a `config.json`, descending into `text_config` for multimodal wrappers.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let bad = |e: serde_json::Error| ModelError::BadConfig(e.to_string());
        let root: Value = serde_json::from_str(text).map_err(bad)?;
        let body = root.get("text_config").unwrap_or(&root);
        let mut cfg: Self = serde_json::from_value(body.clone()).map_err(bad)?;
        cfg.model_type = body
            .get("model_type")
            .or(root.get("model_type"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        // transformers ≥ 5 keeps the scaling in `rope_parameters`, earlier versions in `rope_scaling`.
        if let Some(rope) =
            body.get("rope_parameters").or(body.get("rope_scaling")).filter(|r| !r.is_null())
        {
            cfg.rope_scaling = RopeScaling::from_hf(rope, cfg.max_position_embeddings)?;
        }
        cfg.validate()
    }

    fn validate(self) -> Result<Self> {
        let bad = |m: String| Err(ModelError::BadConfig(m));
        let counts = [
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, n)| *n == 0) {
            return bad(format!("{name} is zero"));
        }
        // The convolution's channels, computed unchecked from here on (the weights then bound
        // them: see `GatedDeltaNet::checked`).
        let key_dim = self.linear_num_key_heads.checked_mul(self.linear_key_head_dim);
        let value_dim = self.linear_num_value_heads.checked_mul(self.linear_value_head_dim);
        let channels = key_dim
            .and_then(|k| k.checked_mul(2))
            .zip(value_dim)
            .and_then(|(k, v)| k.checked_add(v));
        if channels.is_none() || self.linear_conv_kernel_dim == 0 {
            return bad(
                "the linear attention's head sizes or convolution kernel are out of range".into()
            );
        }
        if self.head_dim == 0 || self.head_dim > MAX_HEAD_DIM {
            return bad(format!("head_dim {} is outside 1..={MAX_HEAD_DIM}", self.head_dim));
        }
        // The q projection yields a gate per head beside its query.
        check_attention_width("attention heads", self.num_attention_heads, self.head_dim, 2)?;
        check_attention_width("key/value heads", self.num_key_value_heads, self.head_dim, 1)?;
        // RoPE rotates pairs of the first `rotary_dim` values of each head (candle's kernel
        // panics on none), which must lie within the head.
        let rotary = self.rotary_dim();
        if rotary == 0 || !rotary.is_multiple_of(2) || rotary > self.head_dim {
            return bad(format!(
                "the rotary dimension {rotary} (partial_rotary_factor of head_dim {}) is not an \
                 even number of the head's values",
                self.head_dim
            ));
        }
        if !self.linear_num_value_heads.is_multiple_of(self.linear_num_key_heads) {
            return bad(format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                self.linear_num_value_heads, self.linear_num_key_heads
            ));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return bad("num_attention_heads is not a multiple of num_key_value_heads".into());
        }
        if self.layer_types().len() != self.num_hidden_layers {
            return bad(format!(
                "layer_types has {} entries for {} layers",
                self.layer_types().len(),
                self.num_hidden_layers
            ));
        }
        if self.num_experts > 0
            && (self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.num_experts)
        {
            return bad(format!(
                "num_experts_per_tok {} with {} experts",
                self.num_experts_per_tok, self.num_experts
            ));
        }
        Ok(self)
    }

    /// Qwen3-Next stores the in-projections fused per key-head group (`in_proj_qkvz`,
    /// `in_proj_ba`); Qwen3.5 stores them split.
    pub fn fused_in_projections(&self) -> bool {
        self.model_type == "qwen3_next"
    }

    /// Layer `i`'s mixer: `layer_types`, else every `full_attention_interval`-th layer (4 by
    /// default) is full attention.
    pub fn layer_types(&self) -> Vec<Mixer> {
        match &self.layer_types {
            Some(types) => types
                .iter()
                .map(|t| if t == "full_attention" { Mixer::Full } else { Mixer::Linear })
                .collect(),
            None => {
                let interval = self.full_attention_interval.unwrap_or(4).max(1);
                (0..self.num_hidden_layers)
                    .map(|i| if (i + 1) % interval == 0 { Mixer::Full } else { Mixer::Linear })
                    .collect()
            }
        }
    }

    /// Whether layer `i` has routed experts (otherwise a dense MLP).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.num_experts > 0
            && !self.mlp_only_layers.contains(&i)
            && (i + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }

    /// Qwen3.5 always renormalises the top-k router weights; Qwen3-Next when configured.
    pub fn normalize_top_k(&self) -> bool {
        self.norm_topk_prob.unwrap_or(true)
    }

    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|r| r.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10_000.0)
    }

    /// Dimensions of each head that rotate (the rest pass through).
    pub fn rotary_dim(&self) -> usize {
        let factor = self
            .rope_parameters
            .as_ref()
            .and_then(|r| r.partial_rotary_factor)
            .or(self.partial_rotary_factor)
            .unwrap_or(0.25);
        (self.head_dim as f64 * factor) as usize
    }

    /// Every linear-attention layer's state before any token (`None` for the others).
    pub fn initial_recurrent_state(&self) -> RecurrentState {
        let shape = self.delta_net_shape();
        let states = self
            .layer_types()
            .into_iter()
            .map(|kind| (kind == Mixer::Linear).then(|| shape.initial_state()))
            .collect();
        RecurrentState(states)
    }

    pub fn delta_net_shape(&self) -> DeltaNetShape {
        DeltaNetShape {
            heads: DeltaHeads {
                k_heads: self.linear_num_key_heads,
                v_heads: self.linear_num_value_heads,
                k_dim: self.linear_key_head_dim,
                v_dim: self.linear_value_head_dim,
                tiled: self.tiled_value_heads,
            },
            conv_kernel: self.linear_conv_kernel_dim,
            norm_eps: self.rms_norm_eps,
        }
    }
}
