//! Rewriting a GGUF file with its weights in other storage types, for the tests that check
//! how each type loads and multiplies.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Content};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

/// Writes `src` to `dst` with every matrix (2-D, or 3-D stacked experts) in `dtype`, or in F16
/// where its rows do not fit `dtype`'s blocks (dense f32 once loaded, on every load path, and
/// half F32's bytes to write and read); vectors are kept. Returns how many are in `dtype`.
pub fn rewrite_gguf(src: &Path, dst: &Path, dtype: GgmlDType) -> usize {
    let types = rewrite_gguf_with(src, dst, |_| dtype);
    types.iter().filter(|&&t| t == dtype).count()
}

/// Writes `src` to `dst` with each matrix in the type `choose` gives for its name, or
/// in F16 where its rows do not fit that type's blocks; vectors are kept. Returns the type each
/// matrix was written in.
pub fn rewrite_gguf_with(
    src: &Path,
    dst: &Path,
    choose: impl Fn(&str) -> GgmlDType,
) -> Vec<GgmlDType> {
    let mut file = std::fs::File::open(src).unwrap();
    // Buffered: the header is read a value at a time, and gemma3's vocabulary is 262,144 tokens.
    let content = Content::read(&mut std::io::BufReader::new(&mut file)).unwrap();
    let mut types = Vec::new();
    let tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let q = content.tensor(&mut file, name, &Device::Cpu).unwrap();
            let dims = q.shape().dims().to_vec();
            if dims.len() < 2 {
                return (name.clone(), q);
            }
            let chosen = choose(name);
            let fits = dims[dims.len() - 1].is_multiple_of(chosen.block_size());
            let dtype = if fits { chosen } else { GgmlDType::F16 };
            types.push(dtype);
            let w = q.dequantize(&Device::Cpu).unwrap();
            (name.clone(), QTensor::quantize(&w, dtype).unwrap())
        })
        .collect();
    let metadata: Vec<(&str, &gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::io::BufWriter::new(std::fs::File::create(dst).unwrap());
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    std::io::Write::flush(&mut out).unwrap();
    types
}
