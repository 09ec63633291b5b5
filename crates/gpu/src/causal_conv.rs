//! Gated DeltaNet's causal depthwise convolution with SiLU over a step's rows, each sequence
//! continuing from its window slot and leaving its last inputs there (`causal_conv.wgsl`).

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::linear_state::{LinearRuns, LinearStates};
use crate::step::Step;

pub struct CausalConv {
    kernel: Kernel,
}

/// The convolution's outputs, split where the norms and the delta rule want them: `qk` is
/// `tokens × 2·key_dim` (q's heads then k's, per row), `v` is `tokens × value_dim`.
pub struct ConvOutputs {
    pub qk: GpuTensor,
    pub v: GpuTensor,
}

impl CausalConv {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let source = include_str!("shaders/causal_conv.wgsl");
        Ok(CausalConv { kernel: Kernel::new(gpu, "causal_conv", source)? })
    }

    /// Convolves `x` (tokens × conv channels) with `weight` (channels × conv_kernel), sequence
    /// by sequence as `runs` lays them out; their windows in `states` move on. Rows no sequence
    /// owns are left unwritten.
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        x: &GpuTensor,
        weight: &GpuTensor,
        states: &LinearStates,
        runs: &LinearRuns,
    ) -> Result<ConvOutputs> {
        let shape = states.shape();
        let channels = shape.conv_channels();
        let tokens = x.len() / channels;
        if x.len() != tokens * channels || weight.len() != channels * shape.conv_kernel {
            return Err(GpuError::BadInput(format!(
                "{} inputs and {} weights for a convolution of {channels} channels over {}",
                x.len(),
                weight.len(),
                shape.conv_kernel
            )));
        }
        runs.check(tokens, states)?;
        let qk_width = 2 * shape.key_dim();
        let outputs = ConvOutputs {
            qk: step.gpu.output(tokens * qk_width),
            v: step.gpu.output(tokens * shape.value_dim()),
        };
        let params = [
            count(runs.len(), "sequences")?,
            count(channels, "channels")?,
            count(shape.conv_kernel, "convolution width")?,
            count(qk_width, "q and k width")?,
        ];
        let lanes = runs.len() * channels;
        self.kernel.record(
            step,
            &[
                &x.buffer,
                &weight.buffer,
                &states.conv.buffer,
                &runs.on_device.buffer,
                &outputs.qk.buffer,
                &outputs.v.buffer,
                &states.conv_history.buffer,
            ],
            &params,
            (count(lanes.div_ceil(64), "convolution groups")?, 1),
        );
        Ok(outputs)
    }
}
