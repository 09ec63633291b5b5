//! The hybrid models' Gated DeltaNet layer on the device, as the CPU's `GatedDeltaNet` runs it:
//! the in-projections (q, k and v as the convolution's channels, z, b, a), the mixing chain of
//! [`LinearAttention`] from each sequence's state slot, and the output projection.

use spindle_models::{ModelError, WeightSource};

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
        if w.contains(&format!("{p}.ssm_ba.weight")) {
            // Qwen3-Next's b and a rows come grouped per key head; the CPU regroups them.
            return Err(ModelError::BadConfig(format!(
                "on the GPU: {p}.ssm_ba (Qwen3-Next's fused b and a) is not yet supported"
            )));
        }
        let mut matrix = |name: &str| upload_matrix(gpu, w.weight(&format!("{p}.{name}.weight"))?);
        let (qkv, z, b, a, out) = (
            matrix("attn_qkv")?,
            matrix("attn_gate")?,
            matrix("ssm_beta")?,
            matrix("ssm_alpha")?,
            matrix("ssm_out")?,
        );
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
