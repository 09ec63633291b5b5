//! Tiny random-weight Gemma 3 models written as a safetensors folder (HF layout, f32, tied
//! head): sliding-window layers with a window far shorter than the real model's 512, so tests
//! of windows run past several of them in a few dozen positions.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::error::Result;
use crate::random_dense::write_config;

/// The sizes of a random Gemma 3 model.
#[derive(Clone, Copy, Debug)]
pub struct GemmaShape {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    /// Positions a sliding layer sees.
    pub window: usize,
    /// Every `pattern`-th layer is global, the others slide (6 in Gemma 3).
    pub pattern: usize,
}

impl GemmaShape {
    /// Three layers, the third global; two query heads over one key/value head of 64.
    pub fn tiny(vocab: usize, window: usize) -> Self {
        Self {
            vocab,
            hidden: 64,
            layers: 3,
            heads: 2,
            head_dim: 64,
            intermediate: 128,
            window,
            pattern: 3,
        }
    }
}

/// Writes `config.json` and `model.safetensors` of a random Gemma 3 of `shape` into `dir`
/// (which must exist). `query_pre_attn_scalar` is unlike the head width and the norms' HF
/// weights `w` (a `1 + w` scale) lie away from 0, so a lost scale or offset shows. The same
/// inputs write the same bytes.
pub fn write_random_gemma(dir: &Path, shape: &GemmaShape, seed: u64) -> Result<()> {
    let config = json!({
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": 1,
        "head_dim": shape.head_dim,
        "query_pre_attn_scalar": 48,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "sliding_window": shape.window,
        "sliding_window_pattern": shape.pattern,
        "max_position_embeddings": 1024,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
    });
    write_config(dir, &config)?;

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut random = |shape: &[usize], bound: f32| -> Result<Tensor> {
        let values: Vec<f32> =
            (0..shape.iter().product()).map(|_| rng.random_range(-bound..bound)).collect();
        Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
    };
    let (hidden, head_dim, q_width) = (shape.hidden, shape.head_dim, shape.heads * shape.head_dim);
    let matrix = |cols: usize| (3.0 / cols as f32).sqrt();
    let mut tensors = HashMap::new();
    tensors.insert("model.embed_tokens.weight".to_string(), random(&[shape.vocab, hidden], 1.0)?);
    tensors.insert("model.norm.weight".to_string(), random(&[hidden], 0.5)?);
    for i in 0..shape.layers {
        let p = format!("model.layers.{i}");
        let mut add = |name: &str, dims: &[usize], bound: f32| -> Result<()> {
            tensors.insert(format!("{p}.{name}.weight"), random(dims, bound)?);
            Ok(())
        };
        add("self_attn.q_proj", &[q_width, hidden], matrix(hidden))?;
        add("self_attn.k_proj", &[head_dim, hidden], matrix(hidden))?;
        add("self_attn.v_proj", &[head_dim, hidden], matrix(hidden))?;
        add("self_attn.o_proj", &[hidden, q_width], matrix(q_width))?;
        add("mlp.gate_proj", &[shape.intermediate, hidden], matrix(hidden))?;
        add("mlp.up_proj", &[shape.intermediate, hidden], matrix(hidden))?;
        add("mlp.down_proj", &[hidden, shape.intermediate], matrix(shape.intermediate))?;
        add("self_attn.q_norm", &[head_dim], 0.5)?;
        add("self_attn.k_norm", &[head_dim], 0.5)?;
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            add(norm, &[hidden], 0.5)?;
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    Ok(())
}
