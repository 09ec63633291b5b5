//! The hybrid architectures (Qwen3.5-MoE, Qwen3.5 dense, Qwen3-Next) against Hugging Face
//! transformers: tiny seeded models and their float32 logits, made by
//! scripts/reference/hybrid/make_hybrid_fixtures.py (tests/data/hybrid/<model>/). For each
//! model and prompt (5, 17 and 80 tokens; the 80-token one crosses the delta rule's 64-token
//! chunk), loaded from safetensors:
//! - the prefill's logits at the last position (and at every position of the first prompt);
//! - 16 greedy decode steps, one token at a time, feeding transformers' tokens;
//! - the same sequence run token by token from the start (recurrent form only) and as a split
//!   prefill, against the one-pass prefill (chunked form);
//! - a snapshot of the cache taken after the prompt and resumed twice gives identical logits.
//!
//! The same checks run on the GGUF files llama.cpp's converter layout gives the same weights
//! (tests/data/hybrid/<model>/model.gguf, F32), and a Q8_0 requantization of them must follow
//! the F32 model closely (the quantized experts are byte slices of stacked tensors).

use crate::common;

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use serde::Deserialize;
use spindle_models::{load_gguf, load_gguf_f32, load_safetensors, CausalLm};

/// Largest |logit| difference allowed against transformers. Measured (2026-11-23): 3.0e-4
/// (qwen3_5_moe), 1.4e-4 (qwen3_5), 1.1e-4 (qwen3_next); transformers' own f32 paths (cached
/// decode vs a full recompute) differ by up to 2e-4. The logits are O(10), so a real error shows
/// far above this, and every greedy step must also pick transformers' token.
const TOLERANCE: f32 = 1e-3;

#[derive(Deserialize)]
struct Fixture {
    reference: String,
    prompts: Vec<Prompt>,
}

#[derive(Deserialize)]
struct Prompt {
    ids: Vec<u32>,
    last_logits: Vec<f32>,
    /// Present for the first prompt: the logits at every prompt position.
    #[serde(default)]
    position_logits: Option<Vec<Vec<f32>>>,
    greedy_ids: Vec<u32>,
    /// `step_logits[i]` chose `greedy_ids[i]`; step 0 is the prefill's last position.
    step_logits: Vec<Vec<f32>>,
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[derive(Clone, Copy, Debug)]
enum Format {
    Safetensors,
    Gguf,
}

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid").join(name)
}

fn load(name: &str, format: Format) -> (Box<dyn CausalLm>, Fixture) {
    let dir = dir(name);
    let fixture =
        serde_json::from_str(&std::fs::read_to_string(dir.join("fixture.json")).unwrap()).unwrap();
    let model = match format {
        Format::Safetensors => load_safetensors(&dir),
        Format::Gguf => load_gguf(&dir.join("model.gguf")),
    };
    (model.unwrap(), fixture)
}

fn check_against_transformers(name: &str, format: Format) {
    let (model, fx) = load(name, format);
    let name = format!("{name} ({format:?})");
    let mut worst: f32 = 0.0;
    let mut check = |logits: &[f32], expected: &[f32], what: &str| {
        let d = max_diff(logits, expected);
        worst = worst.max(d);
        assert!(d < TOLERANCE, "{name} {what}: logits differ from {} by {d}", fx.reference);
    };
    for (n, p) in fx.prompts.iter().enumerate() {
        let at = format!("{name} prompt {n} ({} tokens)", p.ids.len());
        let mut cache = model.new_cache(256);
        let logits = model.forward(&p.ids, &mut cache).unwrap();
        check(&logits, &p.last_logits, &format!("{at}: prefill"));
        // transformers' generate recomputes step 0; its two f32 paths differ by up to 2e-4.
        check(&logits, &p.step_logits[0], &format!("{at}: step 0"));
        for (step, &token) in p.greedy_ids.iter().enumerate().skip(1) {
            let logits = model.forward(&[p.greedy_ids[step - 1]], &mut cache).unwrap();
            check(&logits, &p.step_logits[step], &format!("{at}: decode step {step}"));
            let top1 =
                (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
            assert_eq!(top1, token, "{at}: decode step {step}");
        }
        for (pos, expected) in p.position_logits.iter().flatten().enumerate() {
            let logits = model.forward(&p.ids[..=pos], &mut model.new_cache(256)).unwrap();
            check(&logits, expected, &format!("{at}: position {pos}"));
        }
    }
    eprintln!("{name}: largest logit difference from {}: {worst:.1e}", fx.reference);
}

/// The recurrent form (one token per call), a split prefill and the chunked form (one call)
/// reach the same logits; a snapshot resumed twice continues identically.
fn check_forms_and_snapshots(name: &str) {
    let (model, fx) = load(name, Format::Safetensors);
    let p = fx.prompts.iter().max_by_key(|p| p.ids.len()).unwrap();
    let whole = model.forward(&p.ids, &mut model.new_cache(256)).unwrap();

    let mut cache = model.new_cache(256);
    let mut stepped = Vec::new();
    for &id in &p.ids {
        stepped = model.forward(&[id], &mut cache).unwrap();
    }
    assert!(
        max_diff(&stepped, &whole) < 1e-4,
        "{name}: token-by-token vs one pass: {}",
        max_diff(&stepped, &whole)
    );

    let mut cache = model.new_cache(256);
    model.forward(&p.ids[..48], &mut cache).unwrap();
    let snapshot = cache.snapshot().unwrap();
    let split = model.forward(&p.ids[48..], &mut cache).unwrap();
    assert!(max_diff(&split, &whole) < 1e-4, "{name}: split prefill vs one pass");

    let continue_from = |mut cache: spindle_models::SequenceCache| -> Vec<Vec<f32>> {
        let mut out = vec![model.forward(&p.ids[48..], &mut cache).unwrap()];
        for &id in &p.greedy_ids[..8] {
            out.push(model.forward(&[id], &mut cache).unwrap());
        }
        out
    };
    let first = continue_from(snapshot.snapshot().unwrap());
    let second = continue_from(snapshot);
    assert_eq!(first, second, "{name}: a resumed snapshot must continue bit for bit");
    assert_eq!(first[0], split, "{name}: the snapshot was not disturbed by the original going on");
}

#[test]
fn qwen3_5_moe_matches_transformers() {
    check_against_transformers("qwen3_5_moe", Format::Safetensors);
    check_against_transformers("qwen3_5_moe", Format::Gguf);
}

#[test]
fn qwen3_5_dense_matches_transformers() {
    check_against_transformers("qwen3_5", Format::Safetensors);
    check_against_transformers("qwen3_5", Format::Gguf);
}

#[test]
fn qwen3_next_matches_transformers() {
    check_against_transformers("qwen3_next", Format::Safetensors);
    check_against_transformers("qwen3_next", Format::Gguf);
}

/// The quantized path (Q8_0 weights, 8-bit activations, experts sliced out of the stacked
/// tensors as bytes) against the same file's weights dequantized and run in f32. These tiny
/// random models amplify rounding (Q8_0 weights alone move their logits by up to 1.8), so the
/// bound is loose; the exact slicing is checked in the crate's unit tests.
#[test]
fn quantized_hybrid_gguf_follows_its_dequantized_weights() {
    for name in ["qwen3_5_moe", "qwen3_next"] {
        let tmp = tempfile::tempdir().unwrap();
        let q8 = tmp.path().join("q8_0.gguf");
        assert!(
            common::gguf_rewrite::rewrite_gguf(&dir(name).join("model.gguf"), &q8, GgmlDType::Q8_0)
                > 0
        );
        let quantized = load_gguf(&q8).unwrap();
        let dequantized = load_gguf_f32(&q8).unwrap();
        let (_, fx) = load(name, Format::Gguf);
        for p in &fx.prompts {
            let a = quantized.forward(&p.ids, &mut quantized.new_cache(256)).unwrap();
            let b = dequantized.forward(&p.ids, &mut dequantized.new_cache(256)).unwrap();
            // Measured (2026-11-23): at most 1.0.
            let d = max_diff(&a, &b);
            assert!(d < 2.0, "{name}: quantized path differs from the dequantized weights by {d}");
        }
    }
}

#[test]
fn chunked_and_recurrent_forms_agree_and_snapshots_resume_exactly() {
    for name in ["qwen3_5_moe", "qwen3_5", "qwen3_next"] {
        check_forms_and_snapshots(name);
    }
}
