//! A random-weight Qwen3.5-MoE GGUF with the per-layer shape of Qwen3.5-35B-A3B (hidden 2048,
//! 256 experts × 512 with top-8 and a shared expert, 16 key / 32 value linear-attention heads of
//! 128, 16 query / 2 key-value attention heads of 256), a few layers deep, for `spindle bench`:
//! it measures the speed of that shape without the 20 GB download. Matrices are Q4_K like a
//! Q4_K_M file; the file is written once under `$SPINDLE_HOME/bench/`.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const HIDDEN: usize = 2048;
const VOCAB: usize = 32_768;
const EXPERTS: usize = 256;
const EXPERT_WIDTH: usize = 512;
const HEADS: usize = 16;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 256;
const K_HEADS: usize = 16;
const V_HEADS: usize = 32;
const LINEAR_HEAD_DIM: usize = 128;
const CONV_KERNEL: usize = 4;

/// The file for `blocks` blocks of (3 linear-attention + 1 full-attention) layers.
pub fn path(blocks: usize) -> anyhow::Result<PathBuf> {
    let dir = spindle_hub::spindle_home().join("bench");
    let path = dir.join(format!("qwen35moe-shape-random-{blocks}x4.gguf"));
    if !path.exists() {
        std::fs::create_dir_all(&dir)?;
        eprintln!("writing {} (once)…", path.display());
        let partial = path.with_extension("partial");
        write(&partial, blocks)?;
        std::fs::rename(&partial, &path)?;
    }
    Ok(path)
}

struct Writer {
    rng: ChaCha8Rng,
    tensors: Vec<(String, QTensor)>,
}

impl Writer {
    /// Uniform weights with the variance of `N(0, 1/fan_in)`, so activations keep their scale.
    fn random(&mut self, rows: usize, cols: usize) -> anyhow::Result<Tensor> {
        let bound = (3.0 / cols as f32).sqrt();
        let values: Vec<f32> = (0..rows * cols).map(|_| self.rng.random_range(-bound..bound)).collect();
        Ok(Tensor::from_vec(values, (rows, cols), &Device::Cpu)?)
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> anyhow::Result<()> {
        let q = QTensor::quantize(&self.random(rows, cols)?, GgmlDType::Q4K)?;
        self.tensors.push((name.into(), q));
        Ok(())
    }

    /// `(experts, rows, cols)`, quantized one expert at a time to bound memory.
    fn experts(&mut self, name: &str, rows: usize, cols: usize) -> anyhow::Result<()> {
        let mut bytes = Vec::new();
        for _ in 0..EXPERTS {
            bytes.extend_from_slice(&QTensor::quantize(&self.random(rows, cols)?, GgmlDType::Q4K)?.data()?);
        }
        let storage = QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, GgmlDType::Q4K)?;
        self.tensors.push((name.into(), QTensor::new(storage, (EXPERTS, rows, cols))?));
        Ok(())
    }

    fn vector(&mut self, name: &str, values: Vec<f32>) -> anyhow::Result<()> {
        let n = values.len();
        self.tensors.push((name.into(), QTensor::quantize(&Tensor::from_vec(values, n, &Device::Cpu)?, GgmlDType::F32)?));
        Ok(())
    }
}

fn write(path: &Path, blocks: usize) -> anyhow::Result<()> {
    let layers = 4 * blocks;
    let mut w = Writer { rng: ChaCha8Rng::seed_from_u64(35), tensors: Vec::new() };
    w.matrix("token_embd.weight", VOCAB, HIDDEN)?;
    w.matrix("output.weight", VOCAB, HIDDEN)?;
    w.vector("output_norm.weight", vec![1.0; HIDDEN])?;
    let (key_dim, value_dim) = (K_HEADS * LINEAR_HEAD_DIM, V_HEADS * LINEAR_HEAD_DIM);
    for i in 0..layers {
        let p = format!("blk.{i}");
        w.vector(&format!("{p}.attn_norm.weight"), vec![1.0; HIDDEN])?;
        w.vector(&format!("{p}.post_attention_norm.weight"), vec![1.0; HIDDEN])?;
        if (i + 1) % 4 == 0 {
            w.matrix(&format!("{p}.attn_q.weight"), 2 * HEADS * HEAD_DIM, HIDDEN)?;
            w.matrix(&format!("{p}.attn_k.weight"), KV_HEADS * HEAD_DIM, HIDDEN)?;
            w.matrix(&format!("{p}.attn_v.weight"), KV_HEADS * HEAD_DIM, HIDDEN)?;
            w.matrix(&format!("{p}.attn_output.weight"), HIDDEN, HEADS * HEAD_DIM)?;
            w.vector(&format!("{p}.attn_q_norm.weight"), vec![1.0; HEAD_DIM])?;
            w.vector(&format!("{p}.attn_k_norm.weight"), vec![1.0; HEAD_DIM])?;
        } else {
            let channels = 2 * key_dim + value_dim;
            w.matrix(&format!("{p}.attn_qkv.weight"), channels, HIDDEN)?;
            w.matrix(&format!("{p}.attn_gate.weight"), value_dim, HIDDEN)?;
            w.matrix(&format!("{p}.ssm_beta.weight"), V_HEADS, HIDDEN)?;
            w.matrix(&format!("{p}.ssm_alpha.weight"), V_HEADS, HIDDEN)?;
            w.matrix(&format!("{p}.ssm_out.weight"), HIDDEN, value_dim)?;
            let conv: Vec<f32> = (0..channels * CONV_KERNEL).map(|_| w.rng.random_range(-0.5..0.5)).collect();
            w.vector(&format!("{p}.ssm_conv1d.weight"), conv)?;
            w.vector(&format!("{p}.ssm_a"), (0..V_HEADS).map(|h| -0.1 - h as f32 * 0.05).collect())?;
            w.vector(&format!("{p}.ssm_dt.bias"), vec![0.0; V_HEADS])?;
            w.vector(&format!("{p}.ssm_norm.weight"), vec![1.0; LINEAR_HEAD_DIM])?;
        }
        w.matrix(&format!("{p}.ffn_gate_inp.weight"), EXPERTS, HIDDEN)?;
        w.experts(&format!("{p}.ffn_gate_exps.weight"), EXPERT_WIDTH, HIDDEN)?;
        w.experts(&format!("{p}.ffn_up_exps.weight"), EXPERT_WIDTH, HIDDEN)?;
        w.experts(&format!("{p}.ffn_down_exps.weight"), HIDDEN, EXPERT_WIDTH)?;
        w.matrix(&format!("{p}.ffn_gate_shexp.weight"), EXPERT_WIDTH, HIDDEN)?;
        w.matrix(&format!("{p}.ffn_up_shexp.weight"), EXPERT_WIDTH, HIDDEN)?;
        w.matrix(&format!("{p}.ffn_down_shexp.weight"), HIDDEN, EXPERT_WIDTH)?;
        let shared_gate = Tensor::zeros((1, HIDDEN), candle_core::DType::F32, &Device::Cpu)?;
        w.tensors.push((format!("{p}.ffn_gate_inp_shexp.weight"), QTensor::quantize(&shared_gate, GgmlDType::F32)?));
    }
    let arch = "qwen35moe";
    let u = |v: usize| Value::U32(v as u32);
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), u(layers)),
        (format!("{arch}.context_length"), u(8192)),
        (format!("{arch}.embedding_length"), u(HIDDEN)),
        (format!("{arch}.attention.head_count"), u(HEADS)),
        (format!("{arch}.attention.head_count_kv"), u(KV_HEADS)),
        (format!("{arch}.attention.key_length"), u(HEAD_DIM)),
        (format!("{arch}.attention.value_length"), u(HEAD_DIM)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (format!("{arch}.rope.freq_base"), Value::F32(1e7)),
        (format!("{arch}.rope.dimension_count"), u(HEAD_DIM / 4)),
        (format!("{arch}.expert_count"), u(EXPERTS)),
        (format!("{arch}.expert_used_count"), u(8)),
        (format!("{arch}.expert_feed_forward_length"), u(EXPERT_WIDTH)),
        (format!("{arch}.expert_shared_feed_forward_length"), u(EXPERT_WIDTH)),
        (format!("{arch}.ssm.conv_kernel"), u(CONV_KERNEL)),
        (format!("{arch}.ssm.state_size"), u(LINEAR_HEAD_DIM)),
        (format!("{arch}.ssm.group_count"), u(K_HEADS)),
        (format!("{arch}.ssm.time_step_rank"), u(V_HEADS)),
        (format!("{arch}.ssm.inner_size"), u(value_dim)),
        (format!("{arch}.full_attention_interval"), u(4)),
    ];
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = w.tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    gguf_file::write(&mut file, &metadata, &tensors)?;
    Ok(())
}
