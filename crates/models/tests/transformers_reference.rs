//! The model math against Hugging Face transformers (float32, eager attention, CPU), recorded
//! in tests/data/reference/transformers/<model>.json by
//! scripts/reference/make_transformers_fixtures.py. transformers dequantizes the same GGUF file
//! and runs its own modeling code, so we load it the same way ([`load_gguf_f32`]: no activation
//! quantization) and require, with the reference's tokens fed back in (teacher forcing):
//! - our top-1 token is the reference's at every one of the 24 steps of every prompt;
//! - our log-probabilities of the reference's top-5 tokens are within `LOGPROB_TOLERANCE`.
//!
//! The quantized fast path is checked against llama.cpp in crates/runner/tests/reference.rs.

use std::path::PathBuf;

use serde::Deserialize;
use spindle_models::load_gguf_f32;

#[derive(Deserialize)]
struct Fixture {
    model: String,
    gguf_file: String,
    reference: String,
    generations: Vec<Generation>,
}

#[derive(Deserialize)]
struct Generation {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    /// Per step, the reference's top-5 `[id, logprob]`, best first.
    top_logprobs: Vec<Vec<(u32, f64)>>,
    /// Per step, the reference's own margin between its top-1 and top-2 (nats).
    top2_gap: Vec<f64>,
}

/// Largest difference allowed between our and transformers' log-probability of a token.
/// Measured (2026-11-23, 480 values per model): max 7.2e-5 (smollm2), 5.7e-5 (qwen2.5),
/// 5.5e-5 (gemma3): float32 summation-order noise. The smallest top-1/top-2 margin in the
/// fixtures is 5e-3, so this tolerance still tells the two apart.
const LOGPROB_TOLERANCE: f64 = 1e-3;

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

fn check_model(name: &str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/reference/transformers");
    let text = std::fs::read_to_string(root.join(format!("{name}.json"))).unwrap();
    let fx: Fixture = serde_json::from_str(&text).unwrap();
    assert_eq!(fx.model, name);
    // Pulled on first use; the lock keeps parallel tests from fetching the same files.
    static PULL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let path = {
        let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
        match spindle_hub::resolve(name, &spindle_hub::spindle_home(), true) {
            Ok(spindle_hub::ModelFiles::Gguf(p)) => p,
            other => panic!("{name}: {other:?}"),
        }
    };
    assert!(path.ends_with(&fx.gguf_file), "{}", path.display());
    let model = load_gguf_f32(&path).unwrap().model;
    assert!(fx.generations.len() >= 3);
    let mut worst: f64 = 0.0;
    for g in &fx.generations {
        assert_eq!(g.greedy_ids.len(), 24);
        let mut cache = model.new_cache(4096);
        let mut logits = model.forward(&g.prompt_ids, &mut cache).unwrap();
        for (step, &expected) in g.greedy_ids.iter().enumerate() {
            let at = format!("{name}: prompt {:?} step {step}", g.prompt);
            let ours = log_softmax(&logits);
            let top1 = (0..ours.len()).max_by(|&a, &b| ours[a].total_cmp(&ours[b]).then(b.cmp(&a))).unwrap() as u32;
            assert_eq!(
                top1, expected,
                "{at}: top-1 {top1} but {} chose {expected} (its margin {})",
                fx.reference, g.top2_gap[step]
            );
            for &(id, reference) in &g.top_logprobs[step] {
                let diff = (ours[id as usize] - reference).abs();
                worst = worst.max(diff);
                assert!(diff <= LOGPROB_TOLERANCE, "{at}: logprob of {id} is {} vs {reference}", ours[id as usize]);
            }
            logits = model.forward(&[expected], &mut cache).unwrap();
        }
    }
    eprintln!("{name}: largest logprob difference from {}: {worst:.2e}", fx.reference);
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
