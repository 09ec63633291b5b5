//! Norms over rows: RMSNorm (hidden states, or per-head q/k norms with rows of `head_dim`),
//! Gated DeltaNet's L2 normalisation of q and k heads, and its RMSNorm gated by `silu(z)`. One
//! shader (`rms_norm.wgsl`) divides each row by the root of its sum of squares, divided by the
//! width or not.

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::elementwise::Elementwise;
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
        self.record(step, x, (dim, dim as f32, eps), weight)
    }

    /// Rows of `dim` divided by `sqrt(sum(x²) / divisor + eps)`, times `weight` (a row repeated
    /// along `x`, of a whole number of rows).
    fn record(
        &self,
        step: &mut Step<'_>,
        x: &GpuTensor,
        (dim, divisor, eps): (usize, f32, f32),
        weight: &GpuTensor,
    ) -> Result<GpuTensor> {
        if dim == 0
            || x.is_empty()
            || !x.len().is_multiple_of(dim)
            || weight.is_empty()
            || !weight.len().is_multiple_of(dim)
            || !x.len().is_multiple_of(weight.len())
        {
            return Err(GpuError::BadInput(format!(
                "{} values are no whole number of rows of the norm's {dim} (weights of {})",
                x.len(),
                weight.len()
            )));
        }
        let rows = x.len() / dim;
        let y = step.gpu.output(x.len());
        let params = [
            count(rows, "rows")?,
            count(dim, "norm width")?,
            eps.to_bits(),
            divisor.to_bits(),
            count(weight.len(), "norm weights")?,
        ];
        self.kernel.record(
            step,
            &[&x.buffer, &weight.buffer, &y.buffer],
            &params,
            (count(rows, "rows")?, 1),
        );
        Ok(y)
    }
}

/// `y = x / sqrt(sum(x²) + 1e-6) · scale` per row of `dim` (FLA's `l2norm`, as the CPU's
/// `l2_normalize`), `scales` a row of per-value factors repeated along `x`: Gated DeltaNet
/// normalises q's and k's heads in one pass, q's scaled by `1/√k_dim`.
pub struct L2Norm {
    norm: RmsNorm,
}

impl L2Norm {
    /// The epsilon inside the root, as FLA's and the CPU's.
    pub const EPS: f32 = 1e-6;

    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(L2Norm { norm: RmsNorm::new(gpu)? })
    }

    pub fn forward(
        &self,
        step: &mut Step<'_>,
        x: &GpuTensor,
        dim: usize,
        scales: &GpuTensor,
    ) -> Result<GpuTensor> {
        self.norm.record(step, x, (dim, 1.0, Self::EPS), scales)
    }
}

/// Gated DeltaNet's output norm: per head (rows of `weight.len()`), RMSNorm then times
/// `silu(z)`, as the CPU's `gated_rms_norm`. Two dispatches of the shared kernels; rows are
/// independent, so batching changes nothing.
pub struct GatedRmsNorm {
    norm: RmsNorm,
    gate: Elementwise,
}

impl GatedRmsNorm {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(GatedRmsNorm { norm: RmsNorm::new(gpu)?, gate: Elementwise::silu_mul(gpu)? })
    }

    pub fn forward(
        &self,
        step: &mut Step<'_>,
        x: &GpuTensor,
        z: &GpuTensor,
        weight: &GpuTensor,
        eps: f32,
    ) -> Result<GpuTensor> {
        let normed = self.norm.forward(step, x, weight, eps)?;
        self.gate.forward(step, z, &normed)
    }
}
