//! The gated full-attention layer of Qwen3-Next / Qwen3.5 (HF `Qwen3NextAttention`): the q
//! projection also yields a per-head output gate, q and k get a zero-centred RMS-norm per head,
//! only the first `rotary_dim` dimensions of a head rotate, and the attention output is scaled
//! by `sigmoid(gate)` before the output projection.

use candle_core::{Tensor, D};

use crate::cache::SequenceCache;
use crate::error::Result;
use crate::layers::{self, Linear, RmsNorm, Rotary};

pub struct GatedAttention {
    /// `heads × 2 × head_dim` rows: per head, its query rows then its gate rows.
    pub q_and_gate: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: RmsNorm,
    pub k_norm: RmsNorm,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
}

impl GatedAttention {
    /// `x`: tokens × hidden, at the positions after those `cache` holds; appends to layer `layer`.
    pub fn forward(&self, x: &Tensor, layer: usize, rotary: &Rotary, cache: &mut SequenceCache) -> Result<Tensor> {
        let (tokens, hd, start) = (x.dim(0)?, self.head_dim, cache.len());
        let q_and_gate = self.q_and_gate.forward(x)?.reshape((tokens, self.heads, 2 * hd))?;
        let q = q_and_gate.narrow(2, 0, hd)?;
        let gate = q_and_gate.narrow(2, hd, hd)?.reshape((tokens, self.heads * hd))?;
        let k = self.k.forward(x)?.reshape((tokens, self.kv_heads, hd))?;
        let v = self.v.forward(x)?;
        // Norm per head, then (1, heads, tokens, head_dim).
        let q = self.q_norm.forward(&q)?.transpose(0, 1)?.unsqueeze(0)?;
        let k = self.k_norm.forward(&k)?.transpose(0, 1)?.unsqueeze(0)?;
        let v = layers::split_heads(&v, self.kv_heads, hd)?;
        let q = self.rotate(&q, rotary, start)?;
        let k = self.rotate(&k, rotary, start)?;
        let (k, v) = cache.append(layer, &k, &v)?;
        let out = layers::causal_attention(&q, &k, &v, 1.0 / (hd as f64).sqrt(), None)?;
        let out = (layers::merge_heads(&out)? * candle_nn::ops::sigmoid(&gate)?)?;
        self.o.forward(&out)
    }

    /// Rotates the first `rotary_dim` dimensions of each head; the rest pass through.
    fn rotate(&self, x: &Tensor, rotary: &Rotary, start: usize) -> Result<Tensor> {
        if self.rotary_dim == self.head_dim {
            return rotary.apply(x, start);
        }
        let turned = rotary.apply(&x.narrow(D::Minus1, 0, self.rotary_dim)?, start)?;
        let kept = x.narrow(D::Minus1, self.rotary_dim, self.head_dim - self.rotary_dim)?;
        Ok(Tensor::cat(&[&turned, &kept], D::Minus1)?)
    }
}
