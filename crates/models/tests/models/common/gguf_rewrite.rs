//! Rewriting a GGUF file with its weights in another storage type, for the tests that check
//! how each type loads and multiplies.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Content};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

/// Writes `src` to `dst` with every matrix (2-D, or 3-D stacked experts) in `dtype`, or in F32
/// where its rows do not fit `dtype`'s blocks; vectors are kept. Returns how many are in `dtype`.
pub fn rewrite_gguf(src: &Path, dst: &Path, dtype: GgmlDType) -> usize {
    let mut file = std::fs::File::open(src).unwrap();
    let content = Content::read(&mut file).unwrap();
    let mut requantized = 0;
    let tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let q = content.tensor(&mut file, name, &Device::Cpu).unwrap();
            let dims = q.shape().dims().to_vec();
            if dims.len() < 2 {
                return (name.clone(), q);
            }
            let fits = dims[dims.len() - 1].is_multiple_of(dtype.block_size());
            requantized += usize::from(fits);
            let w = q.dequantize(&Device::Cpu).unwrap();
            (
                name.clone(),
                QTensor::quantize(&w, if fits { dtype } else { GgmlDType::F32 }).unwrap(),
            )
        })
        .collect();
    let metadata: Vec<(&str, &gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(dst).unwrap(), &metadata, &tensors).unwrap();
    requantized
}
