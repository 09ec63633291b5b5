//! Rewriting a GGUF file with its weights in another storage type, for the tests that check
//! how each type loads and multiplies.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Content};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

/// Writes `src` to `dst` with every matrix (2-D, or 3-D stacked experts) in `dtype`, or in F16
/// where its rows do not fit `dtype`'s blocks (dense f32 once loaded, on every load path, and
/// half F32's bytes to write and read); vectors are kept. Returns how many are in `dtype`.
pub fn rewrite_gguf(src: &Path, dst: &Path, dtype: GgmlDType) -> usize {
    let mut file = std::fs::File::open(src).unwrap();
    // Buffered: the header is read a value at a time, and gemma3's vocabulary is 262,144 tokens.
    let content = Content::read(&mut std::io::BufReader::new(&mut file)).unwrap();
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
                QTensor::quantize(&w, if fits { dtype } else { GgmlDType::F16 }).unwrap(),
            )
        })
        .collect();
    let metadata: Vec<(&str, &gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(dst).unwrap());
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    std::io::Write::flush(&mut out).unwrap();
    requantized
}
