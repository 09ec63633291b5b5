//! Tiny random-weight dense models (Qwen2 architecture) written as a safetensors folder, for
//! tests that need the whole engine — tokenizer, template, prefill, sampling, grammar — without
//! downloading a model. The caller puts the tokenizer files beside them; the vocabulary is the
//! tokenizer's, so every sampled id decodes.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::error::{ModelError, Result};

/// The sizes of a random dense model.
#[derive(Clone, Copy, Debug)]
pub struct DenseShape {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// 64, as SmolLM2's and Qwen2.5's heads: the attention kernels' common width.
    pub head_dim: usize,
    pub intermediate: usize,
    pub context: usize,
}

impl DenseShape {
    /// Two layers of width 32 with two query heads sharing one key-value head: a step costs
    /// little more than its vocabulary-wide output row.
    pub fn tiny(vocab: usize) -> Self {
        Self {
            vocab,
            hidden: 32,
            layers: 2,
            heads: 2,
            kv_heads: 1,
            head_dim: 64,
            intermediate: 64,
            context: 32_768,
        }
    }
}

/// How much longer a favoured token's row of the output head is than the others': at 3× it
/// beats the best of ~150K others about one step in twenty, often enough that a random model
/// closes the strings and objects a grammar opens.
const FAVOURED_SCALE: f32 = 3.0;

/// Writes `config.json` and `model.safetensors` of a random model of `shape` into `dir` (which
/// must exist); the model picks the `favoured` token ids more often than chance. The same inputs
/// write the same bytes.
pub fn write_random_dense(
    dir: &Path,
    shape: &DenseShape,
    seed: u64,
    favoured: &[u32],
) -> Result<()> {
    let config = json!({
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.context,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "float32",
    });
    write_config(dir, &config)?;

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensors = HashMap::new();
    let (hidden, q_width, kv_width) =
        (shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim);
    // Rows of unit scale, so that output logits spread over a few units and sampling at
    // temperature 1 is not uniform over the whole vocabulary.
    tensors.insert(
        "model.embed_tokens.weight".to_string(),
        random(&mut rng, shape.vocab, hidden, 1.0)?,
    );
    // An output head of its own: favoured rows in a tied table would also be long inputs, and
    // a model that has just written one would write it again.
    let mut head: Vec<f32> =
        (0..shape.vocab * hidden).map(|_| rng.random_range(-1.0..1.0)).collect();
    for &id in favoured {
        let row = id as usize * hidden;
        let Some(row) = head.get_mut(row..row + hidden) else {
            return Err(ModelError::BadConfig(format!(
                "favoured token {id} is outside the vocabulary of {}",
                shape.vocab
            )));
        };
        row.iter_mut().for_each(|v| *v *= FAVOURED_SCALE);
    }
    let head = Tensor::from_vec(head, (shape.vocab, hidden), &Device::Cpu)?;
    tensors.insert("lm_head.weight".to_string(), head);
    tensors.insert("model.norm.weight".to_string(), ones(hidden)?);
    for i in 0..shape.layers {
        let p = format!("model.layers.{i}");
        let mut matrix = |name: &str, rows: usize, cols: usize| -> Result<()> {
            let scale = (3.0 / cols as f32).sqrt();
            tensors.insert(format!("{p}.{name}.weight"), random(&mut rng, rows, cols, scale)?);
            Ok(())
        };
        matrix("self_attn.q_proj", q_width, hidden)?;
        matrix("self_attn.k_proj", kv_width, hidden)?;
        matrix("self_attn.v_proj", kv_width, hidden)?;
        matrix("self_attn.o_proj", hidden, q_width)?;
        matrix("mlp.gate_proj", shape.intermediate, hidden)?;
        matrix("mlp.up_proj", shape.intermediate, hidden)?;
        matrix("mlp.down_proj", hidden, shape.intermediate)?;
        tensors.insert(format!("{p}.input_layernorm.weight"), ones(hidden)?);
        tensors.insert(format!("{p}.post_attention_layernorm.weight"), ones(hidden)?);
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    Ok(())
}

/// Writes a random model's `config.json` into `dir`.
pub(crate) fn write_config(dir: &Path, config: &serde_json::Value) -> Result<()> {
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_vec_pretty(config).expect("a JSON value"))
        .map_err(|source| ModelError::Io { path, source })
}

/// Uniform values in `[-bound, bound)`.
fn random(rng: &mut ChaCha8Rng, rows: usize, cols: usize, bound: f32) -> Result<Tensor> {
    let values: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-bound..bound)).collect();
    Ok(Tensor::from_vec(values, (rows, cols), &Device::Cpu)?)
}

fn ones(n: usize) -> Result<Tensor> {
    Ok(Tensor::ones(n, candle_core::DType::F32, &Device::Cpu)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_model_loads_and_the_same_seed_writes_the_same_bytes() {
        let shape = DenseShape { vocab: 300, context: 512, ..DenseShape::tiny(300) };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write_random_dense(a.path(), &shape, 7, &[3]).unwrap();
        write_random_dense(b.path(), &shape, 7, &[3]).unwrap();
        for file in ["config.json", "model.safetensors"] {
            let read = |dir: &Path| std::fs::read(dir.join(file)).unwrap();
            assert_eq!(read(a.path()), read(b.path()), "{file}");
        }
        let model = crate::load_safetensors(a.path()).unwrap();
        assert_eq!(model.config().vocab_size, 300);
        let outside = write_random_dense(a.path(), &shape, 7, &[300]).unwrap_err();
        assert!(outside.to_string().contains("favoured token 300"), "{outside}");
    }
}
