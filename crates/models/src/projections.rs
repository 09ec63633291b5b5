//! Several projections of one input (a gated MLP's gate and up, a linear-attention layer's
//! q/k/v, z, b and a), run as one product when their weights stack: the input is quantized
//! once instead of once per projection, and one larger product splits better across cores.
//! Each output is still the same weight row's dot product with the same input row.

use candle_core::Tensor;

use crate::error::Result;
use crate::linear::Linear;
use crate::weight::Weight;

pub enum Projections {
    /// The weights' rows one under the other, and each projection's width.
    Stacked { linear: Linear, widths: Vec<usize> },
    /// Weights of different storage types (say Q4_K and Q6_K), which cannot share a product.
    Separate(Vec<Linear>),
}

impl Projections {
    pub fn new(weights: Vec<Weight>) -> Result<Self> {
        let stackable =
            weights.windows(2).all(|pair| pair[0].storage_type() == pair[1].storage_type());
        if !stackable {
            return Ok(Self::Separate(
                weights.into_iter().map(|w| Linear::new(w, None)).collect::<Result<_>>()?,
            ));
        }
        let widths = weights.iter().map(Weight::rows).collect::<Result<Vec<_>>>()?;
        let mut parts = weights.into_iter();
        let first = parts.next().expect("at least one projection");
        let stacked = parts.try_fold(first, |above, below| above.stack_rows(&below))?;
        Ok(Self::Stacked { linear: Linear::new(stacked, None)?, widths })
    }

    /// x: (tokens, in) → one (tokens, width) output per projection, in order.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Self::Separate(linears) => linears.iter().map(|l| l.forward(x)).collect(),
            Self::Stacked { linear, widths } => {
                let y = linear.forward(x)?;
                let mut start = 0;
                widths
                    .iter()
                    .map(|&w| {
                        let part = y.narrow(1, start, w)?.contiguous()?;
                        start += w;
                        Ok(part)
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::Device;
    use std::sync::Arc;

    fn weight(rows: usize, cols: usize, seed: usize, dtype: Option<GgmlDType>) -> Weight {
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| (((i + seed) * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.2)
            .collect();
        let t = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
        match dtype {
            Some(d) => Weight::Quantized(Arc::new(QTensor::quantize(&t, d).unwrap())),
            None => Weight::Dense(t),
        }
    }

    #[test]
    fn stacked_projections_give_the_bits_of_separate_ones() {
        let cols = 256;
        let x = Tensor::from_vec(
            (0..3 * cols).map(|i| (i as f32 * 0.29).sin()).collect::<Vec<f32>>(),
            (3, cols),
            &Device::Cpu,
        )
        .unwrap();
        for dtype in [Some(GgmlDType::Q4K), Some(GgmlDType::Q8_0), None] {
            let shapes = [(64, 0), (32, 1), (16, 2)];
            let stacked =
                Projections::new(shapes.iter().map(|&(r, s)| weight(r, cols, s, dtype)).collect())
                    .unwrap();
            assert!(matches!(stacked, Projections::Stacked { .. }));
            let outputs = stacked.forward(&x).unwrap();
            for (&(rows, seed), out) in shapes.iter().zip(&outputs) {
                let alone = Linear::new(weight(rows, cols, seed, dtype), None)
                    .unwrap()
                    .forward(&x)
                    .unwrap();
                assert_eq!(out.dims(), &[3, rows]);
                assert_eq!(
                    out.to_vec2::<f32>().unwrap(),
                    alone.to_vec2::<f32>().unwrap(),
                    "{dtype:?}"
                );
            }
        }
    }

    #[test]
    fn mixed_storage_types_run_separately() {
        let mixed = Projections::new(vec![
            weight(16, 256, 0, Some(GgmlDType::Q4K)),
            weight(16, 256, 1, Some(GgmlDType::Q8_0)),
        ])
        .unwrap();
        assert!(matches!(mixed, Projections::Separate(_)));
        let x = Tensor::ones((2, 256), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert_eq!(mixed.forward(&x).unwrap().len(), 2);
    }
}
