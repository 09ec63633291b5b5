//! Products against quantized weights through candle's kernels, with large matrices cut into
//! row shards that run in parallel on rayon.
//!
//! candle's own thread pool is off (see the binary's `set_threads`), so one product runs on
//! one core; without shards the attention projections and the LM head, over half the work of
//! a step, would leave the other cores idle. Every output is still one kernel's dot product of
//! one weight row and one input row, so the bits do not depend on the sharding: shards start
//! at multiples of [`SHARD_ALIGN`] rows, which keeps every column in the same kernel grouping.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use rayon::prelude::*;

use crate::error::Result;

/// Matrices with fewer weights run whole: splitting them costs more than it saves (and MoE
/// experts already run in parallel with each other).
const SHARD_MIN_WEIGHTS: usize = 1 << 21;
/// Shard boundaries fall on multiples of this many rows: candle's repacked x86 kernels work on
/// 16-row tiles, its generic kernels on 4-column groups.
const SHARD_ALIGN: usize = 16;

pub struct QuantizedMatrix {
    shards: Vec<QMatMul>,
}

impl QuantizedMatrix {
    /// Cuts `weight` into up to `shards` row ranges (one unless it is large and its rows align).
    pub fn new(weight: Arc<QTensor>, shards: usize) -> Result<Self> {
        let (rows, cols) = weight.shape().dims2()?;
        let count = if rows * cols >= SHARD_MIN_WEIGHTS && rows.is_multiple_of(SHARD_ALIGN) {
            shards.max(1)
        } else {
            1
        };
        let shards = if count == 1 {
            vec![QMatMul::from_arc(weight)?]
        } else {
            let data = weight.data()?;
            let row_bytes = data.len() / rows;
            let per_shard = rows.div_ceil(count).div_ceil(SHARD_ALIGN) * SHARD_ALIGN;
            (0..rows)
                .step_by(per_shard)
                .map(|first| {
                    let n = per_shard.min(rows - first);
                    let bytes = Cow::Borrowed(&data[first * row_bytes..(first + n) * row_bytes]);
                    let storage = QStorage::from_data(bytes, &Device::Cpu, weight.dtype())?;
                    Ok(QMatMul::from_arc(Arc::new(QTensor::new(storage, (n, cols))?))?)
                })
                .collect::<Result<Vec<_>>>()?
        };
        let matrix = Self { shards };
        // candle repacks a weight for its SIMD kernel on first use; a throwaway product here
        // moves that cost from the first request to load time.
        matrix.forward(&Tensor::zeros((2, cols), DType::F32, &Device::Cpu)?)?;
        Ok(matrix)
    }

    /// x: (tokens, cols) → (tokens, rows)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // candle takes another kernel for a single row of some types (Q6_K on x86, most on
        // ARM), which rounds differently; a second row keeps one kernel for every row count,
        // so a sequence's results do not depend on how many rows share its batch.
        let padded = x.dim(0)? == 1;
        let x = if padded { Tensor::cat(&[x, x], 0)? } else { x.clone() };
        let y = match self.shards.as_slice() {
            [whole] => whole.forward(&x)?,
            shards => {
                let parts = shards
                    .par_iter()
                    .map(|s| s.forward(&x))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&parts, 1)?
            }
        };
        Ok(if padded { y.narrow(0, 0, 1)? } else { y })
    }

    #[cfg(test)]
    fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;

    fn matrix(rows: usize, cols: usize, dtype: GgmlDType) -> Arc<QTensor> {
        let w: Vec<f32> =
            (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.2).collect();
        Arc::new(
            QTensor::quantize(&Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap(), dtype)
                .unwrap(),
        )
    }

    #[test]
    fn shards_give_the_same_bits_as_the_whole_matrix() {
        let (rows, cols) = (2064, 1024); // 129 tiles of 16: shards of unequal length
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0] {
            let weight = matrix(rows, cols, dtype);
            let whole = QuantizedMatrix::new(weight.clone(), 1).unwrap();
            let sharded = QuantizedMatrix::new(weight, 3).unwrap();
            assert_eq!(sharded.shard_count(), 3);
            for tokens in [1, 2, 5] {
                let x: Vec<f32> = (0..tokens * cols).map(|i| (i as f32 * 0.37).sin()).collect();
                let x = Tensor::from_vec(x, (tokens, cols), &Device::Cpu).unwrap();
                let a: Vec<Vec<f32>> = whole.forward(&x).unwrap().to_vec2().unwrap();
                let b: Vec<Vec<f32>> = sharded.forward(&x).unwrap().to_vec2().unwrap();
                assert_eq!(a.len(), tokens);
                assert_eq!(a[0].len(), rows);
                assert!(a == b, "{dtype:?}, {tokens} tokens: sharded product differs");
            }
        }
    }

    #[test]
    fn small_or_unaligned_matrices_stay_whole() {
        assert_eq!(
            QuantizedMatrix::new(matrix(64, 1024, GgmlDType::Q4K), 4).unwrap().shard_count(),
            1
        );
        assert_eq!(
            QuantizedMatrix::new(matrix(2056, 1024, GgmlDType::Q8_0), 4).unwrap().shard_count(),
            1
        );
    }
}
