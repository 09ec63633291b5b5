//! Random-weight Qwen3.5-MoE GGUFs of realistic per-layer shape, a few layers deep, for
//! benchmarks: they measure the speed of a shape without the download. Matrices are Q4_K like a
//! Q4_K_M file, and the file carries a real model's tokenizer, so llama.cpp and this crate load
//! it alike.
//!
//! Three shapes: [`HybridShape::QWEN35_35B_A3B`] (`spindle bench --hybrid-blocks`),
//! [`HybridShape::AGENT_BAR`] (`spindle bench <panel> --hybrid`), and
//! [`HybridShape::QWEN35_35B_A3B_MTP`], the first with a multi-token-prediction head (the step
//! time of a round drafted by it).

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{Seek, Write};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};

const CONV_KERNEL: usize = 4;
/// Bumped whenever the written bytes change, so a file from an older writer is not reused.
/// Revision 2: the convolution as a (channels, kernel) matrix and the rope sections, as
/// llama.cpp's converter writes them, so llama-server loads the same file. Revision 3: every
/// shape carries the default model's tokenizer (llama.cpp refuses a file without one). Revision 4:
/// Qwen3.5's trained context (262,144), so long prompts are measured on the shape too.
const FILE_REVISION: u32 = 4;
/// Qwen3.5-MoE's `context_length`.
const TRAINED_CONTEXT: usize = 262_144;

/// The per-layer sizes of a Qwen3.5-MoE: hybrid blocks of 3 linear-attention layers and 1
/// full-attention layer, every layer a sparse MoE with a shared expert (with no experts, a
/// dense Qwen3.5: every layer an MLP of `expert_width`).
pub struct HybridShape {
    /// Start of the file name ([`HybridShape::file_name`]).
    stem: &'static str,
    hidden: usize,
    experts: usize,
    experts_used: usize,
    expert_width: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    k_heads: usize,
    v_heads: usize,
    linear_head_dim: usize,
    /// Whether the file carries an MTP head: one more block (full attention and the MoE) with
    /// llama.cpp's `nextn` tensors, counted in `block_count` and `nextn_predict_layers`.
    mtp_head: bool,
}

impl HybridShape {
    /// Qwen3.5-35B-A3B: hidden 2048, 256 experts × 512 with top-8 and a shared expert, 16 key /
    /// 32 value linear-attention heads of 128, 16 query / 2 key-value attention heads of 256.
    pub const QWEN35_35B_A3B: Self = Self {
        stem: "qwen35moe-shape-random",
        hidden: 2048,
        experts: 256,
        experts_used: 8,
        expert_width: 512,
        heads: 16,
        kv_heads: 2,
        head_dim: 256,
        k_heads: 16,
        v_heads: 32,
        linear_head_dim: 128,
        mtp_head: false,
    };

    /// Qwen3.5-35B-A3B with its MTP head, as the checkpoints carry one.
    pub const QWEN35_35B_A3B_MTP: Self =
        Self { stem: "qwen35moe-mtp-shape-random", mtp_head: true, ..Self::QWEN35_35B_A3B };

    /// The llama-server comparison of the agent benchmark: hidden 1024 and 64 experts top-8,
    /// the other sizes as 35B-A3B's (transformers' `Qwen3_5MoeTextConfig` defaults), with the
    /// default model's tokenizer (vocabulary 49,152 for SmolLM2) in place of Qwen's 248k.
    pub const AGENT_BAR: Self = Self {
        stem: "qwen35moe-h1024-e64-random",
        hidden: 1024,
        experts: 64,
        ..Self::QWEN35_35B_A3B
    };

    /// The smallest sizes Q4_K's 256-wide blocks allow (4 experts, top 2; two value heads per
    /// key head, so the file's tiled head order matters), for tests that run the whole model.
    pub const TINY: Self = Self {
        stem: "qwen35moe-tiny-random",
        hidden: 256,
        experts: 4,
        experts_used: 2,
        expert_width: 256,
        heads: 2,
        kv_heads: 1,
        head_dim: 128,
        k_heads: 2,
        v_heads: 4,
        linear_head_dim: 128,
        mtp_head: false,
    };

    /// [`HybridShape::TINY`] with an MTP head.
    pub const TINY_MTP: Self =
        Self { stem: "qwen35moe-tiny-mtp-random", mtp_head: true, ..Self::TINY };

    /// [`HybridShape::TINY`] as a dense Qwen3.5 (`qwen35`): an MLP of 256 in every layer.
    pub const TINY_DENSE: Self =
        Self { stem: "qwen35-tiny-random", experts: 0, experts_used: 0, ..Self::TINY };

    /// The file name of this shape with `blocks` blocks; it changes whenever the written bytes
    /// do, so a file from an older writer is not reused.
    pub fn file_name(&self, blocks: usize) -> String {
        format!("{}-{blocks}x4-r{FILE_REVISION}.gguf", self.stem)
    }
}

struct Writer {
    rng: ChaCha8Rng,
    tensors: Vec<(String, QTensor)>,
}

impl Writer {
    /// Uniform weights with the variance of `N(0, 1/fan_in)`, so activations keep their scale.
    fn random(&mut self, rows: usize, cols: usize) -> Result<Tensor> {
        let bound = (3.0 / cols as f32).sqrt();
        let values: Vec<f32> =
            (0..rows * cols).map(|_| self.rng.random_range(-bound..bound)).collect();
        Ok(Tensor::from_vec(values, (rows, cols), &Device::Cpu)?)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<()> {
        let q = QTensor::quantize(&self.random(rows, cols)?, GgmlDType::Q4K)?;
        self.tensors.push((name.into(), q));
        Ok(())
    }

    /// `(experts, rows, cols)`, quantized one expert at a time to bound memory.
    fn experts(&mut self, name: &str, count: usize, rows: usize, cols: usize) -> Result<()> {
        let mut bytes = Vec::new();
        for _ in 0..count {
            bytes.extend_from_slice(
                &QTensor::quantize(&self.random(rows, cols)?, GgmlDType::Q4K)?.data()?,
            );
        }
        let storage = QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, GgmlDType::Q4K)?;
        self.tensors.push((name.into(), QTensor::new(storage, (count, rows, cols))?));
        Ok(())
    }

    fn vector(&mut self, name: &str, values: Vec<f32>) -> Result<()> {
        let n = values.len();
        self.tensors.push((
            name.into(),
            QTensor::quantize(&Tensor::from_vec(values, n, &Device::Cpu)?, GgmlDType::F32)?,
        ));
        Ok(())
    }
}

/// A tokenizer of `count` placeholder tokens (`tokenizer.*` keys), for files that only the model
/// reads, never a tokenizer: step-time measurements at a real vocabulary's size.
pub fn placeholder_tokenizer(count: usize) -> HashMap<String, Value> {
    let tokens = (0..count).map(|i| Value::String(format!("<{i}>"))).collect();
    HashMap::from([("tokenizer.ggml.tokens".to_string(), Value::Array(tokens))])
}

/// Writes a random-weight file of `shape` with `blocks` blocks to `out`, with `tokenizer` (the
/// `tokenizer.*` keys of a GGUF header) as its tokenizer and chat template. The same inputs
/// write the same bytes.
pub fn write_random_hybrid<W: Write + Seek>(
    out: &mut W,
    shape: &HybridShape,
    blocks: usize,
    tokenizer: HashMap<String, Value>,
) -> Result<()> {
    let vocab = match tokenizer.get("tokenizer.ggml.tokens") {
        Some(Value::Array(tokens)) => tokens.len(),
        _ => return Err(ModelError::MissingMetadata("tokenizer.ggml.tokens".into())),
    };
    let hidden = shape.hidden;
    let mut w = Writer { rng: ChaCha8Rng::seed_from_u64(35), tensors: Vec::new() };
    w.matrix("token_embd.weight", vocab, hidden)?;
    w.matrix("output.weight", vocab, hidden)?;
    w.vector("output_norm.weight", vec![1.0; hidden])?;
    for i in 0..4 * blocks {
        layer(&mut w, shape, i, (i + 1).is_multiple_of(4))?;
    }
    if shape.mtp_head {
        mtp_head(&mut w, shape, 4 * blocks)?;
    }
    let mut metadata = metadata(shape, 4 * blocks);
    let mut tokenizer: Vec<(String, Value)> = tokenizer.into_iter().collect();
    // Sorted, so the same inputs write the same bytes.
    tokenizer.sort_by(|a, b| a.0.cmp(&b.0));
    metadata.extend(tokenizer);
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = w.tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(out, &metadata, &tensors)?;
    Ok(())
}

/// Layer `i`: full attention where `full`, linear attention otherwise; a sparse MoE always.
fn layer(w: &mut Writer, s: &HybridShape, i: usize, full: bool) -> Result<()> {
    let (hidden, width) = (s.hidden, s.expert_width);
    let (key_dim, value_dim) = (s.k_heads * s.linear_head_dim, s.v_heads * s.linear_head_dim);
    let p = format!("blk.{i}");
    w.vector(&format!("{p}.attn_norm.weight"), vec![1.0; hidden])?;
    w.vector(&format!("{p}.post_attention_norm.weight"), vec![1.0; hidden])?;
    if full {
        w.matrix(&format!("{p}.attn_q.weight"), 2 * s.heads * s.head_dim, hidden)?;
        w.matrix(&format!("{p}.attn_k.weight"), s.kv_heads * s.head_dim, hidden)?;
        w.matrix(&format!("{p}.attn_v.weight"), s.kv_heads * s.head_dim, hidden)?;
        w.matrix(&format!("{p}.attn_output.weight"), hidden, s.heads * s.head_dim)?;
        w.vector(&format!("{p}.attn_q_norm.weight"), vec![1.0; s.head_dim])?;
        w.vector(&format!("{p}.attn_k_norm.weight"), vec![1.0; s.head_dim])?;
    } else {
        let channels = 2 * key_dim + value_dim;
        w.matrix(&format!("{p}.attn_qkv.weight"), channels, hidden)?;
        w.matrix(&format!("{p}.attn_gate.weight"), value_dim, hidden)?;
        w.matrix(&format!("{p}.ssm_beta.weight"), s.v_heads, hidden)?;
        w.matrix(&format!("{p}.ssm_alpha.weight"), s.v_heads, hidden)?;
        w.matrix(&format!("{p}.ssm_out.weight"), hidden, value_dim)?;
        let conv: Vec<f32> =
            (0..channels * CONV_KERNEL).map(|_| w.rng.random_range(-0.5..0.5)).collect();
        let conv = Tensor::from_vec(conv, (channels, CONV_KERNEL), &Device::Cpu)?;
        w.tensors
            .push((format!("{p}.ssm_conv1d.weight"), QTensor::quantize(&conv, GgmlDType::F32)?));
        w.vector(&format!("{p}.ssm_a"), (0..s.v_heads).map(|h| -0.1 - h as f32 * 0.05).collect())?;
        w.vector(&format!("{p}.ssm_dt.bias"), vec![0.0; s.v_heads])?;
        w.vector(&format!("{p}.ssm_norm.weight"), vec![1.0; s.linear_head_dim])?;
    }
    if s.experts == 0 {
        w.matrix(&format!("{p}.ffn_gate.weight"), width, hidden)?;
        w.matrix(&format!("{p}.ffn_up.weight"), width, hidden)?;
        return w.matrix(&format!("{p}.ffn_down.weight"), hidden, width);
    }
    w.matrix(&format!("{p}.ffn_gate_inp.weight"), s.experts, hidden)?;
    w.experts(&format!("{p}.ffn_gate_exps.weight"), s.experts, width, hidden)?;
    w.experts(&format!("{p}.ffn_up_exps.weight"), s.experts, width, hidden)?;
    w.experts(&format!("{p}.ffn_down_exps.weight"), s.experts, hidden, width)?;
    w.matrix(&format!("{p}.ffn_gate_shexp.weight"), width, hidden)?;
    w.matrix(&format!("{p}.ffn_up_shexp.weight"), width, hidden)?;
    w.matrix(&format!("{p}.ffn_down_shexp.weight"), hidden, width)?;
    let shared_gate = Tensor::zeros((1, hidden), candle_core::DType::F32, &Device::Cpu)?;
    w.tensors.push((
        format!("{p}.ffn_gate_inp_shexp.weight"),
        QTensor::quantize(&shared_gate, GgmlDType::F32)?,
    ));
    Ok(())
}

/// The MTP head as block `i` (after the model's layers): a full-attention layer with the MoE,
/// and the norms and projection that feed it the embedding and the model's hidden state.
fn mtp_head(w: &mut Writer, s: &HybridShape, i: usize) -> Result<()> {
    layer(w, s, i, true)?;
    let (p, hidden) = (format!("blk.{i}.nextn"), s.hidden);
    w.matrix(&format!("{p}.eh_proj.weight"), hidden, 2 * hidden)?;
    for norm in ["enorm", "hnorm", "shared_head_norm"] {
        w.vector(&format!("{p}.{norm}.weight"), vec![1.0; hidden])?;
    }
    Ok(())
}

/// The `qwen35moe.*` (dense: `qwen35.*`) keys llama.cpp writes for this shape.
fn metadata(s: &HybridShape, layers: usize) -> Vec<(String, Value)> {
    let arch = if s.experts == 0 { "qwen35" } else { "qwen35moe" };
    let u = |v: usize| Value::U32(v as u32);
    let feed_forward = if s.experts == 0 {
        vec![(format!("{arch}.feed_forward_length"), u(s.expert_width))]
    } else {
        vec![
            (format!("{arch}.expert_count"), u(s.experts)),
            (format!("{arch}.expert_used_count"), u(s.experts_used)),
            (format!("{arch}.expert_feed_forward_length"), u(s.expert_width)),
            (format!("{arch}.expert_shared_feed_forward_length"), u(s.expert_width)),
        ]
    };
    let mut keys = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), u(layers + usize::from(s.mtp_head))),
        (format!("{arch}.context_length"), u(TRAINED_CONTEXT)),
        (format!("{arch}.embedding_length"), u(s.hidden)),
        (format!("{arch}.attention.head_count"), u(s.heads)),
        (format!("{arch}.attention.head_count_kv"), u(s.kv_heads)),
        (format!("{arch}.attention.key_length"), u(s.head_dim)),
        (format!("{arch}.attention.value_length"), u(s.head_dim)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (format!("{arch}.rope.freq_base"), Value::F32(1e7)),
        (format!("{arch}.rope.dimension_count"), u(s.head_dim / 4)),
        // Qwen3.5's multimodal rope sections; text positions make them plain rope.
        (
            format!("{arch}.rope.dimension_sections"),
            Value::Array([11, 11, 10, 0].map(Value::I32).to_vec()),
        ),
    ];
    // Where the MoE's keys always were: the same shape writes the same bytes.
    keys.extend(feed_forward);
    keys.extend([
        (format!("{arch}.ssm.conv_kernel"), u(CONV_KERNEL)),
        (format!("{arch}.ssm.state_size"), u(s.linear_head_dim)),
        (format!("{arch}.ssm.group_count"), u(s.k_heads)),
        (format!("{arch}.ssm.time_step_rank"), u(s.v_heads)),
        (format!("{arch}.ssm.inner_size"), u(s.v_heads * s.linear_head_dim)),
        (format!("{arch}.full_attention_interval"), u(4)),
    ]);
    if s.mtp_head {
        keys.push((format!("{arch}.nextn_predict_layers"), u(1)));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: HybridShape = HybridShape { mtp_head: true, ..HybridShape::TINY };

    /// The head written is the head loaded: the model has 4 layers and drafts with a head that
    /// reads its hidden states.
    #[test]
    fn a_shape_with_an_mtp_head_loads_with_its_head() {
        let file = tempfile::NamedTempFile::new().unwrap();
        write_random_hybrid(&mut file.as_file(), &SMALL, 1, placeholder_tokenizer(64)).unwrap();
        let model = crate::load_gguf(file.path()).unwrap();
        assert_eq!(model.config().num_hidden_layers, 4);
        let head = model.draft_head().expect("the head");
        let width = model.config().hidden_size;
        let drafted = head.predict(&vec![0.5; width], &[3], &mut head.new_cache(8)).unwrap();
        assert_eq!(drafted.logits[0].len(), 64);
        assert!(drafted.logits[0].iter().all(|l| l.is_finite()));

        let plain = tempfile::NamedTempFile::new().unwrap();
        let shape = HybridShape { mtp_head: false, ..SMALL };
        write_random_hybrid(&mut plain.as_file(), &shape, 1, placeholder_tokenizer(64)).unwrap();
        assert!(crate::load_gguf(plain.path()).unwrap().draft_head().is_none());
    }
}
