//! A step of [`GpuHybrid`] in parts: one submission from the embedding to the logits, cut
//! before each block whose routed experts a placement left in system RAM. There the part reads
//! back the block's normed rows and its router's choice; the block's shared expert goes to the
//! device in a submission of its own, which runs while the CPU runs the routed experts; and the
//! next part begins from their sum, uploaded. Everything else stays on the device.

use std::sync::Arc;

use super::{FeedForward, GpuHybrid, TokenMixer};
use crate::attention::PagedRows;
use crate::buffer::GpuTensor;
use crate::error::Result;
use crate::host_experts::HostExperts;
use crate::kv_pools::LayerPools;
use crate::moe::{RoutedExperts, SharedExpert, SparseMoe};
use crate::resident_states::StepSlots;
use crate::rope::RopeTable;
use crate::step::{Readback, Step};

impl GpuHybrid {
    /// Records a step's part: from the embedding (`Start::Embedding`), from the residual
    /// stream of the blocks on the CPU, or from a block whose routed experts ran on the host,
    /// through the blocks until the next such block (where it
    /// stops, reading back what the host needs) or through the final norm and the head on the
    /// rows `inputs.wanted` (first row, rows).
    fn record<'m>(
        &'m self,
        step: &mut Step<'_>,
        inputs: &StepInputs<'_>,
        start: Start,
    ) -> Result<Stop<'m>> {
        let k = &self.kernels;
        let eps = self.cfg.rms_norm_eps as f32;
        let (first, mut x) = match start {
            Start::Embedding => (0, k.embed.forward(step, &self.embed, inputs.ids)?),
            Start::FromCpu(x) => (0, x),
            Start::After(resume) => {
                let out = k.ffn.moe_end(step, &resume.sum, &resume.shared)?;
                (resume.block + 1, k.add.forward(step, &resume.x, &out)?)
            }
        };
        // A block's DeltaNet states and KV pool are numbered among its kind.
        let (mut linear, mut pools) = (0, 0);
        for (block, layer) in self.layers.iter().enumerate() {
            let (linear_slot, pool) = (linear, pools);
            match layer.mixer {
                TokenMixer::Linear(_) => linear += 1,
                TokenMixer::Full(_) => pools += 1,
            }
            if block < first {
                continue;
            }
            let h = k.norm.forward(step, &x, &layer.input_norm, eps)?;
            let mixed = match &layer.mixer {
                TokenMixer::Linear(net) => {
                    let layer_states = inputs.states.layer(linear_slot)?;
                    let kernels = (&k.products, &k.linear);
                    net.forward(step, kernels, &h, layer_states, &inputs.states.runs)?
                }
                TokenMixer::Full(attn) => {
                    let place = (inputs.groups, pool);
                    k.attention.forward(step, &k.products, attn, &h, place, inputs.rope)?
                }
            };
            x = k.add.forward(step, &x, &mixed)?;
            let h = k.norm.forward(step, &x, &layer.post_attention_norm, eps)?;
            let out = match &layer.ffn {
                FeedForward::Moe(moe) => match &moe.experts {
                    RoutedExperts::Device(_) => k.ffn.moe(step, &k.products, moe, &h)?,
                    RoutedExperts::Host(experts) => {
                        let routed = k.ffn.route(step, &k.products, moe, &h)?;
                        return Ok(Stop::HostExperts(Box::new(Paused {
                            block,
                            rows: step.read(&h),
                            ids: step.read(&routed.ids),
                            weights: step.read(&routed.weights),
                            h,
                            x,
                            moe,
                            experts,
                        })));
                    }
                },
                FeedForward::Dense(mlp) => k.ffn.mlp(step, &k.products, mlp, &h)?,
            };
            x = k.add.forward(step, &x, &out)?;
        }
        // Normed per row either way: all rows where a draft head wants them, else the wanted.
        let width = self.cfg.hidden_size;
        let (normed, all) = if inputs.keep_hidden {
            let all = k.norm.forward(step, &x, &self.norm, eps)?;
            (step.gather_rows(&all, width, inputs.wanted)?, Some(step.read(&all)))
        } else {
            let picked = step.gather_rows(&x, width, inputs.wanted)?;
            (k.norm.forward(step, &picked, &self.norm, eps)?, None)
        };
        let logits =
            k.products.forward(step, self.head.as_ref().unwrap_or(&self.embed), &normed)?;
        Ok(Stop::Logits(step.read(&logits), all))
    }

    /// Runs a step's submissions, the routed experts in system RAM between them, to the
    /// logits, and every row's final hidden state where `inputs` keeps them (the DeltaNet
    /// states stay on the device, moved on).
    pub(super) fn run_step(&self, inputs: &StepInputs<'_>) -> Result<(Readback, Option<Readback>)> {
        let mut start = match inputs.from_cpu {
            Some(x) => Start::FromCpu(self.gpu.upload_for_step(x)?),
            None => Start::Embedding,
        };
        loop {
            match self.gpu.run(|step| self.record(step, inputs, start))? {
                Stop::Logits(logits, hidden) => return Ok((logits, hidden)),
                Stop::HostExperts(paused) => {
                    let Paused { block, rows, ids, weights, h, x, moe, experts } = *paused;
                    let (rows, ids, weights) = (rows.values()?, ids.words()?, weights.values()?);
                    let (ffn, products) = (&self.kernels.ffn, &self.kernels.products);
                    let shared = self.gpu.submit(|step| ffn.shared(step, products, moe, &h))?;
                    let hidden = self.cfg.hidden_size;
                    let sum = experts.forward(rows, hidden, &ids, &weights, moe.top_k)?;
                    let sum = self.gpu.upload_for_step(&sum)?;
                    start = Start::After(Box::new(Resume { block, x, shared, sum }));
                }
            }
        }
    }
}

/// What every part of a step reads: the tokens, the attention layers' pools and positions, the
/// DeltaNet states, and the rows whose logits are wanted.
pub(super) struct StepInputs<'a> {
    pub(super) ids: &'a [u32],
    /// The residual stream the blocks on the CPU handed over, where the placement runs some.
    pub(super) from_cpu: Option<&'a [f32]>,
    pub(super) groups: &'a [(Arc<LayerPools>, PagedRows)],
    pub(super) rope: &'a RopeTable,
    pub(super) states: &'a StepSlots<'a>,
    pub(super) wanted: &'a [(usize, usize)],
    /// Whether every row's final hidden state (after the final norm) is read back, for a
    /// draft head.
    pub(super) keep_hidden: bool,
}

/// Where a step's part begins.
enum Start {
    Embedding,
    /// The residual stream after the blocks on the CPU.
    FromCpu(GpuTensor),
    After(Box<Resume>),
}

/// After block `block`'s routed experts ran on the host: the residual stream `x` before the
/// block's feed-forward, its shared expert (submitted), and the routed experts' `sum`,
/// uploaded.
struct Resume {
    block: usize,
    x: GpuTensor,
    shared: SharedExpert,
    sum: GpuTensor,
}

/// Where a step's part stopped.
enum Stop<'m> {
    /// The step is done: its logits, and every row's final hidden state where kept, read.
    Logits(Readback, Option<Readback>),
    /// Before a block's routed experts in system RAM.
    HostExperts(Box<Paused<'m>>),
}

/// A step stopped before block `block`'s routed experts in system RAM.
struct Paused<'m> {
    block: usize,
    /// The block's normed rows, and each row's `top_k` experts and weights, read back.
    rows: Readback,
    ids: Readback,
    weights: Readback,
    /// The normed rows on the device, for the shared expert.
    h: GpuTensor,
    /// The residual stream before the block's feed-forward.
    x: GpuTensor,
    moe: &'m SparseMoe,
    experts: &'m HostExperts,
}
