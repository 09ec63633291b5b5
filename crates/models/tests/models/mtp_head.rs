//! The multi-token-prediction head of the hybrid fixtures (tests/data/hybrid/<model>/, its seeded
//! random weights added by scripts/reference/hybrid/add_mtp_head.py) against that script's
//! independent float64 implementation of vLLM's `Qwen3NextMultiTokenPredictor`, from both
//! checkpoint formats; and how the head is loaded: all or nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use serde::Deserialize;
use spindle_models::{load_gguf, load_safetensors, BatchEntry, CausalLm};

/// Largest |logit| difference allowed against the float64 reference. Measured (2026-11-28):
/// at most 4.4e-6 over the three models and both formats; logits are O(3), so a wrong norm, a
/// swapped half of `fc` or a position off by one shows far above this.
const TOLERANCE: f32 = 1e-4;

#[derive(Deserialize)]
struct Fixture {
    mtp: HeadFixture,
}

#[derive(Deserialize)]
struct HeadFixture {
    reference: String,
    /// Stand-ins for the target's final hidden states at positions 0, 1, …
    hidden_states: Vec<Vec<f32>>,
    /// The token after each of those positions.
    next_tokens: Vec<u32>,
    row_logits: Vec<Vec<f32>>,
    /// Greedy drafts chained from the last row: the first is the last row's argmax.
    chain_drafts: Vec<u32>,
    /// The logits that chose `chain_drafts[1..]`.
    chain_logits: Vec<Vec<f32>>,
}

const MODELS: [&str; 3] = ["qwen3_5_moe", "qwen3_5", "qwen3_next"];

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid").join(name)
}

fn fixture(name: &str) -> HeadFixture {
    let text = std::fs::read_to_string(dir(name).join("fixture.json")).unwrap();
    serde_json::from_str::<Fixture>(&text).unwrap().mtp
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32
}

/// The recorded rows in two passes (the second attends over the first's keys through the head's
/// cache), then the greedy chain fed with the head's own hidden state.
fn check_head(name: &str, model: &dyn CausalLm, what: &str) {
    let fx = fixture(name);
    let head = model.draft_head().unwrap_or_else(|| panic!("{what}: no head loaded"));
    let mut cache = head.new_cache(64);
    let split = 4;
    let mut logits = Vec::new();
    let mut last_hidden = Vec::new();
    for (rows, tokens) in [
        (&fx.hidden_states[..split], &fx.next_tokens[..split]),
        (&fx.hidden_states[split..], &fx.next_tokens[split..]),
    ] {
        let flat: Vec<f32> = rows.concat();
        let out = head.predict(&flat, tokens, &mut cache).unwrap();
        logits.extend(out.logits);
        last_hidden = out.hidden.last().unwrap().clone();
    }
    let mut worst: f32 = 0.0;
    for (i, (got, want)) in logits.iter().zip(&fx.row_logits).enumerate() {
        let d = max_diff(got, want);
        assert!(d < TOLERANCE, "{what}: row {i} differs by {d}");
        worst = worst.max(d);
    }
    let mut draft = argmax(logits.last().unwrap());
    assert_eq!(draft, fx.chain_drafts[0], "{what}: first draft");
    for (step, want) in fx.chain_logits.iter().enumerate() {
        let out = head.predict(&last_hidden, &[draft], &mut cache).unwrap();
        let d = max_diff(&out.logits[0], want);
        assert!(d < TOLERANCE, "{what}: chained draft {} differs by {d}", step + 1);
        worst = worst.max(d);
        draft = argmax(&out.logits[0]);
        assert_eq!(draft, fx.chain_drafts[step + 1], "{what}: chained draft {}", step + 1);
        last_hidden = out.hidden[0].clone();
    }
    eprintln!("{what}: largest head logit difference from {}: {worst:.1e}", fx.reference);
}

#[test]
fn the_mtp_head_matches_its_float64_reference_from_both_formats() {
    for name in MODELS {
        check_head(name, &*load_safetensors(&dir(name)).unwrap(), &format!("{name} safetensors"));
        let gguf = load_gguf(&dir(name).join("model.gguf")).unwrap();
        check_head(name, &*gguf, &format!("{name} gguf"));
    }
}

/// The head reads the hidden states the target's LM head reads: after the final norm.
#[test]
fn kept_hidden_states_are_what_the_lm_head_reads() {
    let name = "qwen3_5_moe";
    let model = load_safetensors(&dir(name)).unwrap();
    let ids = [3, 141, 59, 265, 35];
    let mut cache = model.new_cache(64);
    assert_eq!(cache.hidden_states(), None, "kept only when asked");
    cache.keep_hidden_states();
    let logits = model.forward(&ids, &mut cache).unwrap();
    let (from, hidden) = cache.hidden_states().unwrap();
    let width = model.config().hidden_size;
    assert_eq!((from, hidden.len()), (0, ids.len() * width), "one row per token of the pass");

    let weights =
        candle_core::safetensors::load(dir(name).join("model.safetensors"), &Device::Cpu).unwrap();
    let last = Tensor::from_slice(&hidden[(ids.len() - 1) * width..], (1, width), &Device::Cpu);
    let from_hidden = last.unwrap().matmul(&weights["lm_head.weight"].t().unwrap()).unwrap();
    let from_hidden: Vec<f32> = from_hidden.flatten_all().unwrap().to_vec1().unwrap();
    assert!(max_diff(&from_hidden, &logits) < 1e-4, "{}", max_diff(&from_hidden, &logits));

    model.forward(&[7], &mut cache).unwrap();
    let (from, last_pass) = cache.hidden_states().unwrap();
    assert_eq!((from, last_pass.len()), (ids.len(), width), "the latest pass's rows only");
}

/// Going back over a verified pass drops the hidden states of the positions it forgets.
#[test]
fn kept_hidden_states_follow_a_rollback() {
    let model = load_safetensors(&dir("qwen3_5")).unwrap();
    let width = model.config().hidden_size;
    let mut cache = model.new_cache(64);
    cache.keep_hidden_states();
    model.forward(&[3, 141, 59], &mut cache).unwrap();
    let drafts = [5, 6, 7, 8];
    model
        .forward_batch(&mut [BatchEntry { tokens: &drafts, cache: &mut cache, logit_rows: 4 }])
        .unwrap();
    let (_, all) = cache.hidden_states().unwrap();
    let kept_rows = all[..2 * width].to_vec();
    cache.truncate(5).unwrap();
    assert_eq!(cache.hidden_states(), Some((3, kept_rows.as_slice())));
}

/// A folder with the fixture's config and its tensors as `edit` leaves them.
fn edited_checkpoint(
    name: &str,
    edit: impl FnOnce(&mut HashMap<String, Tensor>),
) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(dir(name).join("config.json"), tmp.path().join("config.json")).unwrap();
    let mut tensors =
        candle_core::safetensors::load(dir(name).join("model.safetensors"), &Device::Cpu).unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, tmp.path().join("model.safetensors")).unwrap();
    tmp
}

/// Without `mtp.*` the model loads without a head and its logits are unchanged; a head with a
/// tensor missing is refused with its name.
#[test]
fn the_head_is_loaded_all_or_nothing() {
    let name = "qwen3_next";
    let ids = [3, 141, 59, 265, 35];
    let with_head = load_safetensors(&dir(name)).unwrap();
    let expected = with_head.forward(&ids, &mut with_head.new_cache(64)).unwrap();

    let without = edited_checkpoint(name, |t| t.retain(|k, _| !k.starts_with("mtp.")));
    let model = load_safetensors(without.path()).unwrap();
    assert!(model.draft_head().is_none());
    assert_eq!(model.forward(&ids, &mut model.new_cache(64)).unwrap(), expected);

    let incomplete = edited_checkpoint(name, |t| {
        t.remove("mtp.norm.weight");
    });
    let err = load_safetensors(incomplete.path()).err().expect("an incomplete head is refused");
    assert!(err.to_string().contains("mtp.norm.weight"), "{err}");
}

/// Inputs that do not fit the head are refused, not a panic.
#[test]
fn the_head_refuses_rows_that_do_not_fit() {
    let model = load_gguf(&Path::new(&dir("qwen3_5")).join("model.gguf")).unwrap();
    let head = model.draft_head().unwrap();
    let mut cache = head.new_cache(64);
    let width = model.config().hidden_size;
    assert!(head.predict(&vec![0.0; width + 1], &[1], &mut cache).is_err());
    assert!(head.predict(&[], &[], &mut cache).is_err());
    assert!(head.predict(&vec![0.0; width], &[100_000], &mut cache).is_err());
    assert_eq!(cache.len(), 0, "a refused pass leaves the cache as it was");
}

/// The fixture's GGUF with its metadata and tensors as `edit` leaves them.
fn edited_gguf(
    name: &str,
    edit: impl FnOnce(&mut HashMap<String, Value>, &mut Vec<(String, QTensor)>),
) -> tempfile::TempDir {
    let src = dir(name).join("model.gguf");
    let mut file = std::fs::File::open(&src).unwrap();
    let content = Content::read(&mut file).unwrap();
    let mut tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| (n.clone(), content.tensor(&mut file, n, &Device::Cpu).unwrap()))
        .collect();
    let mut metadata = content.metadata.clone();
    edit(&mut metadata, &mut tensors);
    let tmp = tempfile::tempdir().unwrap();
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = std::fs::File::create(tmp.path().join("model.gguf")).unwrap();
    gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    tmp
}

/// A GGUF whose `nextn_predict_layers` leaves no target layer, or whose head lacks a tensor, is
/// refused with a message naming what is wrong.
#[test]
fn a_gguf_with_a_damaged_head_is_refused_by_name() {
    for count in [9, 50] {
        let damaged = edited_gguf("qwen3_5", |meta, _| {
            meta.insert("qwen35.nextn_predict_layers".into(), Value::U32(count));
        });
        let err = load_gguf(&damaged.path().join("model.gguf")).err().expect("refused");
        assert!(err.to_string().contains("nextn_predict_layers"), "{count}: {err}");
    }
    let missing = edited_gguf("qwen3_5", |_, tensors| {
        tensors.retain(|(n, _)| n != "blk.8.nextn.hnorm.weight");
    });
    let err = load_gguf(&missing.path().join("model.gguf")).err().expect("refused");
    assert!(err.to_string().contains("blk.8.nextn.hnorm.weight"), "{err}");
}
