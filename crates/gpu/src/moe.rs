//! The hybrid models' feed-forward block on the device: a gated MLP (`down(silu(gate·x) ·
//! up·x)`), and the sparse mixture of experts as the CPU's `SparseMoe` runs it: the router's
//! softmax and top-k per token, each chosen expert's output times its weight added in expert
//! order, then the shared expert's times its sigmoid gate.
//!
//! Each token runs only the experts it chose: routing slot `j` of every token (its `j`-th
//! chosen expert in expert order) is one gathered product per matrix, each token reading its own
//! expert's rows out of the stacked experts, so a row's arithmetic never depends on which rows
//! share the step, and the routing never goes back to the host mid-step. A block whose routed
//! experts a placement left in system RAM records [`FeedForwardKernels::moe_start`], runs them on
//! the host, and [`FeedForwardKernels::moe_end`] in the next submission.

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::elementwise::Elementwise;
use crate::error::{GpuError, Result};
use crate::host_experts::HostExperts;
use crate::kernel::{count, Kernel};
use crate::loading::Products;
use crate::matmul::{GatheredMatmul, GpuMatrix, WeightFormat};
use crate::step::Step;

/// Most experts a token's router picks (`MAX_TOP_K` in `moe_route.wgsl`).
pub const MAX_TOP_K: usize = 32;

/// `down(silu(gate · x) · (up · x))`.
pub(crate) struct GatedMlp {
    pub(crate) gate: GpuMatrix,
    pub(crate) up: GpuMatrix,
    pub(crate) down: GpuMatrix,
}

impl GatedMlp {
    pub(crate) fn matrices(&self) -> [&GpuMatrix; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

pub(crate) struct SparseMoe {
    /// `experts × hidden`.
    pub(crate) router: GpuMatrix,
    pub(crate) experts: RoutedExperts,
    pub(crate) expert_count: usize,
    pub(crate) top_k: usize,
    pub(crate) normalize_top_k: bool,
    pub(crate) shared: GatedMlp,
    /// `1 × hidden`.
    pub(crate) shared_gate: GpuMatrix,
}

/// Where a block's routed experts are (its [`crate::Placement`]).
pub(crate) enum RoutedExperts {
    /// Every expert's gate, up and down matrices on the device, stacked expert after expert,
    /// as the file stores them.
    Device(GatedMlp),
    /// In system RAM, run by the CPU's kernels between two submissions of the step.
    Host(HostExperts),
}

impl SparseMoe {
    /// The matrices the plain product kernels run (the stacks run gathered).
    pub(crate) fn matrices(&self) -> impl Iterator<Item = &GpuMatrix> {
        self.shared.matrices().into_iter().chain([&self.router, &self.shared_gate])
    }

    /// The expert stacks on the device; none when the experts are in system RAM.
    pub(crate) fn stacks(&self) -> Vec<&GpuMatrix> {
        match &self.experts {
            RoutedExperts::Device(stacks) => stacks.matrices().into(),
            RoutedExperts::Host(_) => Vec::new(),
        }
    }
}

/// A block's shared expert on its rows: the output and the gate's logit per row.
pub(crate) struct SharedExpert {
    out: GpuTensor,
    gate: GpuTensor,
}

/// A step's routing: per token, its `top_k` experts in expert order (u32 values in a tensor's
/// buffer) and their weights.
pub struct Routed {
    pub ids: GpuTensor,
    pub weights: GpuTensor,
}

/// The router's choice per token (`moe_route.wgsl`), as `spindle_models::Routing`: softmax,
/// top-k (ties to the lower expert), renormalised when asked.
pub struct MoeRoute {
    kernel: Kernel,
}

impl MoeRoute {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let source = include_str!("shaders/moe_route.wgsl");
        Ok(MoeRoute { kernel: Kernel::new(gpu, "moe_route", source)? })
    }

    /// `logits` (tokens × `experts`) → each token's `top_k` experts and weights.
    pub fn forward(
        &self,
        step: &mut Step<'_>,
        logits: &GpuTensor,
        experts: usize,
        top_k: usize,
        normalize: bool,
    ) -> Result<Routed> {
        let tokens = logits.len().checked_div(experts).unwrap_or(0);
        if top_k == 0 || top_k > experts.min(MAX_TOP_K) || tokens * experts != logits.len() {
            return Err(GpuError::BadInput(format!(
                "top {top_k} of {experts} experts (at most {MAX_TOP_K}) over {} logits",
                logits.len()
            )));
        }
        let routed = Routed {
            ids: step.gpu.output(tokens * top_k),
            weights: step.gpu.output(tokens * top_k),
        };
        let params = [
            count(tokens, "tokens")?,
            count(experts, "experts")?,
            count(top_k, "top k")?,
            u32::from(normalize),
        ];
        let buffers = [&logits.buffer, &routed.ids.buffer, &routed.weights.buffer];
        let groups = (count(tokens.div_ceil(64), "routing groups")?, 1);
        self.kernel.record(step, &buffers, &params, groups);
        Ok(routed)
    }
}

/// The feed-forward kernels, compiled once.
pub(crate) struct FeedForwardKernels {
    silu_mul: Elementwise,
    route: MoeRoute,
    /// One per format the expert stacks have.
    gathered: Vec<GatheredMatmul>,
    /// `a + b · s` (an expert's weight).
    weighted_add: Kernel,
    /// `a + b · sigmoid(s)` (the shared expert's gate).
    gated_add: Kernel,
}

impl FeedForwardKernels {
    /// The kernels for experts stacked in `stacks`.
    pub(crate) fn new<'a>(
        gpu: &Gpu,
        stacks: impl IntoIterator<Item = &'a GpuMatrix>,
    ) -> Result<Self> {
        let scaled = |name, scale: &str| {
            let source = format!("{}\n{scale}\n", include_str!("shaders/scaled_add.wgsl"));
            Kernel::new(gpu, name, &source)
        };
        let mut formats: Vec<WeightFormat> = stacks.into_iter().map(GpuMatrix::format).collect();
        formats.sort_by_key(|f| *f as u8);
        formats.dedup();
        Ok(FeedForwardKernels {
            silu_mul: Elementwise::silu_mul(gpu)?,
            route: MoeRoute::new(gpu)?,
            gathered: formats
                .iter()
                .map(|&f| GatheredMatmul::new(gpu, f))
                .collect::<Result<_>>()?,
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

    /// The block's output for the rows `x` (tokens × hidden), its routed experts on the device.
    pub(crate) fn moe(
        &self,
        step: &mut Step<'_>,
        products: &Products,
        moe: &SparseMoe,
        x: &GpuTensor,
    ) -> Result<GpuTensor> {
        let RoutedExperts::Device(stacks) = &moe.experts else {
            return Err(GpuError::BadInput(
                "routed experts in system RAM run between submissions, not in one".into(),
            ));
        };
        let routed = self.route(step, products, moe, x)?;
        let shared = self.shared(step, products, moe, x)?;
        let (experts, top_k) = (moe.expert_count, moe.top_k);
        let (width, hidden) = (stacks.gate.rows() / experts, stacks.down.rows() / experts);
        // From zeros, as the CPU's sum.
        let mut sum = step.zeros(x.len());
        for slot in 0..top_k {
            let chosen = (&routed.ids, top_k, slot);
            let gate = self.gathered(step, (&stacks.gate, width), x, chosen)?;
            let up = self.gathered(step, (&stacks.up, width), x, chosen)?;
            let mixed = self.silu_mul.forward(step, &gate, &up)?;
            let y = self.gathered(step, (&stacks.down, hidden), &mixed, chosen)?;
            sum = scaled_add(step, &self.weighted_add, &sum, &y, &routed.weights, (top_k, slot))?;
        }
        self.moe_end(step, &sum, &shared)
    }

    /// The routing of the rows `x`: each row's experts and weights.
    pub(crate) fn route(
        &self,
        step: &mut Step<'_>,
        products: &Products,
        moe: &SparseMoe,
        x: &GpuTensor,
    ) -> Result<Routed> {
        let logits = products.forward(step, &moe.router, x)?;
        self.route.forward(step, &logits, moe.expert_count, moe.top_k, moe.normalize_top_k)
    }

    /// The shared expert's output and gate on the rows `x`.
    pub(crate) fn shared(
        &self,
        step: &mut Step<'_>,
        products: &Products,
        moe: &SparseMoe,
        x: &GpuTensor,
    ) -> Result<SharedExpert> {
        let out = self.mlp(step, products, &moe.shared, x)?;
        Ok(SharedExpert { out, gate: products.forward(step, &moe.shared_gate, x)? })
    }

    /// The block's output: the routed experts' weighted `sum`, then the shared expert's output
    /// times its sigmoid gate.
    pub(crate) fn moe_end(
        &self,
        step: &mut Step<'_>,
        sum: &GpuTensor,
        shared: &SharedExpert,
    ) -> Result<GpuTensor> {
        scaled_add(step, &self.gated_add, sum, &shared.out, &shared.gate, (1, 0))
    }

    /// Each token of `x` times its expert in routing slot `slot` of the stack (experts of
    /// `rows` rows each).
    fn gathered(
        &self,
        step: &mut Step<'_>,
        (stack, rows): (&GpuMatrix, usize),
        x: &GpuTensor,
        (ids, top_k, slot): (&GpuTensor, usize, usize),
    ) -> Result<GpuTensor> {
        let kernel = self.gathered.iter().find(|k| k.format() == stack.format());
        let kernel = kernel.ok_or_else(|| {
            GpuError::BadInput(format!("no gathered product for {:?}", stack.format()))
        })?;
        kernel.forward(step, stack, rows, x, ids, (top_k, slot))
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
