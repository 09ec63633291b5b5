//! The hybrid models' Gated DeltaNet layer on the device, as the CPU's `GatedDeltaNet` runs it:
//! the in-projections (q, k and v as the convolution's channels, z, b, a), the mixing chain of
//! [`LinearAttention`] from each sequence's state slot, and the output projection.

use candle_core::{Device, Tensor};
use spindle_models::{Weight, WeightSource};

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::Result;
use crate::linear_attention::{
    LinearAttention, LinearAttentionHostWeights, LinearAttentionWeights, Projected,
};
use crate::linear_state::{DeltaNetShape, LinearRuns, LinearStates};
use crate::loading::{model_error, upload_matrix, Products};
use crate::matmul::GpuMatrix;
use crate::step::Step;

pub(crate) struct DeltaNetLayer {
    qkv: GpuMatrix,
    z: GpuMatrix,
    b: GpuMatrix,
    a: GpuMatrix,
    mixing: LinearAttentionWeights,
    out: GpuMatrix,
}

impl DeltaNetLayer {
    /// Block `p`'s (`blk.0`) layer from a llama.cpp file, whose `ssm_a` already holds
    /// `−exp(A_log)`.
    pub(crate) fn load(
        gpu: &Gpu,
        w: &mut WeightSource,
        p: &str,
        shape: DeltaNetShape,
        norm_eps: f32,
    ) -> spindle_models::Result<Self> {
        let (b, a) = if w.contains(&format!("{p}.ssm_ba.weight")) {
            let [b, a] = b_and_a(w.dense(&format!("{p}.ssm_ba.weight"))?, shape)?;
            (upload_matrix(gpu, b)?, upload_matrix(gpu, a)?)
        } else {
            let mut matrix = |name| upload_matrix(gpu, w.weight(&format!("{p}.{name}.weight"))?);
            (matrix("ssm_beta")?, matrix("ssm_alpha")?)
        };
        let mut matrix = |name: &str| upload_matrix(gpu, w.weight(&format!("{p}.{name}.weight"))?);
        let (qkv, z, out) = (matrix("attn_qkv")?, matrix("attn_gate")?, matrix("ssm_out")?);
        let mut vector = |name: &str| -> spindle_models::Result<Vec<f32>> {
            Ok(w.dense(&format!("{p}.{name}"))?.flatten_all()?.to_vec1()?)
        };
        let (conv, decay) = (vector("ssm_conv1d.weight")?, vector("ssm_a")?);
        let (dt_bias, norm) = (vector("ssm_dt.bias")?, vector("ssm_norm.weight")?);
        let host = LinearAttentionHostWeights {
            conv_weight: &conv,
            neg_decay_rate: &decay,
            dt_bias: &dt_bias,
            norm_weight: &norm,
            norm_eps,
        };
        let mixing = LinearAttentionWeights::upload(gpu, shape, &host).map_err(model_error)?;
        Ok(DeltaNetLayer { qkv, z, b, a, mixing, out })
    }

    pub(crate) fn matrices(&self) -> [&GpuMatrix; 5] {
        [&self.qkv, &self.z, &self.b, &self.a, &self.out]
    }

    /// The layer's output for the normed rows `x`; the sequences' states move on.
    pub(crate) fn forward(
        &self,
        step: &mut Step<'_>,
        (products, mixing): (&Products, &LinearAttention),
        x: &GpuTensor,
        states: &LinearStates,
        runs: &LinearRuns,
    ) -> Result<GpuTensor> {
        let qkv = products.forward(step, &self.qkv, x)?;
        let z = products.forward(step, &self.z, x)?;
        let b = products.forward(step, &self.b, x)?;
        let a = products.forward(step, &self.a, x)?;
        let projected = Projected { qkv: &qkv, z: &z, b: &b, a: &a };
        let core = mixing.forward(step, &self.mixing, &projected, states, runs)?;
        products.forward(step, &self.out, &core)
    }
}

/// Qwen3-Next's `ssm_ba` rows come grouped per key head, `[b (r rows), a (r rows)]` for `r`
/// value heads per key head: the b rows and the a rows of all heads apart, as the CPU regroups
/// them.
fn b_and_a(ba: Tensor, shape: DeltaNetShape) -> spindle_models::Result<[Weight; 2]> {
    let per_group = shape.v_heads / shape.k_heads;
    let rows = |offset: usize| -> spindle_models::Result<Weight> {
        let ids: Vec<u32> = (0..shape.k_heads)
            .flat_map(|g| (0..per_group).map(move |r| (g * 2 * per_group + offset + r) as u32))
            .collect();
        let n = ids.len();
        Ok(Weight::Dense(ba.index_select(&Tensor::from_vec(ids, n, &Device::Cpu)?, 0)?))
    };
    Ok([rows(0)?, rows(per_group)?])
}
