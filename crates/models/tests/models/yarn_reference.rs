//! YaRN rope scaling against transformers' code: a tiny seeded Llama whose config.json asks for
//! `rope_type: yarn`, factor 4 over 32 original positions, and its logits at every position of a
//! 100-token prompt (tests/data/yarn, made by scripts/reference/make_yarn_fixture.py, a numpy
//! transcription of `_compute_yarn_parameters` and the eager Llama forward, which transformers
//! 5.24.0 itself reproduces within 7e-6 on the same folder: `transformers_check` in fixture.json).
//! Positions 32..100
//! are past the original context, where YaRN's interpolated frequencies and its attention factor
//! decide the logits.

use std::path::PathBuf;

use serde::Deserialize;
use spindle_models::load_safetensors;

/// The reference is float64 with float32 rotary tables; our f32 forward differs by ~1e-5 on
/// logits of magnitude ~10. A model without the scaling is off by whole units past position 32.
const TOLERANCE: f32 = 1e-3;

#[derive(Deserialize)]
struct Fixture {
    ids: Vec<u32>,
    position_logits: Vec<Vec<f32>>,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/yarn")
}

fn fixture() -> Fixture {
    serde_json::from_str(&std::fs::read_to_string(dir().join("fixture.json")).unwrap()).unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn yarn_logits_follow_transformers_past_the_original_context() {
    let fx = fixture();
    let model = load_safetensors(&dir()).unwrap();
    // A prefill that crosses position 32, then one token at a time through the cache to 99.
    let prefill = 40;
    let mut cache = model.new_cache(128);
    let mut worst = max_diff(
        &model.forward(&fx.ids[..prefill], &mut cache).unwrap(),
        &fx.position_logits[prefill - 1],
    );
    for pos in prefill..fx.ids.len() {
        let logits = model.forward(&[fx.ids[pos]], &mut cache).unwrap();
        let d = max_diff(&logits, &fx.position_logits[pos]);
        assert!(d < TOLERANCE, "position {pos}: max |logit diff| {d}");
        worst = worst.max(d);
    }
    let whole = model.forward(&fx.ids, &mut model.new_cache(128)).unwrap();
    worst = worst.max(max_diff(&whole, fx.position_logits.last().unwrap()));
    eprintln!("yarn fixture: max |logit diff| {worst}");
    assert!(worst < TOLERANCE, "max |logit diff| {worst}");
}

#[test]
fn the_same_weights_without_yarn_do_not_match() {
    let fx = fixture();
    let scratch = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(dir().join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config.as_object_mut().unwrap().remove("rope_scaling");
    std::fs::write(scratch.path().join("config.json"), config.to_string()).unwrap();
    std::fs::copy(dir().join("model.safetensors"), scratch.path().join("model.safetensors"))
        .unwrap();
    let model = load_safetensors(scratch.path()).unwrap();
    let logits = model.forward(&fx.ids, &mut model.new_cache(128)).unwrap();
    let d = max_diff(&logits, fx.position_logits.last().unwrap());
    eprintln!("without yarn: max |logit diff| {d}");
    assert!(
        d > 100.0 * TOLERANCE,
        "plain RoPE lands within {d} of the YaRN reference: the fixture does not test the scaling"
    );
}

#[test]
fn an_unknown_rope_type_is_a_load_error_naming_it() {
    let scratch = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(dir().join("config.json")).unwrap();
    std::fs::write(scratch.path().join("config.json"), config.replace("\"yarn\"", "\"longrope\""))
        .unwrap();
    std::fs::copy(dir().join("model.safetensors"), scratch.path().join("model.safetensors"))
        .unwrap();
    let err = load_safetensors(scratch.path()).err().expect("longrope must not load").to_string();
    assert!(err.contains("'longrope'"), "{err}");
}
