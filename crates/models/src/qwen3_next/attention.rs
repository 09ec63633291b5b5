//! The gated full-attention layer of Qwen3-Next / Qwen3.5 (HF `Qwen3NextAttention`): the q
//! projection also yields a per-head output gate, q and k get a zero-centred RMS-norm per head,
//! only the first `rotary_dim` dimensions of a head rotate, and the attention output is scaled
//! by `sigmoid(gate)` before the output projection.

use candle_core::{Tensor, D};

use crate::error::Result;
use crate::layers::{self, AttentionShape, RmsNorm, Rotary};
use crate::linear::Linear;
use crate::BatchEntry;

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
    /// The batch's rows `x` (tokens × hidden), sequence `s` being rows `rows[s]` after the
    /// positions its cache holds; projections over all rows, attention per sequence.
    pub fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        rotary: &Rotary,
        batch: &mut [BatchEntry<'_>],
        rows: &[(usize, usize)],
    ) -> Result<Tensor> {
        let (tokens, hd) = (x.dim(0)?, self.head_dim);
        let q_and_gate = self.q_and_gate.forward(x)?.reshape((tokens, self.heads, 2 * hd))?;
        let gate = q_and_gate.narrow(2, hd, hd)?.reshape((tokens, self.heads * hd))?;
        // Each head's query and key normalised, then `(tokens, heads · head_dim)`.
        let q = self.q_norm.forward(&q_and_gate.narrow(2, 0, hd)?)?;
        let q = q.reshape((tokens, self.heads * hd))?;
        let k = self.k.forward(x)?.reshape((tokens, self.kv_heads, hd))?;
        let k = self.k_norm.forward(&k)?.reshape((tokens, self.kv_heads * hd))?;
        let v = self.v.forward(x)?;
        let shape = AttentionShape {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
        };
        let rotate = |x: &Tensor, start| self.rotate(x, rotary, start);
        let out = layers::attend_sequences(layer, [&q, &k, &v], &shape, batch, rows, rotate)?;
        let out = (out * candle_nn::ops::sigmoid(&gate)?)?;
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
