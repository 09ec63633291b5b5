//! The dense Llama family (Llama, SmolLM2, Mistral, Qwen2 / Qwen2.5) run on the GPU: the
//! same model as `spindle_models`' CPU `Llama`, from the kernels of this crate, with keys and
//! values in device pools that mirror the callers' `PagedKv` block for block. One step of
//! [`CausalLm::forward_batch`] is one submission; only its logits come back to the host.

use std::sync::Arc;

use candle_core::quantized::GgmlDType;
use spindle_models::{
    Architecture, BatchEntry, CausalLm, ModelError, RopeStyle, Rotary, TransformerConfig, Weight,
    WeightSource,
};

use crate::attention::{Attention, AttentionShape, PagedRows};
use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::elementwise::{AddRows, Elementwise};
use crate::error::{GpuError, Result};
use crate::kv_pools::{KvPools, LayerPools};
use crate::matmul::{Embed, GpuMatrix, Matmul, WeightFormat};
use crate::norm::RmsNorm;
use crate::rope::{Rope, RopePairs, RopeShape, RopeTable};
use crate::step::Step;

/// A projection and its bias (Qwen2's q, k and v have one).
struct Projection {
    weight: GpuMatrix,
    bias: Option<GpuTensor>,
}

struct Layer {
    attn_norm: GpuTensor,
    q: Projection,
    k: Projection,
    v: Projection,
    o: GpuMatrix,
    ffn_norm: GpuTensor,
    gate: GpuMatrix,
    up: GpuMatrix,
    down: GpuMatrix,
}

/// The kernels a step uses, compiled once: a product kernel per weight format the file has.
struct Kernels {
    products: Vec<Matmul>,
    embed: Embed,
    norm: RmsNorm,
    rope: Rope,
    attention: Attention,
    add: Elementwise,
    add_rows: AddRows,
    silu_mul: Elementwise,
}

impl Kernels {
    fn project(&self, step: &mut Step<'_>, p: &Projection, x: &GpuTensor) -> Result<GpuTensor> {
        let y = self.product(step, &p.weight, x)?;
        match &p.bias {
            Some(bias) => self.add_rows.forward(step, &y, bias),
            None => Ok(y),
        }
    }

    fn product(&self, step: &mut Step<'_>, w: &GpuMatrix, x: &GpuTensor) -> Result<GpuTensor> {
        let kernel =
            self.products.iter().find(|k| k.format() == w.format()).ok_or_else(|| {
                GpuError::BadInput(format!("no product kernel for {:?}", w.format()))
            })?;
        kernel.forward(step, w, x)
    }
}

pub struct GpuLlama {
    cfg: TransformerConfig,
    gpu: Arc<Gpu>,
    kernels: Kernels,
    embed: GpuMatrix,
    /// `None`: tied to the embedding table.
    head: Option<GpuMatrix>,
    layers: Vec<Layer>,
    norm: GpuTensor,
    rotary: Rotary,
    pairs: RopePairs,
    pools: KvPools,
}

impl GpuLlama {
    /// Loads the model of `cfg` from `weights` onto `gpu`; architectures and weight formats
    /// this path does not run (Gemma; IQ, Q2_K, Q3_K and Q5_K types) are refused here, not at the
    /// first step.
    pub fn load(
        gpu: Arc<Gpu>,
        cfg: TransformerConfig,
        weights: &mut WeightSource,
    ) -> spindle_models::Result<Self> {
        let refused = |what: String| ModelError::BadConfig(format!("on the GPU: {what}"));
        if !matches!(cfg.architecture, Architecture::Llama | Architecture::Qwen2) {
            return Err(refused(format!(
                "{:?} is not a dense Llama-family model",
                cfg.architecture
            )));
        }
        // As the CPU model: llama.cpp's converter permutes llama q/k rows for its interleaved
        // rotary; Qwen2 and HF checkpoints keep HF's half-split layout.
        let (style, pairs) = match (cfg.architecture, &weights) {
            (Architecture::Llama, WeightSource::Gguf(_)) => {
                (RopeStyle::Interleaved, RopePairs::Interleaved)
            }
            _ => (RopeStyle::Halves, RopePairs::Halves),
        };
        let rotary = Rotary::new(cfg.head_dim(), cfg.rope_theta, &cfg.rope_scaling, style);
        let embed = upload_matrix(&gpu, weights.weight("token_embd.weight")?)?;
        let head = if weights.contains("output.weight") {
            Some(upload_matrix(&gpu, weights.weight("output.weight")?)?)
        } else {
            None
        };
        let mut layers = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            let mut projection = |name: &str| -> spindle_models::Result<Projection> {
                let bias = format!("blk.{i}.{name}.bias");
                let bias = if weights.contains(&bias) {
                    Some(upload_vector(&gpu, weights, &bias)?)
                } else {
                    None
                };
                let weight = weights.weight(&format!("blk.{i}.{name}.weight"))?;
                Ok(Projection { weight: upload_matrix(&gpu, weight)?, bias })
            };
            let (q, k, v) = (projection("attn_q")?, projection("attn_k")?, projection("attn_v")?);
            let mut matrix = |name: &str| {
                upload_matrix(&gpu, weights.weight(&format!("blk.{i}.{name}.weight"))?)
            };
            layers.push(Layer {
                q,
                k,
                v,
                o: matrix("attn_output")?,
                gate: matrix("ffn_gate")?,
                up: matrix("ffn_up")?,
                down: matrix("ffn_down")?,
                attn_norm: upload_vector(&gpu, weights, &format!("blk.{i}.attn_norm.weight"))?,
                ffn_norm: upload_vector(&gpu, weights, &format!("blk.{i}.ffn_norm.weight"))?,
            });
        }
        let norm = upload_vector(&gpu, weights, "output_norm.weight")?;
        let mut formats: Vec<WeightFormat> = layers
            .iter()
            .flat_map(|l| [&l.q.weight, &l.k.weight, &l.v.weight, &l.o, &l.gate, &l.up, &l.down])
            .chain(head.iter())
            .chain([&embed])
            .map(GpuMatrix::format)
            .collect();
        formats.sort_by_key(|f| *f as u8);
        formats.dedup();
        let kernels = (|| {
            Ok(Kernels {
                products: formats.iter().map(|&f| Matmul::new(&gpu, f)).collect::<Result<_>>()?,
                embed: Embed::new(&gpu, embed.format())?,
                norm: RmsNorm::new(&gpu)?,
                rope: Rope::new(&gpu)?,
                attention: Attention::new(&gpu)?,
                add: Elementwise::add(&gpu)?,
                add_rows: AddRows::new(&gpu)?,
                silu_mul: Elementwise::silu_mul(&gpu)?,
            })
        })()
        .map_err(model_error)?;
        Ok(GpuLlama {
            cfg,
            gpu,
            kernels,
            embed,
            head,
            layers,
            norm,
            rotary,
            pairs,
            pools: KvPools::default(),
        })
    }

    fn attention_shape(&self) -> AttentionShape {
        let d = self.cfg.head_dim();
        AttentionShape {
            heads: self.cfg.num_attention_heads,
            kv_heads: self.cfg.num_kv_heads(),
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            window: None,
        }
    }

    /// Records the whole step: `ids` (every entry's tokens in order) through every layer, then
    /// the final norm and head on the rows `wanted` (first row, rows) only.
    fn record(
        &self,
        step: &mut Step<'_>,
        ids: &[u32],
        groups: &[(Arc<LayerPools>, PagedRows)],
        rope: &RopeTable,
        wanted: &[(usize, usize)],
    ) -> Result<GpuTensor> {
        let k = &self.kernels;
        let eps = self.cfg.rms_norm_eps as f32;
        let shape = self.attention_shape();
        let turn = |heads| RopeShape {
            heads,
            head_dim: shape.head_dim,
            rotary_dim: shape.head_dim,
            pairs: self.pairs,
        };
        let mut x = k.embed.forward(step, &self.embed, ids)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let normed = k.norm.forward(step, &x, &layer.attn_norm, eps)?;
            let q = k.project(step, &layer.q, &normed)?;
            let key = k.project(step, &layer.k, &normed)?;
            let value = k.project(step, &layer.v, &normed)?;
            k.rope.apply(step, &q, turn(shape.heads), rope)?;
            k.rope.apply(step, &key, turn(shape.kv_heads), rope)?;
            // Each group of sequences sharing one storage: its keys in, then its attention.
            let attended = step.gpu.output(q.len());
            for (pools, rows) in groups {
                k.attention.write(step, &key, &value, &pools.layers[i], rows)?;
                k.attention.paged(step, &q, &pools.layers[i], rows, shape, &attended)?;
            }
            let out = k.product(step, &layer.o, &attended)?;
            x = k.add.forward(step, &x, &out)?;
            let normed = k.norm.forward(step, &x, &layer.ffn_norm, eps)?;
            let gate = k.product(step, &layer.gate, &normed)?;
            let up = k.product(step, &layer.up, &normed)?;
            let mixed = k.silu_mul.forward(step, &gate, &up)?;
            let out = k.product(step, &layer.down, &mixed)?;
            x = k.add.forward(step, &x, &out)?;
        }
        let hidden = self.cfg.hidden_size;
        let picked = step.gpu.output(wanted.iter().map(|w| w.1).sum::<usize>() * hidden);
        let mut at = 0;
        for &(first, rows) in wanted {
            step.copy(&x, first * hidden, &picked, at, rows * hidden)?;
            at += rows * hidden;
        }
        let normed = k.norm.forward(step, &picked, &self.norm, eps)?;
        k.product(step, self.head.as_ref().unwrap_or(&self.embed), &normed)
    }
}

impl CausalLm for GpuLlama {
    fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> spindle_models::Result<Vec<Vec<f32>>> {
        // Every entry is checked before any work, so a refusal changes no cache.
        let (rows, ids) = spindle_models::batch_rows(batch)?;
        let wanted = spindle_models::logit_rows(batch, &rows);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for entry in batch.iter() {
            let (c, s) = self.rotary.cos_sin(entry.cache.len(), entry.tokens.len());
            cos.extend(c);
            sin.extend(s);
        }
        let groups = self.pools.groups(&self.gpu, &self.kv_shapes(), batch).map_err(model_error)?;
        let vocab = self.cfg.vocab_size;
        let logits = (|| {
            let rope = RopeTable { cos: self.gpu.upload(&cos)?, sin: self.gpu.upload(&sin)? };
            self.gpu
                .run(|step| {
                    let logits = self.record(step, &ids, &groups, &rope, &wanted)?;
                    Ok(step.read(&logits))
                })?
                .values()
        })()
        .map_err(model_error)?;
        for entry in batch.iter_mut() {
            entry.cache.advance(entry.tokens.len());
        }
        let mut rows = logits.chunks_exact(vocab);
        Ok(wanted
            .iter()
            .map(|&(_, n)| rows.by_ref().take(n).flatten().copied().collect())
            .collect())
    }
}

fn model_error(e: GpuError) -> ModelError {
    ModelError::Gpu(e.to_string())
}

/// A weight matrix as the file stores it (quantized blocks, f16/bf16) or as f32.
fn upload_matrix(gpu: &Gpu, weight: Weight) -> spindle_models::Result<GpuMatrix> {
    let (format, rows, cols, bytes) = match weight {
        Weight::Quantized(q) => {
            let (rows, cols) = q.shape().dims2()?;
            let format = match q.dtype() {
                GgmlDType::F32 => WeightFormat::F32,
                GgmlDType::F16 => WeightFormat::F16,
                GgmlDType::BF16 => WeightFormat::Bf16,
                GgmlDType::Q4_0 => WeightFormat::Q4_0,
                GgmlDType::Q4_1 => WeightFormat::Q4_1,
                GgmlDType::Q5_0 => WeightFormat::Q5_0,
                GgmlDType::Q5_1 => WeightFormat::Q5_1,
                GgmlDType::Q8_0 => WeightFormat::Q8_0,
                GgmlDType::Q4K => WeightFormat::Q4K,
                GgmlDType::Q6K => WeightFormat::Q6K,
                other => {
                    return Err(ModelError::BadConfig(format!(
                        "on the GPU: {other:?} weights are not yet supported"
                    )))
                }
            };
            (format, rows, cols, q.data()?.into_owned())
        }
        Weight::Dense(t) => {
            let (rows, cols) = t.dims2()?;
            let values: Vec<f32> = t.flatten_all()?.to_vec1()?;
            (WeightFormat::F32, rows, cols, bytemuck::cast_slice(&values).to_vec())
        }
    };
    GpuMatrix::upload(gpu, format, rows, cols, &bytes).map_err(model_error)
}

fn upload_vector(
    gpu: &Gpu,
    weights: &mut WeightSource,
    name: &str,
) -> spindle_models::Result<GpuTensor> {
    let values: Vec<f32> = weights.dense(name)?.flatten_all()?.to_vec1()?;
    gpu.upload(&values).map_err(model_error)
}
