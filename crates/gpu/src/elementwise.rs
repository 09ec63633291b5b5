//! Value-by-value kernels between the reductions: the residual add and the gated MLP's
//! `silu(gate) · up`. Each output depends on its own inputs only, so batching changes nothing.

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::step::Step;

/// Two inputs of one length to one output of it.
pub struct Elementwise {
    kernel: Kernel,
}

impl Elementwise {
    /// `a + b`.
    pub fn add(gpu: &Gpu) -> Result<Self> {
        Ok(Elementwise { kernel: Kernel::new(gpu, "add", include_str!("shaders/add.wgsl"))? })
    }

    /// `silu(a) · b`.
    pub fn silu_mul(gpu: &Gpu) -> Result<Self> {
        Ok(Elementwise {
            kernel: Kernel::new(gpu, "silu_mul", include_str!("shaders/silu_mul.wgsl"))?,
        })
    }

    pub fn forward(&self, step: &mut Step<'_>, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        if a.len() != b.len() {
            return Err(GpuError::BadInput(format!(
                "inputs of {} and {} values",
                a.len(),
                b.len()
            )));
        }
        let y = step.gpu.output(a.len());
        let groups = count(a.len().div_ceil(64), "groups")?;
        self.kernel.record(
            step,
            &[&a.buffer, &b.buffer, &y.buffer],
            &[count(a.len(), "values")?],
            (groups, 1),
        );
        Ok(y)
    }
}

/// One vector added to every row of a tensor (a projection's bias).
pub struct AddRows {
    kernel: Kernel,
}

impl AddRows {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(AddRows { kernel: Kernel::new(gpu, "add_rows", include_str!("shaders/add_rows.wgsl"))? })
    }

    /// `x` (rows, width) + `row` (width) on every row.
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        x: &GpuTensor,
        row: &GpuTensor,
    ) -> Result<GpuTensor> {
        if row.is_empty() || !x.len().is_multiple_of(row.len()) {
            return Err(GpuError::BadInput(format!(
                "{} values are no whole number of rows of {}",
                x.len(),
                row.len()
            )));
        }
        let y = step.gpu.output(x.len());
        let params = [count(x.len(), "values")?, count(row.len(), "row width")?];
        let groups = count(x.len().div_ceil(64), "groups")?;
        self.kernel.record(step, &[&x.buffer, &row.buffer, &y.buffer], &params, (groups, 1));
        Ok(y)
    }
}
