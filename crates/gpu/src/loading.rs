//! What every model on the GPU does at load and at each product: a file's weights onto the
//! device as stored, and one product kernel per weight format the file has.

use candle_core::quantized::GgmlDType;
use spindle_models::{ModelError, Weight, WeightSource};

use crate::buffer::GpuTensor;
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::matmul::{GpuMatrix, Matmul, WeightFormat};
use crate::step::Step;

pub(crate) fn model_error(e: GpuError) -> ModelError {
    ModelError::Gpu(e.to_string())
}

/// A weight matrix as the file stores it (quantized blocks, f16/bf16) or as f32.
pub(crate) fn upload_matrix(gpu: &Gpu, weight: Weight) -> spindle_models::Result<GpuMatrix> {
    let (format, rows, cols, bytes) = file_layout(weight)?;
    GpuMatrix::upload(gpu, format, rows, cols, &bytes).map_err(model_error)
}

/// The file's LM head, or `None` when it is tied to the embedding table (no `output.weight`).
pub(crate) fn upload_head(
    gpu: &Gpu,
    weights: &mut WeightSource,
) -> spindle_models::Result<Option<GpuMatrix>> {
    if !weights.contains("output.weight") {
        return Ok(None);
    }
    Ok(Some(upload_matrix(gpu, weights.weight("output.weight")?)?))
}

/// A matrix's format, rows, columns and bytes as the device holds it: a quantized one as the
/// file stores it, a dense one as f32. A stack of experts' matrices (`experts × rows × cols`)
/// is one matrix of `experts · rows` rows.
pub(crate) fn file_layout(
    weight: Weight,
) -> spindle_models::Result<(WeightFormat, usize, usize, Vec<u8>)> {
    let rows_cols = |dims: &[usize]| match dims.split_last() {
        Some((&cols, outer)) if !outer.is_empty() && outer.len() <= 2 => {
            Ok((outer.iter().product(), cols))
        }
        _ => Err(ModelError::BadConfig(format!("a weight of dimensions {dims:?} is no matrix"))),
    };
    Ok(match weight {
        Weight::Quantized(q) => {
            let (rows, cols) = rows_cols(q.shape().dims())?;
            let format = match q.dtype() {
                GgmlDType::F32 => WeightFormat::F32,
                GgmlDType::F16 => WeightFormat::F16,
                GgmlDType::BF16 => WeightFormat::Bf16,
                GgmlDType::Q4_0 => WeightFormat::Q4_0,
                GgmlDType::Q4_1 => WeightFormat::Q4_1,
                GgmlDType::Q5_0 => WeightFormat::Q5_0,
                GgmlDType::Q5_1 => WeightFormat::Q5_1,
                GgmlDType::Q8_0 => WeightFormat::Q8_0,
                GgmlDType::Q2K => WeightFormat::Q2K,
                GgmlDType::Q3K => WeightFormat::Q3K,
                GgmlDType::Q4K => WeightFormat::Q4K,
                GgmlDType::Q5K => WeightFormat::Q5K,
                GgmlDType::Q6K => WeightFormat::Q6K,
                other => {
                    return Err(ModelError::BadConfig(format!(
                        "on the GPU: {other:?} weights are not yet supported"
                    )))
                }
            };
            (format, rows, cols, q.data()?.into_owned())
        }
        Weight::Dense(t) => {
            let (rows, cols) = rows_cols(t.dims())?;
            let values: Vec<f32> = t.flatten_all()?.to_vec1()?;
            (WeightFormat::F32, rows, cols, bytemuck::cast_slice(&values).to_vec())
        }
    })
}

/// A vector of f32 values plus `offset` (Gemma's HF norms' `1 + w`).
pub(crate) fn upload_vector(
    gpu: &Gpu,
    weights: &mut WeightSource,
    name: &str,
    offset: f32,
) -> spindle_models::Result<GpuTensor> {
    let mut values: Vec<f32> = weights.dense(name)?.flatten_all()?.to_vec1()?;
    if offset != 0.0 {
        values.iter_mut().for_each(|v| *v += offset);
    }
    gpu.upload(&values).map_err(model_error)
}

/// One product kernel per weight format a model's matrices have, compiled once.
pub(crate) struct Products {
    kernels: Vec<Matmul>,
}

impl Products {
    pub(crate) fn new<'a>(
        gpu: &Gpu,
        matrices: impl IntoIterator<Item = &'a GpuMatrix>,
    ) -> Result<Self> {
        let mut formats: Vec<WeightFormat> = matrices.into_iter().map(GpuMatrix::format).collect();
        formats.sort_by_key(|f| *f as u8);
        formats.dedup();
        let kernels = formats.iter().map(|&f| Matmul::new(gpu, f)).collect::<Result<_>>()?;
        Ok(Products { kernels })
    }

    /// `x · wᵀ` by the kernel of `w`'s format.
    pub(crate) fn forward(
        &self,
        step: &mut Step<'_>,
        w: &GpuMatrix,
        x: &GpuTensor,
    ) -> Result<GpuTensor> {
        let kernel =
            self.kernels.iter().find(|k| k.format() == w.format()).ok_or_else(|| {
                GpuError::BadInput(format!("no product kernel for {:?}", w.format()))
            })?;
        kernel.forward(step, w, x)
    }
}
