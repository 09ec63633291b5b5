//! Causal softmax attention over a contiguous per-sequence KV cache, for a prefill chunk's
//! queries or a decode step's one (paged caches come later).

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};

/// Widest head the kernel holds (each of its 64 lanes keeps 4 output dimensions).
pub const MAX_HEAD_DIM: usize = 256;

/// The heads of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies each dot product (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// A sliding window: keys further back than this many positions are not seen.
    pub window: Option<usize>,
}

/// One sequence's keys and values, `(capacity, kv_heads, head_dim)` each, of which the first
/// `len` positions are filled.
pub struct KvCache {
    pub keys: GpuTensor,
    pub values: GpuTensor,
    pub len: usize,
}

pub struct Attention {
    kernel: Kernel,
}

impl Attention {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Attention {
            kernel: Kernel::new(gpu, "attention", include_str!("shaders/attention.wgsl"))?,
        })
    }

    /// The outputs `(tokens, heads, head_dim)` of queries `q` `(tokens, heads, head_dim)` at
    /// the last `tokens` positions of `cache` (their own keys and values already in it).
    pub fn forward(
        &self,
        gpu: &Gpu,
        q: &GpuTensor,
        cache: &KvCache,
        shape: AttentionShape,
    ) -> Result<GpuTensor> {
        let AttentionShape { heads, kv_heads, head_dim, scale, window } = shape;
        if head_dim == 0
            || head_dim > MAX_HEAD_DIM
            || kv_heads == 0
            || heads == 0
            || !heads.is_multiple_of(kv_heads)
        {
            return Err(GpuError::BadInput(format!(
                "{heads} heads over {kv_heads} key/value heads of width {head_dim} \
                 (at most {MAX_HEAD_DIM}; heads a multiple of key/value heads)"
            )));
        }
        let row = heads * head_dim;
        let tokens = q.len() / row;
        let kv_row = kv_heads * head_dim;
        if q.len() != tokens * row
            || tokens > cache.len
            || cache.keys.len() < cache.len * kv_row
            || cache.values.len() != cache.keys.len()
        {
            return Err(GpuError::BadInput(format!(
                "{} query values for rows of {row}, a cache of {} positions held in {} keys and {} values",
                q.len(),
                cache.len,
                cache.keys.len(),
                cache.values.len()
            )));
        }
        let out = gpu.zeros(q.len())?;
        let params = [
            count(tokens, "tokens")?,
            count(heads, "heads")?,
            count(kv_heads, "key/value heads")?,
            count(head_dim, "head width")?,
            count(cache.len - tokens, "cached positions")?,
            count(window.unwrap_or(0), "window")?,
            scale.to_bits(),
        ];
        let buffers = [&q.buffer, &cache.keys.buffer, &cache.values.buffer, &out.buffer];
        self.kernel.run(gpu, &buffers, &params, (count(tokens * heads, "query heads")?, 1))?;
        Ok(out)
    }
}
