//! Loading GGUF weights of other storage types: SmolLM2's Q4_1 GGUF is rewritten with every
//! matrix requantized to F16, BF16 or Q8_0 (candle's quantizer, ggml's block formats), loaded
//! through `load_gguf`, and teacher-forced over llama.cpp's greedy tokens. (Requantizing to a
//! 4-bit type rounds twice and no longer tracks llama.cpp's run of the original file.)

mod common;

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Content};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

fn requantized(src: &Path, dst: &Path, dtype: GgmlDType) {
    let mut file = std::fs::File::open(src).unwrap();
    let content = Content::read(&mut file).unwrap();
    let tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let q = content.tensor(&mut file, name, &Device::Cpu).unwrap();
            let q = if q.shape().rank() == 2 {
                QTensor::quantize(&q.dequantize(&Device::Cpu).unwrap(), dtype).unwrap()
            } else {
                q
            };
            (name.clone(), q)
        })
        .collect();
    let metadata: Vec<(&str, &gguf_file::Value)> = content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(dst).unwrap(), &metadata, &tensors).unwrap();
}

fn check(dtype: GgmlDType, near_tie: f64, min_agreement: f64) {
    let fx = common::Fixture::smollm2();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    requantized(&fx.gguf, &path, dtype);
    let model = spindle_models::load_gguf(&path).unwrap().model;
    fx.assert_follows(model.as_ref(), near_tie, min_agreement);
}

#[test]
fn f16_weights() {
    check(GgmlDType::F16, 0.15, 0.9);
}

#[test]
fn bf16_weights() {
    check(GgmlDType::BF16, 0.15, 0.9);
}

#[test]
fn q8_0_weights() {
    // Q8_0 activations and a second weight rounding: near-ties up to 0.5 nats may flip.
    check(GgmlDType::Q8_0, 0.5, 0.9);
}
