//! The Gated DeltaNet linear-attention layer of Qwen3-Next / Qwen3.5 (HF
//! `Qwen3NextGatedDeltaNet`, `Qwen3_5MoeGatedDeltaNet`): input projections, a depthwise causal
//! convolution over the last few positions, L2-normalised q/k, the gated delta rule, an
//! RMS-norm gated by `silu(z)`, and the output projection.
//!
//! Its per-sequence state is a [`LinearAttentionState`]: the convolution window and the delta
//! rule's matrices. It is a plain value: cloning it is a snapshot, and a sequence resumed from a
//! snapshot continues exactly as the original would.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use crate::delta_rule::{self, DeltaHeads, DeltaInputs};
use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::linear_state::LinearAttentionState;
use crate::projections::Projections;
use crate::rollback::PositionHistory;

/// Layer sizes, from the config.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetShape {
    pub heads: DeltaHeads,
    pub conv_kernel: usize,
    pub norm_eps: f64,
}

impl DeltaNetShape {
    fn key_dim(&self) -> usize {
        self.heads.k_heads * self.heads.k_dim
    }

    fn value_dim(&self) -> usize {
        self.heads.v_heads * self.heads.v_dim
    }

    /// Channels through the convolution: q, k and v side by side.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// The first of `(what, length, length the shape needs)` whose lengths differ, as an error
/// (a needed length that overflows differs from any).
fn mismatch<'a>(mut lengths: impl Iterator<Item = (&'a str, usize, Option<usize>)>) -> Result<()> {
    match lengths.find(|&(_, got, needed)| Some(got) != needed) {
        Some((what, got, needed)) => Err(ModelError::BadConfig(format!(
            "the linear attention's {what} has {got} values where the config's shape needs {}",
            needed.map_or("more than memory holds".to_string(), |n| n.to_string())
        ))),
        None => Ok(()),
    }
}

impl DeltaNetShape {
    /// A sequence's state before its first token: an empty convolution window, zero matrices.
    pub fn initial_state(&self) -> LinearAttentionState {
        LinearAttentionState {
            conv: vec![0.0; (self.conv_kernel - 1) * self.conv_channels()],
            recurrent: delta_rule::zero_state(&self.heads),
        }
    }
}

/// One sequence's part in a layer's pass: its state, which moves on, and where the state after
/// each position is kept when the pass verifies drafts.
pub struct LinearRun<'a> {
    pub state: &'a mut LinearAttentionState,
    pub history: Option<&'a mut PositionHistory>,
}

/// The layer's weights, with the in-projections in the canonical split layout: q, k and v of
/// all heads, then z, b and a.
pub struct GatedDeltaNet {
    pub shape: DeltaNetShape,
    pub in_proj: Projections,
    /// Depthwise convolution weights, `conv_channels × conv_kernel`.
    pub conv_weight: Vec<f32>,
    /// Per value head: `-exp(A_log)`, the decay rate.
    pub neg_decay_rate: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Weight of the gated RMS-norm over each head's output (`v_dim`).
    pub norm_weight: Vec<f32>,
    pub out: Linear,
}

impl GatedDeltaNet {
    /// Runs the batch's rows `x` (tokens × hidden), sequence `s` being rows `rows[s]` and
    /// continuing from `runs[s]`'s state, which moves on. Projections run over all rows at once;
    /// the convolution and the delta rule per sequence.
    pub fn forward(
        &self,
        x: &Tensor,
        rows: &[(usize, usize)],
        runs: &mut [LinearRun<'_>],
    ) -> Result<Tensor> {
        let s = &self.shape;
        let [qkv_all, z, b_all, a_all]: [Vec<f32>; 4] = self
            .in_proj
            .forward(x)?
            .iter()
            .map(|t| Ok(t.flatten_all()?.to_vec1::<f32>()?))
            .collect::<Result<Vec<_>>>()?
            .try_into()
            .expect("four in-projections");
        self.check_widths(x.dim(0)?, [&qkv_all, &z, &b_all, &a_all])?;
        let (channels, value_dim, v_heads) = (s.conv_channels(), s.value_dim(), s.heads.v_heads);
        // Sequences are independent: each runs on its own thread (and splits further inside).
        let per_sequence: Vec<Vec<f32>> = rows
            .par_iter()
            .zip(runs.par_iter_mut())
            .map(|(&(first, n), run)| {
                let mut qkv = qkv_all[first * channels..(first + n) * channels].to_vec();
                let b = &b_all[first * v_heads..(first + n) * v_heads];
                let a = &a_all[first * v_heads..(first + n) * v_heads];
                self.mixing().mix(&mut qkv, b, a, run)
            })
            .collect();
        let mut core = per_sequence.concat();
        gated_rms_norm(&mut core, &z, &self.norm_weight, s.norm_eps as f32);
        let core = Tensor::from_vec(core, (x.dim(0)?, value_dim), &Device::Cpu)?;
        self.out.forward(&core)
    }

    /// `self`, once its vector weights have the lengths its shape (from the config) gives:
    /// sequences' recurrent states are sized from the shape, so a damaged config would
    /// otherwise allocate whatever it claims, and the rule index past the weights' ends.
    pub fn checked(self) -> Result<Self> {
        let s = &self.shape;
        let v_heads = s.heads.v_heads;
        let lengths = [
            ("convolution", self.conv_weight.len(), s.conv_channels().checked_mul(s.conv_kernel)),
            ("decay rate", self.neg_decay_rate.len(), Some(v_heads)),
            ("dt bias", self.dt_bias.len(), Some(v_heads)),
            ("norm weight", self.norm_weight.len(), Some(s.heads.v_dim)),
        ];
        mismatch(lengths.into_iter())?;
        Ok(self)
    }

    /// Checks the in-projections' output for `tokens` rows against the shape: a file whose
    /// matrices disagree with its config would otherwise be indexed past their ends.
    fn check_widths(&self, tokens: usize, projected: [&Vec<f32>; 4]) -> Result<()> {
        let s = &self.shape;
        let v_heads = s.heads.v_heads;
        let widths = [
            ("qkv in-projection", projected[0].len(), Some(tokens * s.conv_channels())),
            ("z in-projection", projected[1].len(), Some(tokens * s.value_dim())),
            ("b in-projection", projected[2].len(), Some(tokens * v_heads)),
            ("a in-projection", projected[3].len(), Some(tokens * v_heads)),
        ];
        mismatch(widths.into_iter())
    }

    /// The weights between the projections, borrowed.
    fn mixing(&self) -> Mixing<'_> {
        Mixing {
            shape: self.shape,
            conv_weight: &self.conv_weight,
            neg_decay_rate: &self.neg_decay_rate,
            dt_bias: &self.dt_bias,
            norm_weight: &self.norm_weight,
        }
    }
}

/// A layer's weights between its projections, borrowed: the convolution, the decay and the
/// gated norm. Public for checks of other implementations of the layer (the GPU kernels).
pub struct Mixing<'a> {
    pub shape: DeltaNetShape,
    pub conv_weight: &'a [f32],
    pub neg_decay_rate: &'a [f32],
    pub dt_bias: &'a [f32],
    pub norm_weight: &'a [f32],
}

impl Mixing<'_> {
    /// One sequence's mixing of its projected rows (`qkv`: tokens × conv channels; `z`:
    /// tokens × value dim; `b`, `a`: tokens × value heads), as [`GatedDeltaNet::forward`] runs
    /// it between the projections: convolution, norms, delta rule, gated norm. `state` moves on.
    pub fn run(
        &self,
        qkv: &[f32],
        z: &[f32],
        b: &[f32],
        a: &[f32],
        state: &mut LinearAttentionState,
    ) -> Vec<f32> {
        let mut qkv = qkv.to_vec();
        let mut core = self.mix(&mut qkv, b, a, &mut LinearRun { state, history: None });
        gated_rms_norm(&mut core, z, self.norm_weight, self.shape.norm_eps as f32);
        core
    }

    /// One sequence's convolution and delta rule over its projected rows; returns the rule's
    /// outputs (tokens × value_dim) and moves the state on, keeping what going back to each
    /// position needs when the pass verifies drafts.
    fn mix(&self, qkv: &mut [f32], b: &[f32], a: &[f32], run: &mut LinearRun<'_>) -> Vec<f32> {
        let s = &self.shape;
        let tokens = b.len() / s.heads.v_heads;
        let state = &mut *run.state;
        let channels = s.conv_channels();
        let conv_inputs =
            causal_conv_silu(qkv, self.conv_weight, channels, s.conv_kernel, &mut state.conv);
        let (key_dim, value_dim) = (s.key_dim(), s.value_dim());
        let mut q = Vec::with_capacity(tokens * key_dim);
        let mut k = Vec::with_capacity(tokens * key_dim);
        let mut v = Vec::with_capacity(tokens * value_dim);
        for row in qkv.chunks_exact(s.conv_channels()) {
            q.extend_from_slice(&row[..key_dim]);
            k.extend_from_slice(&row[key_dim..2 * key_dim]);
            v.extend_from_slice(&row[2 * key_dim..]);
        }
        let scale = 1.0 / (s.heads.k_dim as f32).sqrt();
        l2_normalize(&mut q, s.heads.k_dim, scale);
        l2_normalize(&mut k, s.heads.k_dim, 1.0);
        let v_heads = s.heads.v_heads;
        let beta: Vec<f32> = b.iter().map(|&b| sigmoid(b)).collect();
        let g: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                self.neg_decay_rate[i % v_heads] * softplus(a + self.dt_bias[i % v_heads])
            })
            .collect();
        let inputs = DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta };
        match &mut run.history {
            // Token by token, as decoding the same tokens one per step rounds.
            Some(history) => {
                history.keep_conv_inputs(conv_inputs, channels);
                let kept = history.state_slots(tokens.saturating_sub(1), state.recurrent.len());
                delta_rule::recurrent(&s.heads, &inputs, &mut state.recurrent, kept)
            }
            None if tokens == 1 => {
                delta_rule::recurrent(&s.heads, &inputs, &mut state.recurrent, &mut [])
            }
            None => delta_rule::chunked(&s.heads, &inputs, &mut state.recurrent),
        }
    }
}

/// Depthwise causal convolution then SiLU, in place over `x` (tokens × channels), reading the
/// positions before the first token from `window` and leaving the last `kernel - 1` inputs there.
/// Returns every input it read: the old window, then `x` as it came. Tokens run in parallel:
/// each reads only the unmodified inputs.
pub fn causal_conv_silu(
    x: &mut [f32],
    weight: &[f32],
    channels: usize,
    kernel: usize,
    window: &mut Vec<f32>,
) -> Vec<f32> {
    let history = kernel - 1;
    let mut inputs = std::mem::take(window);
    inputs.extend_from_slice(x);
    x.par_chunks_mut(channels).enumerate().for_each(|(t, out)| {
        for (c, o) in out.iter_mut().enumerate() {
            let taps = &weight[c * kernel..][..kernel];
            let sum: f32 = (0..kernel).map(|i| taps[i] * inputs[(t + i) * channels + c]).sum();
            *o = sum * sigmoid(sum);
        }
    });
    window.extend_from_slice(&inputs[inputs.len() - history * channels..]);
    inputs
}

/// Scales each `dim`-sized row to unit L2 norm (eps 1e-6 inside the root, as FLA), times `scale`.
pub fn l2_normalize(x: &mut [f32], dim: usize, scale: f32) {
    x.par_chunks_mut(dim).for_each(|row| {
        let inv = scale / (row.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
        row.iter_mut().for_each(|v| *v *= inv);
    });
}

/// Per head: RMS-normalise, scale by `weight`, multiply by `silu(z)`.
pub fn gated_rms_norm(x: &mut [f32], z: &[f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    x.par_chunks_mut(dim).zip(z.par_chunks(dim)).for_each(|(row, gate)| {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / dim as f32 + eps).sqrt();
        for ((v, &w), &g) in row.iter_mut().zip(weight).zip(gate) {
            *v = *v * inv * w * g * sigmoid(g);
        }
    });
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)`, linear above 20 as torch's softplus.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn convolution_streams_exactly_like_one_pass() {
        let (channels, kernel) = (3, 4);
        let weight: Vec<f32> = (0..channels * kernel).map(|i| (i as f32 * 0.37).sin()).collect();
        let input: Vec<f32> = (0..10 * channels).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut whole = input.clone();
        let mut window = vec![0.0; (kernel - 1) * channels];
        causal_conv_silu(&mut whole, &weight, channels, kernel, &mut window);
        let mut streamed = Vec::new();
        let mut window2 = vec![0.0; (kernel - 1) * channels];
        for piece in [&input[..channels], &input[channels..7 * channels], &input[7 * channels..]] {
            let mut piece = piece.to_vec();
            causal_conv_silu(&mut piece, &weight, channels, kernel, &mut window2);
            streamed.extend(piece);
        }
        assert_eq!(whole, streamed);
        assert_eq!(window, window2);
        assert_eq!(window, input[7 * channels..].to_vec());
        // The first output only sees the first input: silu(w[last tap] * x).
        let first = weight[kernel - 1] * input[0];
        assert!((whole[0] - first * sigmoid(first)).abs() < 1e-7);
    }

    #[test]
    fn gated_norm_normalises_then_gates() {
        let mut x = vec![3.0, 4.0];
        gated_rms_norm(&mut x, &[0.0, 10.0], &[1.0, 2.0], 0.0);
        // rms = sqrt(12.5); gate silu(0) = 0, silu(10) ≈ 10.
        assert_eq!(x[0], 0.0);
        let expected = 4.0 / 12.5f32.sqrt() * 2.0 * 10.0 * sigmoid(10.0);
        assert!((x[1] - expected).abs() < 1e-5);
    }
}
