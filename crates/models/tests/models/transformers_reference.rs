//! The model math against Hugging Face transformers (float32, eager attention, CPU), recorded
//! in tests/data/reference/transformers/<model>.json by
//! scripts/reference/make_transformers_fixtures.py. transformers dequantizes the same GGUF file
//! and runs its own modeling code, so we load it the same way ([`load_gguf_f32`]: no activation
//! quantization) and require, with the reference's tokens fed back in (teacher forcing), the
//! same top-1 at every one of the 24 steps of every prompt and log-probabilities of the
//! reference's top-5 tokens within [`common::SAME_WEIGHTS`].
//!
//! crates/runner/tests/runner/reference.rs runs this comparison again through the serving engine, and
//! the quantized fast path against llama.cpp.

use crate::common;

use common::{Reference, SAME_WEIGHTS};
use spindle_models::load_gguf_f32;

fn check_model(name: &str) {
    let (reference, gguf) = Reference::transformers(name);
    let model = load_gguf_f32(&gguf).unwrap();
    reference.assert_followed_by(model.as_ref(), "load_gguf_f32", SAME_WEIGHTS);
}

#[test]
fn smollm2_matches_transformers() {
    check_model("smollm2-135m");
}

#[test]
fn qwen25_coder_matches_transformers() {
    check_model("qwen2.5-coder-0.5b");
}

#[test]
fn gemma3_matches_transformers() {
    check_model("gemma3-270m");
}
