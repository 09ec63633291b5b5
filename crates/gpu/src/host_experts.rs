//! A MoE block's routed experts kept in system RAM (a placement's spilled blocks): the CPU's own
//! experts and kernels (`spindle_models::gguf_experts`, `routed_sum`), fed the rows the device
//! normed and the experts its router chose. The device's step stops at such a block, reads back
//! the block's rows, expert ids and weights, and resumes with the sum uploaded; the shared expert
//! and everything else stay on the device.

use candle_core::{Device, Tensor};
use spindle_models::{Routing, WeightSource};

use crate::error::{GpuError, Result};

pub(crate) struct HostExperts {
    experts: Vec<spindle_models::GatedMlp>,
}

impl HostExperts {
    /// Block `p`'s (`blk.3`) `count` experts from the file's stacks, in their stored format.
    pub(crate) fn load(
        weights: &mut WeightSource,
        p: &str,
        count: usize,
    ) -> spindle_models::Result<Self> {
        Ok(HostExperts { experts: spindle_models::gguf_experts(weights, p, count)? })
    }

    /// Per token of `rows` (tokens × `hidden`), its chosen experts' outputs times their weights,
    /// summed in expert order as the device sums them: `ids` and `weights` hold `top_k` a token,
    /// as the router kernel wrote them.
    pub(crate) fn forward(
        &self,
        rows: Vec<f32>,
        hidden: usize,
        ids: &[u32],
        weights: &[f32],
        top_k: usize,
    ) -> Result<Vec<f32>> {
        let tokens = rows.len().checked_div(hidden).unwrap_or(0);
        let count = self.experts.len();
        if top_k == 0
            || tokens * hidden != rows.len()
            || ids.len() != tokens * top_k
            || weights.len() != ids.len()
            || ids.iter().any(|&id| id as usize >= count)
        {
            return Err(GpuError::BadInput(format!(
                "{} values of rows {hidden} wide routed to {} experts ({top_k} a token) among {count}",
                rows.len(),
                ids.len()
            )));
        }
        let choices = ids
            .chunks_exact(top_k)
            .zip(weights.chunks_exact(top_k))
            .map(|(ids, weights)| ids.iter().map(|&id| id as usize).zip(weights.iter().copied()))
            .map(Iterator::collect)
            .collect();
        let x = Tensor::from_vec(rows, (tokens, hidden), &Device::Cpu).map_err(host_error)?;
        spindle_models::routed_sum(&self.experts, &x, &Routing { choices }).map_err(host_error)
    }
}

fn host_error(e: impl std::fmt::Display) -> GpuError {
    GpuError::Host(format!("the routed experts in system RAM: {e}"))
}
