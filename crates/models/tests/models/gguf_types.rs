//! GGUF storage types. gemma3-270m's matrices are rewritten with each layer in one of a family
//! of types (candle's quantizer, ggml's block layouts), as llama.cpp's own quantizations mix
//! types across layers; one file per family keeps three runs short where a file per type took
//! eleven. A type loaded or routed wrongly puts its layers whole nats off, so the family's run
//! shows it.
//!
//! Quantized files are loaded twice: `load_gguf` keeps the blocks and multiplies them with
//! 8-bit-quantized activations (the fast path), `load_gguf_f32` dequantizes them to dense f32.
//! Teacher-forced over transformers' tokens, the fast path must follow the f32 path of the same
//! file: that checks each type's routing and dot product apart from the rounding of the weights
//! themselves. F32, F16 and BF16 matrices become dense f32 in both paths, so the float file is
//! checked against transformers instead, as tests/models/safetensors.rs checks HF checkpoints.
//!
//! gemma3 is the catalogue model with the most matrices whose rows fit K-quants' 256-value
//! blocks: attn_output (1024 columns) and ffn_down (2048), 36 of 127 (SmolLM2 and Qwen2.5 have
//! only ffn_down). The other 91 are then stored as F16, dense f32 in both paths, so the paths
//! differ only where the K-quant matrices are.

use crate::common;

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use common::gguf_rewrite::rewrite_gguf_with;
use common::{Reference, Tolerance, BF16_WEIGHTS};
use spindle_models::{load_gguf, load_gguf_f32};

const MODEL: &str = "gemma3-270m";
/// Prompts and steps per run: a type routed or multiplied wrongly shows from the first step.
const PROMPTS: usize = 2;
const STEPS: usize = 12;
const MATRICES: usize = 127;
const K_QUANT_MATRICES: usize = 36;

/// transformers' run, shortened, and gemma3 rewritten with the matrices of layer `l` in
/// `family[l % family.len()]` (F16 where their rows do not fit its blocks) and those outside
/// the layers in `outside`, in a folder that lives as long as the returned guard. Checks that
/// `family` has `matrices` matrices in all, each of its types some.
fn rewritten(
    family: &[GgmlDType],
    outside: GgmlDType,
    matrices: usize,
) -> (Reference, PathBuf, tempfile::TempDir) {
    let (reference, gguf) = Reference::transformers(MODEL);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let types = rewrite_gguf_with(&gguf, &path, |name| {
        let layer = name.strip_prefix("blk.").and_then(|rest| rest.split('.').next());
        match layer.map(|l| l.parse::<usize>().unwrap()) {
            Some(layer) => family[layer % family.len()],
            None => outside,
        }
    });
    let count = |dtype: &GgmlDType| types.iter().filter(|&t| t == dtype).count();
    assert_eq!(family.iter().map(count).sum::<usize>(), matrices, "{types:?}");
    assert!(family.iter().all(|t| count(t) > 0), "{types:?}");
    (reference.shortened(PROMPTS, STEPS), path, dir)
}

/// The fast path of the rewritten file against its own f32 path.
fn fast_path_follows_f32_path(family: &[GgmlDType], outside: GgmlDType, matrices: usize) {
    let (reference, path, _dir) = rewritten(family, outside, matrices);
    let f32_path = {
        let model = load_gguf_f32(&path).unwrap();
        let names: Vec<String> = family.iter().map(|t| format!("{t:?}")).collect();
        reference
            .recorded(model.as_ref(), &format!("load_gguf_f32 of the {} file", names.join("/")))
    };
    let model = load_gguf(&path).unwrap();
    f32_path.assert_followed_by(model.as_ref(), "load_gguf", EIGHT_BIT_ACTIVATIONS);
}

/// The fast path quantizes each matmul's input to 8 bits (blocks of 32, of 256 for K-quants),
/// as llama.cpp does; gemma3's outlying activations make that coarse (llama.cpp itself is up to
/// 0.74 from transformers on the original file). Measured with a file per type (2026-11-23, all
/// 96 steps), largest logprob difference / top-1 changes (widest margin among them): Q4_0 0.96
/// / 0; Q4_1 0.54 / 3 (0.21); Q5_0 0.41 / 3 (0.08); Q8_0 0.59 / 4 (0.38); with only the K-quant
/// matrices quantized and the rest in F16 (2026-11-28), Q4_K 0.74 / 1 (0.01); Q5_K 0.75 / 4
/// (0.25); Q6_K 0.87 / 2 (0.26). With the families mixed by layer (2026-11-29, 24 steps):
/// the block types 0.34 / 0, the K-quants 0.37 / 2 (0.08); the float file is 2.9e-2 from
/// transformers. A type decoded or routed wrongly is off by whole nats (Q4_1 without its
/// block minimums: 267); an error of 1% in the activation scale stays within.
const EIGHT_BIT_ACTIVATIONS: Tolerance = Tolerance { logprob: 1.5, near_tie: 0.5 };

/// F32, F16 and BF16 layers: BF16's rounding is the widest, so its tolerance holds the file.
#[test]
fn float_types_follow_transformers() {
    let family = [GgmlDType::F32, GgmlDType::F16, GgmlDType::BF16];
    let (reference, path, _dir) = rewritten(&family, GgmlDType::F16, MATRICES);
    let model = load_gguf(&path).unwrap();
    reference.assert_followed_by(model.as_ref(), "load_gguf of the float file", BF16_WEIGHTS);
}

#[test]
fn block_types_fast_path_follows_f32_path() {
    let family =
        [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1, GgmlDType::Q8_0];
    fast_path_follows_f32_path(&family, GgmlDType::Q8_0, MATRICES);
}

#[test]
fn k_quant_types_fast_path_follows_f32_path() {
    let family = [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K];
    fast_path_follows_f32_path(&family, GgmlDType::Q6K, K_QUANT_MATRICES);
}
