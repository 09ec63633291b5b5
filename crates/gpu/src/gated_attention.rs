//! The hybrid models' gated full-attention layer on the device, as the CPU's `GatedAttention`:
//! the q projection also yields a per-head output gate, each head's q and k are RMS-normalised
//! (the file's norm weights already hold `1 + w`), only the first `rotary_dim` values of a head
//! turn, and the attention's output is scaled by `sigmoid(gate)` before the output projection.

use spindle_models::{Weight, WeightSource};

use crate::attention::{Attention, AttentionShape, PagedRows};
use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::elementwise::Elementwise;
use crate::error::Result;
use crate::kv_pools::LayerPools;
use crate::loading::{file_layout, model_error, upload_matrix, upload_vector, Products};
use crate::matmul::GpuMatrix;
use crate::norm::RmsNorm;
use crate::rope::{Rope, RopePairs, RopeShape, RopeTable};
use crate::step::Step;

pub(crate) struct GatedAttention {
    /// The query rows of the file's `attn_q` (per head: `head_dim` query rows, then as many gate
    /// rows), apart from its gate rows: each row's product is the same either way.
    q: GpuMatrix,
    gate: GpuMatrix,
    k: GpuMatrix,
    v: GpuMatrix,
    o: GpuMatrix,
    q_norm: GpuTensor,
    k_norm: GpuTensor,
    shape: AttentionShape,
    rotary_dim: usize,
    /// The q/k norms' epsilon (the model's RMSNorm one).
    norm_eps: f32,
}

/// The sizes of every gated attention layer of a model.
#[derive(Clone, Copy)]
pub(crate) struct GatedAttentionShape {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) rotary_dim: usize,
    pub(crate) norm_eps: f32,
}

impl GatedAttention {
    /// Block `p`'s (`blk.3`) attention from a llama.cpp file.
    pub(crate) fn load(
        gpu: &Gpu,
        w: &mut WeightSource,
        p: &str,
        s: GatedAttentionShape,
    ) -> spindle_models::Result<Self> {
        let [q, gate] = query_and_gate(gpu, w.weight(&format!("{p}.attn_q.weight"))?, s)?;
        let mut matrix = |name: &str| upload_matrix(gpu, w.weight(&format!("{p}.{name}.weight"))?);
        let (k, v, o) = (matrix("attn_k")?, matrix("attn_v")?, matrix("attn_output")?);
        let mut norm = |name: &str| upload_vector(gpu, w, &format!("{p}.{name}.weight"), 0.0);
        Ok(GatedAttention {
            q,
            gate,
            k,
            v,
            o,
            q_norm: norm("attn_q_norm")?,
            k_norm: norm("attn_k_norm")?,
            shape: AttentionShape {
                heads: s.heads,
                kv_heads: s.kv_heads,
                head_dim: s.head_dim,
                scale: 1.0 / (s.head_dim as f32).sqrt(),
                window: None,
            },
            rotary_dim: s.rotary_dim,
            norm_eps: s.norm_eps,
        })
    }

    pub(crate) fn matrices(&self) -> [&GpuMatrix; 5] {
        [&self.q, &self.gate, &self.k, &self.v, &self.o]
    }
}

/// `attn_q`'s rows split into the heads' query rows and their gate rows.
fn query_and_gate(
    gpu: &Gpu,
    weight: Weight,
    s: GatedAttentionShape,
) -> spindle_models::Result<[GpuMatrix; 2]> {
    let (format, rows, cols, bytes) = file_layout(weight)?;
    if rows != 2 * s.heads * s.head_dim {
        return Err(spindle_models::ModelError::BadConfig(format!(
            "attn_q has {rows} rows where {} heads of {} queries and gates need {}",
            s.heads,
            s.head_dim,
            2 * s.heads * s.head_dim
        )));
    }
    let head_bytes = s.head_dim * format.row_bytes(cols).map_err(model_error)?;
    let half = |which: usize| -> Vec<u8> {
        bytes
            .chunks_exact(2 * head_bytes)
            .flat_map(|head| &head[which * head_bytes..][..head_bytes])
            .copied()
            .collect()
    };
    let upload = |which| GpuMatrix::upload(gpu, format, rows / 2, cols, &half(which));
    Ok([upload(0).map_err(model_error)?, upload(1).map_err(model_error)?])
}

/// The kernels the layer runs, compiled once.
pub(crate) struct AttentionKernels {
    norm: RmsNorm,
    rope: Rope,
    attention: Attention,
    sigmoid_mul: Elementwise,
}

impl AttentionKernels {
    pub(crate) fn new(gpu: &Gpu) -> Result<Self> {
        Ok(AttentionKernels {
            norm: RmsNorm::new(gpu)?,
            rope: Rope::new(gpu)?,
            attention: Attention::new(gpu)?,
            sigmoid_mul: Elementwise::sigmoid_mul(gpu)?,
        })
    }

    /// The layer's output for the normed rows `x`; each group's keys and values go into its
    /// pools' layer `pool` first.
    pub(crate) fn forward(
        &self,
        step: &mut Step<'_>,
        products: &Products,
        layer: &GatedAttention,
        x: &GpuTensor,
        (groups, pool): (&[(std::sync::Arc<LayerPools>, PagedRows)], usize),
        rope: &RopeTable,
    ) -> Result<GpuTensor> {
        let shape = layer.shape;
        let d = shape.head_dim;
        let turn = |heads| RopeShape {
            heads,
            head_dim: d,
            rotary_dim: layer.rotary_dim,
            pairs: RopePairs::Halves,
        };
        let q = products.forward(step, &layer.q, x)?;
        let gate = products.forward(step, &layer.gate, x)?;
        let q = self.norm.forward(step, &q, &layer.q_norm, layer.norm_eps)?;
        let k = products.forward(step, &layer.k, x)?;
        let k = self.norm.forward(step, &k, &layer.k_norm, layer.norm_eps)?;
        let v = products.forward(step, &layer.v, x)?;
        self.rope.apply(step, &q, turn(shape.heads), rope)?;
        self.rope.apply(step, &k, turn(shape.kv_heads), rope)?;
        let attended = step.gpu.output(q.len());
        for (pools, rows) in groups {
            self.attention.write(step, &k, &v, &pools.layers[pool], rows)?;
            self.attention.paged(step, &q, &pools.layers[pool], rows, shape, &attended)?;
        }
        let gated = self.sigmoid_mul.forward(step, &attended, &gate)?;
        products.forward(step, &layer.o, &gated)
    }
}
