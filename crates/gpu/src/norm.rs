//! RMSNorm over rows (hidden states, or per-head q/k norms with rows of `head_dim`).

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::step::Step;

/// `y = x / sqrt(mean(x²) + eps) · w` per row of `w.len()` values (Gemma's `1 + w` is folded into
/// `w` when weights load).
pub struct RmsNorm {
    kernel: Kernel,
}

impl RmsNorm {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(RmsNorm { kernel: Kernel::new(gpu, "rms_norm", include_str!("shaders/rms_norm.wgsl"))? })
    }

    pub fn forward(
        &self,
        step: &mut Step<'_>,
        x: &GpuTensor,
        weight: &GpuTensor,
        eps: f32,
    ) -> Result<GpuTensor> {
        let dim = weight.len();
        if dim == 0 || x.is_empty() || !x.len().is_multiple_of(dim) {
            return Err(GpuError::BadInput(format!(
                "{} values are no whole number of rows of the norm's {dim}",
                x.len()
            )));
        }
        let rows = x.len() / dim;
        let y = step.gpu.output(x.len());
        let params = [count(rows, "rows")?, count(dim, "norm width")?, eps.to_bits()];
        self.kernel.record(
            step,
            &[&x.buffer, &weight.buffer, &y.buffer],
            &params,
            (count(rows, "rows")?, 1),
        );
        Ok(y)
    }
}
