//! Value-by-value kernels between the reductions: the residual add, a bias or scale on every
//! row, and the gated MLP's `act(gate) · up` (SiLU for the Llama family, GELU-tanh for Gemma).
//! One shader (`elementwise.wgsl`) with the operation appended; each output depends on its own
//! inputs only, so batching changes nothing.

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::step::Step;

const ADD: &str = "fn op(a: f32, b: f32) -> f32 { return a + b; }";
const MUL: &str = "fn op(a: f32, b: f32) -> f32 { return a * b; }";
/// `silu(g) = g / (1 + exp(−g))`.
const SILU_MUL: &str = "fn op(g: f32, u: f32) -> f32 { return g / (1.0 + exp(-g)) * u; }";
/// `a · sigmoid(g)` (the gated attention's output gate).
const SIGMOID_MUL: &str = "fn op(a: f32, g: f32) -> f32 { return a * (1.0 / (1.0 + exp(-g))); }";
/// `g/2 · (1 + tanh(√(2/π)·(g + 0.044715·g³)))` as the CPU's: `tanh t = sign(t)·(1 − e)/(1 + e)`
/// for `e = exp(−2|t|)`, which never overflows (a device's own `tanh` may, far out).
const GELU_MUL: &str = "fn op(g: f32, u: f32) -> f32 {
    let t = 0.7978846 * (g + 0.044715 * g * g * g);
    let e = exp(-2.0 * abs(t));
    let tanh = sign(t) * ((1.0 - e) / (1.0 + e));
    return 0.5 * g * (1.0 + tanh) * u;
}";

/// Two inputs to one output of the first's length: of one length (`forward`), or the second a
/// row repeated along the first (`forward_rows`).
pub struct Elementwise {
    kernel: Kernel,
}

impl Elementwise {
    fn new(gpu: &Gpu, name: &'static str, op: &str) -> Result<Self> {
        let source = format!("{}\n{op}\n", include_str!("shaders/elementwise.wgsl"));
        Ok(Elementwise { kernel: Kernel::new(gpu, name, &source)? })
    }

    /// `a + b`.
    pub fn add(gpu: &Gpu) -> Result<Self> {
        Self::new(gpu, "add", ADD)
    }

    /// `a · b` (with [`Self::forward_rows`] and a one-value `b`: a scale).
    pub fn mul(gpu: &Gpu) -> Result<Self> {
        Self::new(gpu, "mul", MUL)
    }

    /// `silu(a) · b`.
    pub fn silu_mul(gpu: &Gpu) -> Result<Self> {
        Self::new(gpu, "silu_mul", SILU_MUL)
    }

    /// `a · sigmoid(b)`.
    pub fn sigmoid_mul(gpu: &Gpu) -> Result<Self> {
        Self::new(gpu, "sigmoid_mul", SIGMOID_MUL)
    }

    /// `gelu_tanh(a) · b`.
    pub fn gelu_mul(gpu: &Gpu) -> Result<Self> {
        Self::new(gpu, "gelu_mul", GELU_MUL)
    }

    pub fn forward(&self, step: &mut Step<'_>, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        if a.len() != b.len() {
            return Err(GpuError::BadInput(format!(
                "inputs of {} and {} values",
                a.len(),
                b.len()
            )));
        }
        self.record(step, a, b)
    }

    /// `x` (rows, width) with `row` (width) on every row.
    pub fn forward_rows(
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
        self.record(step, x, row)
    }

    fn record(&self, step: &mut Step<'_>, a: &GpuTensor, b: &GpuTensor) -> Result<GpuTensor> {
        let y = step.gpu.output(a.len());
        let params = [count(a.len(), "values")?, count(b.len().max(1), "row width")?];
        let groups = count(a.len().div_ceil(64), "groups")?;
        self.kernel.record(step, &[&a.buffer, &b.buffer, &y.buffer], &params, (groups, 1));
        Ok(y)
    }
}

/// One vector added to every row of a tensor (a projection's bias).
pub struct AddRows {
    add: Elementwise,
}

impl AddRows {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(AddRows { add: Elementwise::new(gpu, "add_rows", ADD)? })
    }

    /// `x` (rows, width) + `row` (width) on every row.
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        x: &GpuTensor,
        row: &GpuTensor,
    ) -> Result<GpuTensor> {
        self.add.forward_rows(step, x, row)
    }
}
