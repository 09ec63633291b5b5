//! The hybrid models' feed-forward block on the device: a gated MLP (`down(silu(gate·x) ·
//! up·x)`), and the sparse mixture of experts built of them as the CPU's `SparseMoe` runs it:
//! the router's softmax and top-k per token, each chosen expert's output times its weight added
//! in expert order, then the shared expert's times its sigmoid gate.
//!
//! Every expert runs on every row, an unchosen one with weight 0 (adding `±0` changes no sum),
//! so a row's arithmetic never depends on which rows share the step: the same bits alone or
//! batched, without reading the routing back to the host mid-step. That costs `experts / top_k`
//! times the routed products of running only the chosen experts.

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::elementwise::Elementwise;
use crate::error::{GpuError, Result};
use crate::kernel::{count, Kernel};
use crate::loading::Products;
use crate::matmul::GpuMatrix;
use crate::step::Step;

/// Most experts a token's router picks (`MAX_TOP_K` in `moe_route.wgsl`).
pub const MAX_TOP_K: usize = 32;

/// `down(silu(gate · x) · (up · x))`.
pub(crate) struct GatedMlp {
    pub(crate) gate: GpuMatrix,
    pub(crate) up: GpuMatrix,
    pub(crate) down: GpuMatrix,
}

pub(crate) struct SparseMoe {
    /// `experts × hidden`.
    pub(crate) router: GpuMatrix,
    pub(crate) experts: Vec<GatedMlp>,
    pub(crate) top_k: usize,
    pub(crate) normalize_top_k: bool,
    pub(crate) shared: GatedMlp,
    /// `1 × hidden`.
    pub(crate) shared_gate: GpuMatrix,
}

impl GatedMlp {
    pub(crate) fn matrices(&self) -> [&GpuMatrix; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

impl SparseMoe {
    pub(crate) fn matrices(&self) -> impl Iterator<Item = &GpuMatrix> {
        let mlps = self.experts.iter().chain([&self.shared]);
        mlps.flat_map(GatedMlp::matrices).chain([&self.router, &self.shared_gate])
    }
}

/// The router's choice per token (`moe_route.wgsl`), as `spindle_models::Routing`: softmax,
/// top-k (ties to the lower expert), renormalised when asked, as a dense row of expert weights
/// (0 for the experts not chosen).
pub struct MoeRoute {
    kernel: Kernel,
}

impl MoeRoute {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(MoeRoute {
            kernel: Kernel::new(gpu, "moe_route", include_str!("shaders/moe_route.wgsl"))?,
        })
    }

    /// `logits` (tokens × `experts`) → weights (tokens × `experts`).
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        logits: &GpuTensor,
        experts: usize,
        top_k: usize,
        normalize: bool,
    ) -> Result<GpuTensor> {
        let tokens = logits.len().checked_div(experts).unwrap_or(0);
        if top_k == 0 || top_k > experts.min(MAX_TOP_K) || tokens * experts != logits.len() {
            return Err(GpuError::BadInput(format!(
                "top {top_k} of {experts} experts (at most {MAX_TOP_K}) over {} logits",
                logits.len()
            )));
        }
        let weights = step.gpu.output(logits.len());
        let params = [
            count(tokens, "tokens")?,
            count(experts, "experts")?,
            count(top_k, "top k")?,
            u32::from(normalize),
        ];
        let groups = (count(tokens.div_ceil(64), "routing groups")?, 1);
        self.kernel.record(step, &[&logits.buffer, &weights.buffer], &params, groups);
        Ok(weights)
    }
}

/// The feed-forward kernels, compiled once.
pub(crate) struct FeedForwardKernels {
    silu_mul: Elementwise,
    route: MoeRoute,
    /// `a + b · s` (an expert's weight).
    weighted_add: Kernel,
    /// `a + b · sigmoid(s)` (the shared expert's gate).
    gated_add: Kernel,
}

impl FeedForwardKernels {
    pub(crate) fn new(gpu: &Gpu) -> Result<Self> {
        let scaled = |name, scale: &str| {
            let source = format!("{}\n{scale}\n", include_str!("shaders/scaled_add.wgsl"));
            Kernel::new(gpu, name, &source)
        };
        Ok(FeedForwardKernels {
            silu_mul: Elementwise::silu_mul(gpu)?,
            route: MoeRoute::new(gpu)?,
            weighted_add: scaled("weighted_add", "fn scale(v: f32) -> f32 { return v; }")?,
            gated_add: scaled(
                "gated_add",
                "fn scale(v: f32) -> f32 { return 1.0 / (1.0 + exp(-v)); }",
            )?,
        })
    }

    pub(crate) fn mlp(
        &self,
        step: &mut Step<'_>,
        products: &Products,
        mlp: &GatedMlp,
        x: &GpuTensor,
    ) -> Result<GpuTensor> {
        let gate = products.forward(step, &mlp.gate, x)?;
        let up = products.forward(step, &mlp.up, x)?;
        let mixed = self.silu_mul.forward(step, &gate, &up)?;
        products.forward(step, &mlp.down, &mixed)
    }

    /// The block's output for the rows `x` (tokens × hidden).
    pub(crate) fn moe(
        &self,
        step: &mut Step<'_>,
        products: &Products,
        moe: &SparseMoe,
        x: &GpuTensor,
    ) -> Result<GpuTensor> {
        let experts = moe.experts.len();
        let logits = products.forward(step, &moe.router, x)?;
        let weights = self.route.forward(step, &logits, experts, moe.top_k, moe.normalize_top_k)?;
        // A fresh buffer is zeros: the CPU's sum starts there too.
        let mut sum = step.gpu.output(x.len());
        for (e, expert) in moe.experts.iter().enumerate() {
            let y = self.mlp(step, products, expert, x)?;
            sum = scaled_add(step, &self.weighted_add, &sum, &y, &weights, (experts, e))?;
        }
        let shared = self.mlp(step, products, &moe.shared, x)?;
        let gate = products.forward(step, &moe.shared_gate, x)?;
        scaled_add(step, &self.gated_add, &sum, &shared, &gate, (1, 0))
    }
}

/// `a + b · scale(s[row · stride + offset])` per row of `b` (`a`'s shape), `s` holding `stride`
/// values a row.
fn scaled_add(
    step: &mut Step<'_>,
    kernel: &Kernel,
    a: &GpuTensor,
    b: &GpuTensor,
    s: &GpuTensor,
    (stride, offset): (usize, usize),
) -> Result<GpuTensor> {
    let rows = s.len() / stride;
    if a.len() != b.len() || rows == 0 || s.len() != rows * stride || !a.len().is_multiple_of(rows)
    {
        return Err(GpuError::BadInput(format!(
            "rows of {} and {} values scaled by {} values, {stride} a row",
            a.len(),
            b.len(),
            s.len()
        )));
    }
    let y = step.gpu.output(a.len());
    let params = [
        count(a.len(), "values")?,
        count(a.len() / rows, "row width")?,
        count(stride, "scale stride")?,
        count(offset, "scale offset")?,
    ];
    let groups = (count(a.len().div_ceil(64), "groups")?, 1);
    kernel.record(step, &[&a.buffer, &b.buffer, &s.buffer, &y.buffer], &params, groups);
    Ok(y)
}
