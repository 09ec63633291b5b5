//! One weight matrix (or stack of experts' matrices) as loaded: kept in its GGUF quantization,
//! or dense f32; and the cuts and joins that stay in its storage type (an expert out of a stack,
//! rows stacked under rows).

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};

/// A weight that is either kept quantized (GGUF) or dense f32 (safetensors, or f16/f32 GGUF).
pub enum Weight {
    Quantized(Arc<QTensor>),
    Dense(Tensor),
}

impl Weight {
    /// Expert `e` of a stacked `(experts, rows, cols)` weight, as a `(rows, cols)` matrix in the
    /// same storage type (quantized experts are byte ranges of the stack).
    pub fn expert(&self, e: usize) -> Result<Weight> {
        Ok(match self {
            Self::Dense(t) => Self::Dense(t.get(e)?),
            Self::Quantized(q) => {
                let (experts, rows, cols) = q.shape().dims3()?;
                let data = q.data()?;
                let size = data.len() / experts;
                let bytes = Cow::Borrowed(&data[e * size..(e + 1) * size]);
                let storage = QStorage::from_data(bytes, &Device::Cpu, q.dtype())?;
                Self::Quantized(Arc::new(QTensor::new(storage, (rows, cols))?))
            }
        })
    }

    /// The quantization of a quantized weight, `None` for a dense one.
    pub fn storage_type(&self) -> Option<GgmlDType> {
        match self {
            Self::Quantized(q) => Some(q.dtype()),
            Self::Dense(_) => None,
        }
    }

    /// Output rows of a matrix.
    pub fn rows(&self) -> Result<usize> {
        Ok(match self {
            Self::Quantized(q) => q.shape().dims2()?.0,
            Self::Dense(t) => t.dims2()?.0,
        })
    }

    /// The rows of `self`, then those of `below` (same width and storage type).
    pub fn stack_rows(&self, below: &Weight) -> Result<Weight> {
        Ok(match (self, below) {
            (Self::Dense(a), Self::Dense(b)) => Self::Dense(Tensor::cat(&[a, b], 0)?),
            (Self::Quantized(a), Self::Quantized(b)) if a.dtype() == b.dtype() => {
                let ((ra, cols), (rb, _)) = (a.shape().dims2()?, b.shape().dims2()?);
                let bytes = [a.data()?.as_ref(), b.data()?.as_ref()].concat();
                let storage = QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, a.dtype())?;
                Self::Quantized(Arc::new(QTensor::new(storage, (ra + rb, cols))?))
            }
            (a, b) => {
                return Err(ModelError::BadConfig(format!(
                    "cannot stack {:?} rows under {:?} rows (None: dense)",
                    b.storage_type(),
                    a.storage_type()
                )))
            }
        })
    }

    #[cfg(test)]
    fn to_dense(&self) -> Result<Tensor> {
        Ok(match self {
            Self::Dense(t) => t.clone(),
            Self::Quantized(q) => q.dequantize(&Device::Cpu)?,
        })
    }

    /// A second handle on the same data (quantized data is shared, dense tensors are ref-counted).
    pub fn share(&self) -> Weight {
        match self {
            Self::Quantized(q) => Self::Quantized(q.clone()),
            Self::Dense(t) => Self::Dense(t.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(w: &Weight) -> Vec<f32> {
        w.to_dense().unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn quantized_experts_and_stacked_rows_are_exact_byte_slices() {
        let values: Vec<f32> =
            (0..3 * 4 * 64).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let stack = Tensor::from_vec(values, (3, 4, 64), &Device::Cpu).unwrap();
        let q = Weight::Quantized(Arc::new(QTensor::quantize(&stack, GgmlDType::Q8_0).unwrap()));
        let whole = dense(&q);
        for e in 0..3 {
            let expert = q.expert(e).unwrap();
            assert!(matches!(expert, Weight::Quantized(_)));
            assert_eq!(dense(&expert), whole[e * 256..(e + 1) * 256]);
        }
        let joined = q.expert(2).unwrap().stack_rows(&q.expert(0).unwrap()).unwrap();
        assert!(matches!(joined, Weight::Quantized(_)));
        assert_eq!(dense(&joined), [&whole[512..768], &whole[..256]].concat());
        let dense_stack = Weight::Dense(stack);
        assert_eq!(
            dense(&dense_stack.expert(1).unwrap()),
            dense(&Weight::Dense(
                Tensor::from_vec(dense(&dense_stack)[256..512].to_vec(), (4, 64), &Device::Cpu)
                    .unwrap()
            ))
        );
        // Mixed storage types are never stacked (they would have to be dequantized).
        assert!(dense_stack.expert(1).unwrap().stack_rows(&q.expert(0).unwrap()).is_err());
    }
}
