//! GGUF storage types. gemma3-270m's matrices are rewritten in one type (candle's quantizer,
//! ggml's block layouts) and the new file is loaded twice: `load_gguf` keeps the blocks and
//! multiplies them with 8-bit-quantized activations (the fast path), `load_gguf_f32`
//! dequantizes them to dense f32. Teacher-forced over transformers' tokens, the fast path must
//! follow the f32 path of the same file: that checks the type's routing and dot product apart
//! from the rounding of the weights themselves.
//!
//! gemma3 is the catalogue model with the most matrices whose rows fit K-quants' 256-value
//! blocks: attn_output (1024 columns) and ffn_down (2048), 36 of 127 (SmolLM2 and Qwen2.5 have
//! only ffn_down). The other 91 are then stored as F16, dense f32 in both paths, so the paths
//! differ only where the K-quant matrices are.
//!
//! F32, F16 and BF16 matrices become dense f32 in both paths, so those files are checked
//! against transformers instead, as tests/models/safetensors.rs checks HF checkpoints.

use crate::common;

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use common::gguf_rewrite::rewrite_gguf;
use common::{Reference, Tolerance, BF16_WEIGHTS, F16_WEIGHTS, SAME_WEIGHTS};
use spindle_models::{load_gguf, load_gguf_f32};

const MODEL: &str = "gemma3-270m";
/// Prompts and steps per run, to keep ten runs short: a type routed or multiplied wrongly
/// shows from the first step.
const PROMPTS: usize = 2;
const STEPS: usize = 12;
const MATRICES: usize = 127;
const K_QUANT_MATRICES: usize = 36;

/// transformers' run, shortened, and gemma3 rewritten (see [`rewrite_gguf`]) with `matrices` of
/// its matrices in `dtype`, in a folder that lives as long as the returned guard.
fn rewritten(dtype: GgmlDType, matrices: usize) -> (Reference, PathBuf, tempfile::TempDir) {
    let (reference, gguf) = Reference::transformers(MODEL);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    assert_eq!(rewrite_gguf(&gguf, &path, dtype), matrices);
    (reference.shortened(PROMPTS, STEPS), path, dir)
}

/// The fast path of the rewritten file against its own f32 path.
fn fast_path_follows_f32_path(dtype: GgmlDType, matrices: usize, tol: Tolerance) {
    let (reference, path, _dir) = rewritten(dtype, matrices);
    let f32_path = {
        let model = load_gguf_f32(&path).unwrap();
        reference.recorded(model.as_ref(), &format!("load_gguf_f32 of the {dtype:?} file"))
    };
    let model = load_gguf(&path).unwrap();
    f32_path.assert_followed_by(model.as_ref(), "load_gguf", tol);
}

/// A float file, whose two paths coincide, against transformers.
fn float_file_follows_transformers(dtype: GgmlDType, tol: Tolerance) {
    let (reference, path, _dir) = rewritten(dtype, MATRICES);
    let model = load_gguf(&path).unwrap();
    reference.assert_followed_by(model.as_ref(), &format!("load_gguf of the {dtype:?} file"), tol);
}

/// The fast path quantizes each matmul's input to 8 bits (blocks of 32, of 256 for K-quants),
/// as llama.cpp does; gemma3's outlying activations make that coarse (llama.cpp itself is up to
/// 0.74 from transformers on the original file). Measured (2026-11-23, all 96 steps), largest
/// logprob difference / top-1 changes (widest margin among them): Q4_0 0.96 / 0; Q4_1 0.54 / 3
/// (0.21); Q5_0 0.41 / 3 (0.08); Q8_0 0.59 / 4 (0.38); with only the K-quant matrices
/// quantized and the rest in F16 (2026-11-28), Q4_K 0.74 / 1 (0.01); Q5_K 0.75 / 4 (0.25);
/// Q6_K 0.87 / 2 (0.26). A type decoded or routed wrongly is off by whole nats (Q4_1 without
/// its block minimums: 267); an error of 1% in the activation scale stays within.
const EIGHT_BIT_ACTIVATIONS: Tolerance = Tolerance { logprob: 1.5, near_tie: 0.5 };

#[test]
fn f32_file_matches_transformers() {
    float_file_follows_transformers(GgmlDType::F32, SAME_WEIGHTS);
}

#[test]
fn f16_file_follows_transformers() {
    float_file_follows_transformers(GgmlDType::F16, F16_WEIGHTS);
}

#[test]
fn bf16_file_follows_transformers() {
    float_file_follows_transformers(GgmlDType::BF16, BF16_WEIGHTS);
}

#[test]
fn q4_0_fast_path_follows_f32_path() {
    fast_path_follows_f32_path(GgmlDType::Q4_0, MATRICES, EIGHT_BIT_ACTIVATIONS);
}

#[test]
fn q4_1_fast_path_follows_f32_path() {
    fast_path_follows_f32_path(GgmlDType::Q4_1, MATRICES, EIGHT_BIT_ACTIVATIONS);
}

#[test]
fn q5_0_fast_path_follows_f32_path() {
    fast_path_follows_f32_path(GgmlDType::Q5_0, MATRICES, EIGHT_BIT_ACTIVATIONS);
}

#[test]
fn q5_1_fast_path_follows_f32_path() {
    fast_path_follows_f32_path(GgmlDType::Q5_1, MATRICES, EIGHT_BIT_ACTIVATIONS);
}

#[test]
fn q8_0_fast_path_follows_f32_path() {
    fast_path_follows_f32_path(GgmlDType::Q8_0, MATRICES, EIGHT_BIT_ACTIVATIONS);
}

#[test]
fn q4_k_fast_path_follows_f32_path() {
    fast_path_follows_f32_path(GgmlDType::Q4K, K_QUANT_MATRICES, EIGHT_BIT_ACTIVATIONS);
}

#[test]
fn q5_k_fast_path_follows_f32_path() {
    fast_path_follows_f32_path(GgmlDType::Q5K, K_QUANT_MATRICES, EIGHT_BIT_ACTIVATIONS);
}

#[test]
fn q6_k_fast_path_follows_f32_path() {
    fast_path_follows_f32_path(GgmlDType::Q6K, K_QUANT_MATRICES, EIGHT_BIT_ACTIVATIONS);
}
