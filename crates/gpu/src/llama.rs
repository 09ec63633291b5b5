//! The dense Llama family (Llama, SmolLM2, Mistral, Qwen2 / Qwen2.5) and Gemma 3 run on the
//! GPU: the same models as `spindle_models`' CPU `Llama` and `Gemma3`, from the kernels of this
//! crate, with keys and values in device pools that mirror the callers' `PagedKv` block for
//! block. One step of [`CausalLm::forward_batch`] is one submission; only its logits come back
//! to the host. Where the placement runs the first blocks whole on the CPU (`--n-gpu-layers`
//! short of the block count), a step runs them there first (`spindle_models::FirstBlocks`, their
//! keys and values in the host pool) and the device goes on from the residual stream.
//!
//! Gemma 3 is the Llama layer with: embeddings scaled by `sqrt(hidden)`; RMSNorm by `1 + w`
//! (llama.cpp's files store `1 + w`, HF checkpoints `w`: folded in at load); each head's q and
//! k normalised; the attention and MLP outputs normalised before their residual adds; scores
//! scaled by `query_pre_attn_scalar^-0.5`; a GELU-tanh MLP; sliding-window layers turned by
//! their own rotary base, every `sliding_window_pattern`-th layer global.

use std::sync::Arc;

use spindle_models::{
    Architecture, BatchEntry, CausalLm, FirstBlocks, KvShape, ModelError, RopeScaling, RopeStyle,
    Rotary, TransformerConfig, WeightSource,
};

use crate::attention::{Attention, AttentionShape, PagedRows};
use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::elementwise::{AddRows, Elementwise};
use crate::error::Result;
use crate::kv_pools::{KvPools, LayerPools};
use crate::loading::{model_error, upload_head, upload_matrix, upload_vector, Products};
use crate::matmul::{Embed, GpuMatrix};
use crate::norm::RmsNorm;
use crate::rope::{Rope, RopeAngles, RopePairs, RopeShape, RopeTable};
use crate::step::{rows_per_range, Step};

/// A projection and its bias (Qwen2's q, k and v have one).
struct Projection {
    weight: GpuMatrix,
    bias: Option<GpuTensor>,
}

/// Gemma 3's norms beyond the Llama layer's two.
struct GemmaNorms {
    /// Per head, over `head_dim` values.
    q: GpuTensor,
    k: GpuTensor,
    post_attention: GpuTensor,
    post_ffn: GpuTensor,
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
    gemma: Option<GemmaNorms>,
    /// A sliding-window layer's window (turned by the local rotary table).
    window: Option<usize>,
}

/// The kernels a step uses, compiled once: a product kernel per weight format the file has.
struct Kernels {
    products: Products,
    embed: Embed,
    norm: RmsNorm,
    rope: Rope,
    attention: Attention,
    add: Elementwise,
    add_rows: AddRows,
    mul: Elementwise,
    /// `act(gate) · up`: SiLU, or Gemma's GELU-tanh.
    gated: Elementwise,
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
        self.products.forward(step, w, x)
    }
}

pub struct GpuLlama {
    cfg: TransformerConfig,
    gpu: Arc<Gpu>,
    kernels: Kernels,
    embed: GpuMatrix,
    /// `None`: tied to the embedding table.
    head: Option<GpuMatrix>,
    /// The blocks the placement runs on the CPU, before those on the device.
    first_blocks: Option<Box<dyn FirstBlocks>>,
    /// The blocks on the device, after the CPU's.
    layers: Vec<Layer>,
    norm: GpuTensor,
    rotary: Rotary,
    /// Gemma 3's sliding-window layers' rotary (its own base, unscaled).
    local_rotary: Option<Rotary>,
    pairs: RopePairs,
    /// Gemma 3's embedding scale, `sqrt(hidden)`, as a one-value row.
    embed_scale: Option<GpuTensor>,
    pools: KvPools,
}

impl GpuLlama {
    /// Loads the model of `cfg` from `weights` onto `gpu`; architectures and weight formats
    /// this path does not run (hybrid models; IQ, Q2_K, Q3_K and Q5_K types) are refused here,
    /// not at the first step.
    pub fn load(
        gpu: Arc<Gpu>,
        cfg: TransformerConfig,
        weights: &mut WeightSource,
    ) -> spindle_models::Result<Self> {
        Self::load_placed(gpu, cfg, weights, 0)
    }

    /// As [`GpuLlama::load`], with blocks `0..cpu_blocks` whole on the CPU.
    pub fn load_placed(
        gpu: Arc<Gpu>,
        cfg: TransformerConfig,
        weights: &mut WeightSource,
        cpu_blocks: usize,
    ) -> spindle_models::Result<Self> {
        let refused = |what: String| ModelError::BadConfig(format!("on the GPU: {what}"));
        let gemma = match cfg.architecture {
            Architecture::Llama | Architecture::Qwen2 => false,
            Architecture::Gemma3 => true,
            other => {
                return Err(refused(format!(
                    "{other:?} is neither a dense Llama-family model nor Gemma 3"
                )))
            }
        };
        // HF checkpoints store Gemma's norms as `w` for a `1 + w` scale; llama.cpp's `1 + w`.
        let norm_offset =
            if gemma && matches!(weights, WeightSource::Safetensors(_)) { 1.0 } else { 0.0 };
        // As the CPU model: llama.cpp's converter permutes llama q/k rows for its interleaved
        // rotary; Qwen2 and HF checkpoints keep HF's half-split layout.
        let (style, pairs) = match (cfg.architecture, &weights) {
            (Architecture::Llama, WeightSource::Gguf(_)) => {
                (RopeStyle::Interleaved, RopePairs::Interleaved)
            }
            _ => (RopeStyle::Halves, RopePairs::Halves),
        };
        let rotary = Rotary::new(cfg.head_dim(), cfg.rope_theta, &cfg.rope_scaling, style);
        let local_rotary = gemma.then(|| {
            Rotary::new(cfg.head_dim(), cfg.rope_local_base_freq, &RopeScaling::None, style)
        });
        let embed = upload_matrix(&gpu, weights.weight("token_embd.weight")?)?;
        let head = upload_head(&gpu, weights)?;
        let first_blocks = match cpu_blocks {
            0 => None,
            blocks => Some(spindle_models::dense_first_blocks(&cfg, weights, blocks)?),
        };
        let mut layers = Vec::new();
        for i in cpu_blocks..cfg.num_hidden_layers {
            let mut projection = |name: &str| -> spindle_models::Result<Projection> {
                let bias = format!("blk.{i}.{name}.bias");
                let bias = if weights.contains(&bias) {
                    Some(upload_vector(&gpu, weights, &bias, 0.0)?)
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
            let (o, gate, up, down) = (
                matrix("attn_output")?,
                matrix("ffn_gate")?,
                matrix("ffn_up")?,
                matrix("ffn_down")?,
            );
            let mut norm = |name: &str| {
                upload_vector(&gpu, weights, &format!("blk.{i}.{name}.weight"), norm_offset)
            };
            let gemma_norms = if gemma {
                Some(GemmaNorms {
                    q: norm("attn_q_norm")?,
                    k: norm("attn_k_norm")?,
                    post_attention: norm("post_attention_norm")?,
                    post_ffn: norm("post_ffw_norm")?,
                })
            } else {
                None
            };
            layers.push(Layer {
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
                attn_norm: norm("attn_norm")?,
                ffn_norm: norm("ffn_norm")?,
                gemma: gemma_norms,
                window: window_of(&cfg, i),
            });
        }
        let norm = upload_vector(&gpu, weights, "output_norm.weight", norm_offset)?;
        let embed_scale = if gemma {
            Some(gpu.upload(&[(cfg.hidden_size as f64).sqrt() as f32]).map_err(model_error)?)
        } else {
            None
        };
        let matrices = layers
            .iter()
            .flat_map(|l| [&l.q.weight, &l.k.weight, &l.v.weight, &l.o, &l.gate, &l.up, &l.down])
            .chain(head.iter())
            .chain([&embed]);
        let kernels = (|| {
            Ok(Kernels {
                products: Products::new(&gpu, matrices)?,
                embed: Embed::new(&gpu, embed.format())?,
                norm: RmsNorm::new(&gpu)?,
                rope: Rope::new(&gpu)?,
                attention: Attention::new(&gpu)?,
                add: Elementwise::add(&gpu)?,
                add_rows: AddRows::new(&gpu)?,
                mul: Elementwise::mul(&gpu)?,
                gated: if gemma {
                    Elementwise::gelu_mul(&gpu)?
                } else {
                    Elementwise::silu_mul(&gpu)?
                },
            })
        })()
        .map_err(model_error)?;
        Ok(GpuLlama {
            cfg,
            gpu,
            kernels,
            embed,
            head,
            first_blocks,
            layers,
            norm,
            rotary,
            local_rotary,
            pairs,
            embed_scale,
            pools: KvPools::from_layer(cpu_blocks),
        })
    }

    /// Layer `layer`'s heads (Gemma 3 scales by `query_pre_attn_scalar^-0.5`, as the CPU).
    fn attention_shape(&self, layer: &Layer) -> AttentionShape {
        let d = self.cfg.head_dim();
        let scale = match &layer.gemma {
            Some(_) => self.cfg.query_pre_attn_scalar.unwrap_or(d as f64).powf(-0.5) as f32,
            None => 1.0 / (d as f32).sqrt(),
        };
        AttentionShape {
            heads: self.cfg.num_attention_heads,
            kv_heads: self.cfg.num_kv_heads(),
            head_dim: d,
            scale,
            window: layer.window,
        }
    }

    /// Records the whole step: `ids` (every entry's tokens in order), or the residual stream
    /// the blocks on the CPU handed over (`from_cpu`), through every layer on the device, then
    /// the final norm and head on the rows `wanted` (first row, rows) only.
    fn record(
        &self,
        step: &mut Step<'_>,
        (ids, from_cpu): (&[u32], Option<GpuTensor>),
        groups: &[(Arc<LayerPools>, PagedRows)],
        [global_rope, local_rope]: [&RopeTable; 2],
        wanted: &[(usize, usize)],
    ) -> Result<GpuTensor> {
        let k = &self.kernels;
        let eps = self.cfg.rms_norm_eps as f32;
        let d = self.cfg.head_dim();
        let turn = |heads| RopeShape { heads, head_dim: d, rotary_dim: d, pairs: self.pairs };
        let mut x = match from_cpu {
            Some(x) => x,
            None => k.embed.forward(step, &self.embed, ids)?,
        };
        if let (Some(scale), None) = (&self.embed_scale, &self.first_blocks) {
            x = k.mul.forward_rows(step, &x, scale)?;
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let shape = self.attention_shape(layer);
            let normed = k.norm.forward(step, &x, &layer.attn_norm, eps)?;
            let mut q = k.project(step, &layer.q, &normed)?;
            let mut key = k.project(step, &layer.k, &normed)?;
            let value = k.project(step, &layer.v, &normed)?;
            if let Some(norms) = &layer.gemma {
                q = k.norm.forward(step, &q, &norms.q, eps)?;
                key = k.norm.forward(step, &key, &norms.k, eps)?;
            }
            let rope = if layer.window.is_some() { local_rope } else { global_rope };
            k.rope.apply(step, &q, turn(shape.heads), rope)?;
            k.rope.apply(step, &key, turn(shape.kv_heads), rope)?;
            // Each group of sequences sharing one storage: its keys in, then its attention.
            let attended = step.gpu.output(q.len());
            for (pools, rows) in groups {
                k.attention.write(step, &key, &value, &pools.layers[i], rows)?;
                k.attention.paged(step, &q, &pools.layers[i], rows, shape, &attended)?;
            }
            let mut out = k.product(step, &layer.o, &attended)?;
            if let Some(norms) = &layer.gemma {
                out = k.norm.forward(step, &out, &norms.post_attention, eps)?;
            }
            x = k.add.forward(step, &x, &out)?;
            let normed = k.norm.forward(step, &x, &layer.ffn_norm, eps)?;
            let gate = k.product(step, &layer.gate, &normed)?;
            let up = k.product(step, &layer.up, &normed)?;
            let mixed = k.gated.forward(step, &gate, &up)?;
            let mut out = k.product(step, &layer.down, &mixed)?;
            if let Some(norms) = &layer.gemma {
                out = k.norm.forward(step, &out, &norms.post_ffn, eps)?;
            }
            x = k.add.forward(step, &x, &out)?;
        }
        let picked = step.gather_rows(&x, self.cfg.hidden_size, wanted)?;
        let normed = k.norm.forward(step, &picked, &self.norm, eps)?;
        k.product(step, self.head.as_ref().unwrap_or(&self.embed), &normed)
    }
}

impl Drop for GpuLlama {
    /// The device's kept bind groups hold this model's weights: they go with it.
    fn drop(&mut self) {
        self.gpu.forget_bind_groups();
    }
}

impl CausalLm for GpuLlama {
    fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    fn kv_shapes(&self) -> Vec<Option<KvShape>> {
        let (cfg, kv_heads, head_dim) = (&self.cfg, self.cfg.num_kv_heads(), self.cfg.head_dim());
        let shape = |layer| Some(KvShape { kv_heads, head_dim, window: window_of(cfg, layer) });
        (0..cfg.num_hidden_layers).map(shape).collect()
    }

    fn forward_batch(&self, batch: &mut [BatchEntry<'_>]) -> spindle_models::Result<Vec<Vec<f32>>> {
        // Every entry is checked before any work, so a refusal changes no cache.
        let (rows, ids) = spindle_models::batch_rows(batch)?;
        let wanted = spindle_models::logit_rows(batch, &rows);
        let global = RopeAngles::of_batch(&self.rotary, batch);
        let local = self.local_rotary.as_ref().map(|rotary| RopeAngles::of_batch(rotary, batch));
        let groups = self.pools.groups(&self.gpu, &self.kv_shapes(), batch).map_err(model_error)?;
        let on_cpu =
            self.first_blocks.as_ref().map(|b| b.forward(batch, &rows, &ids)).transpose()?;
        let logits = (|| {
            let global = global.upload(&self.gpu)?;
            let local = local.as_ref().map(|angles| angles.upload(&self.gpu)).transpose()?;
            let ropes = [&global, local.as_ref().unwrap_or(&global)];
            let from_cpu = on_cpu.as_deref().map(|x| self.gpu.upload_for_step(x)).transpose()?;
            self.gpu
                .run(|step| {
                    let logits = self.record(step, (&ids, from_cpu), &groups, ropes, &wanted)?;
                    Ok(step.read(&logits))
                })?
                .values()
        })()
        .map_err(model_error)?;
        for entry in batch.iter_mut() {
            entry.cache.advance(entry.tokens.len());
        }
        Ok(rows_per_range(&logits, self.cfg.vocab_size, &wanted))
    }
}

/// Layer `layer`'s sliding window: as the CPU's Gemma 3, every `sliding_window_pattern`-th
/// layer is global; the Llama family's are all global.
fn window_of(cfg: &TransformerConfig, layer: usize) -> Option<usize> {
    let global = cfg.architecture != Architecture::Gemma3
        || (layer + 1).is_multiple_of(cfg.sliding_window_pattern.max(1));
    if global {
        None
    } else {
        cfg.sliding_window
    }
}
