//! Building blocks shared by the dense architectures: RMSNorm, rotary embeddings, the gated
//! MLP, and the attention and logits steps around the paged cache (`paged_attention`); the
//! linear layers they are made of are in `linear`.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use crate::activation::Activation;
use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::projections::Projections;
use crate::rope::RopeScaling;
use crate::weight::Weight;
use crate::BatchEntry;

/// Root-mean-square norm: `x / rms(x) * w`.
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self { weight, eps: eps as f32 }
    }

    /// Gemma stores `w` and scales by `1 + w`; GGUF files already hold `1 + w`.
    pub fn new_offset_by_one(weight: Tensor, eps: f64) -> Result<Self> {
        Ok(Self::new((weight + 1.0)?, eps))
    }

    /// Normalises over the last dimension.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)?)
    }
}

/// How rotary embedding pairs up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(i, i + d/2)`: HF's `rotate_half`, llama.cpp's NEOX mode.
    Halves,
    /// Pairs `(2i, 2i+1)`: llama.cpp's normal mode, used by llama GGUFs whose q/k rows were
    /// permuted by the converter.
    Interleaved,
}

/// Rotary position embedding; cos/sin are computed for the positions of each call, so no
/// table bounded by a maximum length is needed.
pub struct Rotary {
    inv_freq: Vec<f32>,
    /// YaRN's attention temperature, folded into cos/sin as transformers does; 1 otherwise.
    scale: f64,
    style: RopeStyle,
}

impl Rotary {
    /// Rotates `dim` dimensions of each head.
    pub fn new(dim: usize, theta: f64, scaling: &RopeScaling, style: RopeStyle) -> Self {
        let (inv_freq, scale) = scaling.inv_freq(dim, theta);
        Self { inv_freq: inv_freq.into_iter().map(|f| f as f32).collect(), scale, style }
    }

    /// The cosines and sines of positions `start..start+tokens`, `(tokens, dim/2)` each (also
    /// what the GPU kernel turns by).
    pub fn cos_sin(&self, start: usize, tokens: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(tokens * half);
        let mut sin = Vec::with_capacity(tokens * half);
        for p in start..start + tokens {
            for f in &self.inv_freq {
                // f64 angle: positions beyond 2^24 would lose precision in f32.
                let angle = p as f64 * *f as f64;
                cos.push((angle.cos() * self.scale) as f32);
                sin.push((angle.sin() * self.scale) as f32);
            }
        }
        (cos, sin)
    }

    /// x: (1, heads, tokens, head_dim) at positions `start..start+tokens`.
    pub fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let tokens = x.dim(2)?;
        let half = self.inv_freq.len();
        let (cos, sin) = self.cos_sin(start, tokens);
        let cos = Tensor::from_vec(cos, (tokens, half), &Device::Cpu)?;
        let sin = Tensor::from_vec(sin, (tokens, half), &Device::Cpu)?;
        let x = x.contiguous()?;
        Ok(match self.style {
            RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
        })
    }
}

/// `down(act(gate(x)) * up(x))`
pub struct GatedMlp {
    gate_up: Projections,
    down: Linear,
    act: Activation,
}

impl GatedMlp {
    /// Refuses a gate and an up projection of different widths: the activation multiplies them
    /// element by element (a damaged file's shapes would otherwise fail an assertion there).
    pub fn new(gate: Weight, up: Weight, down: Linear, act: Activation) -> Result<Self> {
        let (gate_rows, up_rows) = (gate.rows()?, up.rows()?);
        if gate_rows != up_rows {
            return Err(ModelError::BadConfig(format!(
                "the MLP's gate projection has {gate_rows} rows and its up projection {up_rows}"
            )));
        }
        Ok(Self { gate_up: Projections::new(vec![gate, up])?, down, act })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let hidden = match &self.gate_up {
            Projections::Stacked { linear, .. } => self.act.gated_halves(&linear.forward(x)?)?,
            Projections::Separate(_) => {
                let [gate, up]: [Tensor; 2] =
                    self.gate_up.forward(x)?.try_into().expect("two projections");
                self.act.gated(&gate, &up)?
            }
        };
        self.down.forward(&hidden)
    }
}

/// Heads and scaling of one attention layer.
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Keys further back than this are out of a sliding window.
    pub window: Option<usize>,
}

/// Attention of layer `layer` for every sequence of a batch, in parallel, each over its own
/// cache. `q`, `k`, `v` are the batch's rows `(tokens, heads · head_dim)`, sequence `s` being
/// rows `rows[s]` (queries and keys already normalised where the architecture does): each
/// sequence's queries and keys are rotated from its cache's length by `rotate`, its keys and
/// values appended to its cache, and its queries attended. Returns `(tokens, heads · head_dim)`.
pub fn attend_sequences(
    layer: usize,
    [q, k, v]: [&Tensor; 3],
    shape: &AttentionShape,
    batch: &mut [BatchEntry<'_>],
    rows: &[(usize, usize)],
    rotate: impl Fn(&Tensor, usize) -> Result<Tensor> + Sync,
) -> Result<Tensor> {
    let hd = shape.head_dim;
    // The sequences attend at once, so each keeps its share of the threads busy: a decode
    // step's few tasks per sequence then fill the pool together instead of being cut finer.
    let threads = (rayon::current_num_threads() / batch.len().max(1)).max(1);
    let outs = batch
        .par_iter_mut()
        .zip(rows)
        .map(|(entry, &(first, n))| -> Result<Tensor> {
            let start = entry.cache.len();
            let q = rotate(&split_heads(&q.narrow(0, first, n)?, shape.heads, hd)?, start)?;
            let k = rotate(&split_heads(&k.narrow(0, first, n)?, shape.kv_heads, hd)?, start)?;
            let v = split_heads(&v.narrow(0, first, n)?, shape.kv_heads, hd)?;
            let out =
                entry.cache.attend(layer, [&q, &k, &v], shape.scale, shape.window, threads)?;
            merge_heads(&out)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&outs, 0)?)
}

/// Splits (tokens, heads*d) into (1, heads, tokens, d).
pub fn split_heads(x: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    let tokens = x.dim(0)?;
    Ok(x.reshape((1, tokens, heads, head_dim))?.transpose(1, 2)?)
}

/// Merges (1, heads, tokens, d) back into (tokens, heads*d).
pub fn merge_heads(x: &Tensor) -> Result<Tensor> {
    let (_, heads, tokens, d) = x.dims4()?;
    Ok(x.transpose(1, 2)?.reshape((tokens, heads * d))?)
}

/// For each sequence's rows `(first, count)` of the hidden states `x`, the logits after each of
/// them, one vocabulary after another: final norm and LM head run on all those rows together.
pub fn logits_of_rows(
    x: &Tensor,
    wanted: &[(usize, usize)],
    norm: &RmsNorm,
    head: &Linear,
) -> Result<Vec<Vec<f32>>> {
    let picked: Vec<u32> = wanted
        .iter()
        .flat_map(|&(first, count)| (first..first + count).map(|r| r as u32))
        .collect();
    let picked = x.index_select(&Tensor::new(picked.as_slice(), &Device::Cpu)?, 0)?;
    let logits = head.forward(&norm.forward(&picked)?)?.to_dtype(DType::F32)?;
    let vocab = logits.dim(1)?;
    let flat = logits.flatten_all()?.to_vec1::<f32>()?;
    let mut rows = flat.chunks_exact(vocab);
    Ok(wanted
        .iter()
        .map(|&(_, count)| rows.by_ref().take(count).flatten().copied().collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #20's fuzzing: a GGUF file whose ffn_gate and ffn_up widths differ loaded, and
    /// its first forward pass failed an assertion in the activation.
    #[test]
    fn an_mlp_whose_gate_and_up_differ_in_width_is_refused() {
        let matrix =
            |rows| Weight::Dense(Tensor::zeros((rows, 8), DType::F32, &Device::Cpu).unwrap());
        let down = || Linear::new(matrix(8), None).unwrap();
        assert!(GatedMlp::new(matrix(16), matrix(16), down(), Activation::Silu).is_ok());
        let error = GatedMlp::new(matrix(16), matrix(15), down(), Activation::Silu).err().unwrap();
        assert!(error.to_string().contains("gate projection has 16 rows and its up projection 15"));
    }

    #[test]
    fn rotary_styles_agree_on_position_zero_and_differ_after() {
        let x = Tensor::arange(0f32, 8., &Device::Cpu).unwrap().reshape((1, 1, 1, 8)).unwrap();
        for style in [RopeStyle::Halves, RopeStyle::Interleaved] {
            let r = Rotary::new(8, 10_000.0, &RopeScaling::None, style);
            let same = r.apply(&x, 0).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(same, (0..8).map(|i| i as f32).collect::<Vec<_>>());
        }
        let a =
            Rotary::new(8, 10_000.0, &RopeScaling::None, RopeStyle::Halves).apply(&x, 3).unwrap();
        let b = Rotary::new(8, 10_000.0, &RopeScaling::None, RopeStyle::Interleaved)
            .apply(&x, 3)
            .unwrap();
        let diff = (a - b).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff > 1e-3);
    }
}
