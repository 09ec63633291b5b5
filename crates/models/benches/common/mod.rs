//! What the kernel benches share: Spindle's own product for a GGML type, as a function.

use candle_core::quantized::GgmlDType;
use candle_core::Tensor;
use spindle_models::{k_quant_kernels_run, BlockFormat, BlockMatrix, Q4KMatrix, Q6KMatrix};

/// A product `x ↦ x Wᵀ`.
pub type Product = Box<dyn Fn(&Tensor) -> Tensor>;

/// Our kernel for `dtype`, as a product function.
pub fn ours(dtype: GgmlDType, rows: usize, cols: usize, data: &[u8]) -> Option<Product> {
    if let Some(format) = BlockFormat::of(dtype) {
        let m = BlockMatrix::new(format, rows, cols, data).unwrap();
        return Some(Box::new(move |x| m.forward(x).unwrap()));
    }
    match dtype {
        GgmlDType::Q4K if k_quant_kernels_run() => {
            let m = Q4KMatrix::new(rows, cols, data).unwrap();
            Some(Box::new(move |x| m.forward(x).unwrap()))
        }
        GgmlDType::Q6K if k_quant_kernels_run() => {
            let m = Q6KMatrix::new(rows, cols, data).unwrap();
            Some(Box::new(move |x| m.forward(x).unwrap()))
        }
        _ => None,
    }
}
