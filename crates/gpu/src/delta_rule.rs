//! The gated delta rule over a step's rows, token by token as decode runs it, each sequence
//! moving on its own matrices in a [`LinearStates`] slot (`delta_rule.wgsl`).

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::linear_state::{LinearRuns, LinearStates};
use crate::step::Step;

pub struct DeltaRule {
    kernel: Kernel,
}

/// One step's inputs to the rule, row-major over the step's tokens: `qk` (q's heads then k's
/// per row, L2-normalised, q scaled), `v` (value heads), `a` and `b` (one per value head: the
/// decay's and the write strength's projections, before softplus and sigmoid).
pub struct DeltaRuleInputs<'a> {
    pub qk: &'a GpuTensor,
    pub v: &'a GpuTensor,
    pub a: &'a GpuTensor,
    pub b: &'a GpuTensor,
}

impl DeltaRule {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(DeltaRule {
            kernel: Kernel::new(gpu, "delta_rule", include_str!("shaders/delta_rule.wgsl"))?,
        })
    }

    /// Runs the rule over each sequence's rows from its slot's matrices, which move on;
    /// `decay` is the layer's `−exp(A_log)` then its `dt_bias` (one per value head each).
    /// Returns the outputs, `tokens × v_heads × v_dim` (rows no sequence owns left unwritten).
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        x: &DeltaRuleInputs<'_>,
        decay: &GpuTensor,
        states: &LinearStates,
        runs: &LinearRuns,
    ) -> Result<GpuTensor> {
        let shape = states.shape();
        let tokens = x.a.len() / shape.v_heads;
        if x.qk.len() != tokens * 2 * shape.key_dim()
            || x.v.len() != tokens * shape.value_dim()
            || x.a.len() != tokens * shape.v_heads
            || x.b.len() != x.a.len()
            || decay.len() != 2 * shape.v_heads
        {
            return Err(GpuError::BadInput(format!(
                "q/k {}, v {}, a {}, b {} and decay {} values for {shape:?}",
                x.qk.len(),
                x.v.len(),
                x.a.len(),
                x.b.len(),
                decay.len()
            )));
        }
        runs.check(tokens, states)?;
        let out = step.gpu.output(tokens * shape.value_dim());
        let params = [
            count(runs.len(), "sequences")?,
            count(shape.k_heads, "key heads")?,
            count(shape.v_heads, "value heads")?,
            count(shape.k_dim, "key width")?,
            count(shape.v_dim, "value width")?,
            u32::from(shape.tiled),
        ];
        let lanes = runs.len() * shape.value_dim();
        self.kernel.record(
            step,
            &[
                &x.qk.buffer,
                &x.v.buffer,
                &x.a.buffer,
                &x.b.buffer,
                &decay.buffer,
                &states.recurrent.buffer,
                &runs.on_device.buffer,
                &out.buffer,
                &states.recurrent_history.buffer,
            ],
            &params,
            (count(lanes.div_ceil(64), "delta rule groups")?, 1),
        );
        Ok(out)
    }
}
