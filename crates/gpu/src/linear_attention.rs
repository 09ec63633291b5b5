//! The mixing part of a Gated DeltaNet layer, between its input and output projections:
//! convolution, L2 norms of q and k, the delta rule and the gated RMSNorm, for a step's
//! sequences at once, each from its own state slot (as the CPU's `Mixing::run`, but the rule
//! always token by token).

use crate::buffer::GpuTensor;
use crate::causal_conv::CausalConv;
use crate::delta_rule::{DeltaRule, DeltaRuleInputs};
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::linear_state::{DeltaNetShape, LinearRuns, LinearStates};
use crate::norm::{GatedRmsNorm, L2Norm};
use crate::step::Step;

/// A layer's weights between its projections, on the device.
pub struct LinearAttentionWeights {
    shape: DeltaNetShape,
    /// `conv_channels × conv_kernel`.
    conv_weight: GpuTensor,
    /// `−exp(A_log)` then `dt_bias`, per value head.
    decay: GpuTensor,
    /// Per value of a `qk` row: `1/√k_dim` over q's heads, 1 over k's.
    qk_scales: GpuTensor,
    /// Over each head's output (`v_dim`).
    norm_weight: GpuTensor,
    norm_eps: f32,
}

/// The host's copies of [`LinearAttentionWeights`], as `spindle_models`' `GatedDeltaNet`
/// holds them.
pub struct LinearAttentionHostWeights<'a> {
    pub conv_weight: &'a [f32],
    pub neg_decay_rate: &'a [f32],
    pub dt_bias: &'a [f32],
    pub norm_weight: &'a [f32],
    pub norm_eps: f32,
}

impl LinearAttentionWeights {
    pub fn upload(gpu: &Gpu, shape: DeltaNetShape, w: &LinearAttentionHostWeights) -> Result<Self> {
        shape.check()?;
        if w.conv_weight.len() != shape.conv_channels() * shape.conv_kernel
            || w.neg_decay_rate.len() != shape.v_heads
            || w.dt_bias.len() != shape.v_heads
            || w.norm_weight.len() != shape.v_dim
        {
            return Err(GpuError::BadInput(format!(
                "weights of {}, {}, {} and {} values for {shape:?}",
                w.conv_weight.len(),
                w.neg_decay_rate.len(),
                w.dt_bias.len(),
                w.norm_weight.len()
            )));
        }
        let key_dim = shape.key_dim();
        let q_scale = 1.0 / (shape.k_dim as f32).sqrt();
        let mut qk_scales = vec![q_scale; key_dim];
        qk_scales.resize(2 * key_dim, 1.0);
        Ok(LinearAttentionWeights {
            shape,
            conv_weight: gpu.upload(w.conv_weight)?,
            decay: gpu.upload(&[w.neg_decay_rate, w.dt_bias].concat())?,
            qk_scales: gpu.upload(&qk_scales)?,
            norm_weight: gpu.upload(w.norm_weight)?,
            norm_eps: w.norm_eps,
        })
    }
}

/// A step's in-projections, `tokens` rows each: `qkv` (conv channels), `z` (value dim), `b`
/// and `a` (value heads).
pub struct Projected<'a> {
    pub qkv: &'a GpuTensor,
    pub z: &'a GpuTensor,
    pub b: &'a GpuTensor,
    pub a: &'a GpuTensor,
}

pub struct LinearAttention {
    conv: CausalConv,
    l2: L2Norm,
    rule: DeltaRule,
    norm: GatedRmsNorm,
}

impl LinearAttention {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(LinearAttention {
            conv: CausalConv::new(gpu)?,
            l2: L2Norm::new(gpu)?,
            rule: DeltaRule::new(gpu)?,
            norm: GatedRmsNorm::new(gpu)?,
        })
    }

    /// The gated-normed outputs, `tokens × value_dim`, for the output projection; the
    /// sequences' states move on.
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        weights: &LinearAttentionWeights,
        x: &Projected<'_>,
        states: &LinearStates,
        runs: &LinearRuns,
    ) -> Result<GpuTensor> {
        let shape = weights.shape;
        if states.shape() != shape {
            return Err(GpuError::BadInput(format!(
                "states of {:?} for weights of {shape:?}",
                states.shape()
            )));
        }
        let conv = self.conv.forward(step, x.qkv, &weights.conv_weight, states, runs)?;
        let qk = self.l2.forward(step, &conv.qk, shape.k_dim, &weights.qk_scales)?;
        let inputs = DeltaRuleInputs { qk: &qk, v: &conv.v, a: x.a, b: x.b };
        let core = self.rule.forward(step, &inputs, &weights.decay, states, runs)?;
        self.norm.forward(step, &core, x.z, &weights.norm_weight, weights.norm_eps)
    }
}
