//! Sparse mixture of experts with a shared expert (Qwen3-Next / Qwen3.5 MoE, HF
//! `*SparseMoeBlock`): a softmax router picks the top-k experts per token (their weights
//! renormalised where configured); each chosen expert runs only on the tokens routed to it,
//! grouped into one matrix product per expert; a shared expert runs on every token, scaled by
//! a sigmoid gate.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use crate::error::Result;
use crate::layers::GatedMlp;
use crate::linear::Linear;

pub struct SparseMoe {
    /// `num_experts × hidden`.
    pub router: Linear,
    /// Routed experts: each `down(silu(gate(x)) * up(x))`.
    pub experts: Vec<GatedMlp>,
    pub top_k: usize,
    pub normalize_top_k: bool,
    pub shared: GatedMlp,
    /// `1 × hidden`: the shared expert's gate.
    pub shared_gate: Linear,
}

/// Which experts each token goes to, and with what weight.
#[derive(Debug, PartialEq)]
pub struct Routing {
    /// Per token, `top_k` `(expert, weight)` pairs, most likely first.
    pub choices: Vec<Vec<(usize, f32)>>,
}

impl Routing {
    /// Softmax over the router logits of each token, then its `top_k` experts (ties to the
    /// lower index), renormalised to sum to 1 when `normalize`.
    pub fn from_logits(logits: &[Vec<f32>], top_k: usize, normalize: bool) -> Self {
        let choices = logits
            .iter()
            .map(|row| {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exp: Vec<f32> = row.iter().map(|l| (l - max).exp()).collect();
                let sum: f32 = exp.iter().sum();
                let mut order: Vec<usize> = (0..row.len()).collect();
                order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]).then(a.cmp(&b)));
                let mut top: Vec<(usize, f32)> =
                    order[..top_k].iter().map(|&e| (e, exp[e] / sum)).collect();
                if normalize {
                    let total: f32 = top.iter().map(|(_, p)| p).sum();
                    top.iter_mut().for_each(|(_, p)| *p /= total);
                }
                top
            })
            .collect();
        Self { choices }
    }

    /// Per expert, the tokens routed to it and their weights, in token order.
    fn by_expert(&self, num_experts: usize) -> Vec<(Vec<u32>, Vec<f32>)> {
        let mut groups = vec![(Vec::new(), Vec::new()); num_experts];
        for (token, choices) in self.choices.iter().enumerate() {
            for &(expert, weight) in choices {
                groups[expert].0.push(token as u32);
                groups[expert].1.push(weight);
            }
        }
        groups
    }
}

impl SparseMoe {
    /// `x`: tokens × hidden, f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let logits = self.router.forward(x)?.to_vec2::<f32>()?;
        let routing = Routing::from_logits(&logits, self.top_k, self.normalize_top_k);
        // The routed experts run in parallel with each other and with the shared expert.
        let (routed, shared) = rayon::join(
            || routed_sum(&self.experts, x, &routing),
            || -> Result<Vec<f32>> {
                let gate = candle_nn::ops::sigmoid(&self.shared_gate.forward(x)?)?;
                Ok(self.shared.forward(x)?.broadcast_mul(&gate)?.flatten_all()?.to_vec1()?)
            },
        );
        // The shared expert's output is added after the routed ones'.
        let mut out = routed?;
        out.iter_mut().zip(shared?).for_each(|(o, s)| *o += s);
        Ok(Tensor::from_vec(out, x.dims2()?, &Device::Cpu)?)
    }
}

/// The routed experts' outputs on `x` (tokens × hidden, f32), each times its routing weight,
/// summed per token (tokens × hidden values). Each expert runs once on the tokens routed to
/// it; the outputs are added in expert order, so the sum is the same whatever thread finished
/// first, and a token's does not depend on the tokens beside it. `GpuHybrid` runs the experts it
/// leaves in host memory through this too.
pub fn routed_sum(experts: &[GatedMlp], x: &Tensor, routing: &Routing) -> Result<Vec<f32>> {
    let routed = experts
        .par_iter()
        .zip(routing.by_expert(experts.len()))
        .filter(|(_, (ids, _))| !ids.is_empty())
        .map(|(expert, (ids, weights))| expert_output(expert, x, ids, weights))
        .collect::<Result<Vec<_>>>()?;
    let (tokens, hidden) = x.dims2()?;
    let mut out = vec![0f32; tokens * hidden];
    for (ids, y) in routed {
        for (&token, row) in ids.iter().zip(y.chunks_exact(hidden)) {
            out[token as usize * hidden..][..hidden].iter_mut().zip(row).for_each(|(o, v)| *o += v);
        }
    }
    Ok(out)
}

/// One expert on the rows `ids` of `x`, scaled by each row's routing weight; returns the row
/// indices and the weighted outputs (`ids.len() × hidden`).
fn expert_output(
    expert: &GatedMlp,
    x: &Tensor,
    ids: Vec<u32>,
    weights: Vec<f32>,
) -> Result<(Vec<u32>, Vec<f32>)> {
    let n = ids.len();
    let rows = x.index_select(&Tensor::new(ids.as_slice(), &Device::Cpu)?, 0)?;
    let y = expert.forward(&rows)?;
    let weights = Tensor::from_vec(weights, (n, 1), &Device::Cpu)?;
    Ok((ids, y.broadcast_mul(&weights)?.flatten_all()?.to_vec1()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_the_top_k_and_renormalises() {
        let logits = vec![vec![0.0, 2.0, 1.0, 2.0]];
        let plain = Routing::from_logits(&logits, 2, false);
        let e: Vec<f32> = [0.0f32, 2.0, 1.0, 2.0].iter().map(|l| l.exp()).collect();
        let total: f32 = e.iter().sum();
        // Tie between experts 1 and 3 goes to the lower index first.
        assert_eq!(plain.choices[0], vec![(1, e[1] / total), (3, e[3] / total)]);
        let normalized = Routing::from_logits(&logits, 2, true);
        assert_eq!(normalized.choices[0], vec![(1, 0.5), (3, 0.5)]);
    }

    #[test]
    fn tokens_are_grouped_per_expert_in_order() {
        let routing = Routing { choices: vec![vec![(2, 0.6), (0, 0.4)], vec![(2, 0.9), (1, 0.1)]] };
        let groups = routing.by_expert(3);
        assert_eq!(groups[0], (vec![0], vec![0.4]));
        assert_eq!(groups[1], (vec![1], vec![0.1]));
        assert_eq!(groups[2], (vec![0, 1], vec![0.6, 0.9]));
    }
}
