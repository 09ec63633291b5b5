//! The hybrid's multi-token-prediction head on the device (`GpuHybrid` as a `DraftHead`) against
//! the CPU's f32 path of the same file, on a tiny random Qwen3.5-MoE GGUF with an MTP head: the
//! target's kept final hidden states, the head's logits and its own hidden states over a
//! prompt's rows and a chained draft, within the model's recorded bound and with the same greedy
//! drafts. Keeping the hidden states changes no logit.

use spindle_gpu::{GpuHybrid, ModelBytes, Placement, PlacementRequest};
use spindle_models::random_hybrid::HybridShape;
use spindle_models::{CausalLm, DraftHead, HeadRows, KvType, RecurrentState, SequenceCache};

use crate::harness::{gpu_or_skip, same_bits};
use crate::hybrid::{load_on_gpu, write_tiny, VOCAB};
use crate::model::argmax;

/// Largest difference of the target's kept hidden states from the CPU's f32 path (measured on
/// lavapipe: 1.1e-5): the target's bound (a prompt's chunked delta rule on the CPU against the
/// device's token by token).
const TOLERANCE: f32 = 1e-4;
/// Largest difference of the head's logits and outputs from the CPU head's over an f16 cache
/// too, from the same inputs (measured on lavapipe: 7.6e-5; 1.8e-6 with both caches in f32,
/// 3.4e-4 with the device's f16 against the CPU's own f32): a key or value a hair apart may
/// round to the next f16, 2⁻¹¹ of itself.
const HEAD_TOLERANCE: f32 = 5e-4;

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The prompt's hidden states as `model` keeps them, and its last logits.
fn prompt_pass(model: &dyn CausalLm, prompt: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let mut cache = model.new_cache(64);
    cache.keep_hidden_states();
    let logits = model.forward(prompt, &mut cache).unwrap();
    let (from, rows) = cache.hidden_states().expect("kept");
    assert_eq!(from, 0);
    (rows.to_vec(), logits)
}

fn predict(
    head: &dyn DraftHead,
    hidden: &[f32],
    tokens: &[u32],
    cache: &mut SequenceCache,
) -> HeadRows {
    head.predict(hidden, tokens, cache).unwrap()
}

#[test]
fn the_mtp_head_on_the_gpu_drafts_as_the_cpus() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), &HybridShape::TINY_MTP);
    let gpu = load_on_gpu(&path, device.clone());
    let cpu = spindle_models::load_gguf_f32(&path).unwrap();
    let prompt = [3, 141, 59, 26, 5, 35];
    let (gpu_hidden, gpu_logits) = prompt_pass(&gpu, &prompt);
    let (cpu_hidden, _) = prompt_pass(cpu.as_ref(), &prompt);
    let hidden_difference = largest_difference(&gpu_hidden, &cpu_hidden);
    let plain = gpu.forward(&prompt, &mut CausalLm::new_cache(&gpu, 64)).unwrap();
    same_bits("logits with the hidden states kept and without", &gpu_logits, &plain);
    // The head over the prompt's rows, each with the token after it, from the same inputs.
    let width = gpu_hidden.len() / prompt.len();
    let (on_gpu, on_cpu) = (gpu.draft_head().unwrap(), cpu.draft_head().unwrap());
    // The CPU head over an f16 cache too, as the device keeps the head's keys and values.
    let mut gpu_cache = on_gpu.new_cache(64);
    let f16_cache = |shapes: Vec<_>| {
        SequenceCache::standalone(&shapes, KvType::F16, RecurrentState::none(1), 64)
    };
    let mut cpu_cache = f16_cache(gpu_cache.storage().shapes());
    let rows = &gpu_hidden[..(prompt.len() - 1) * width];
    let got = predict(on_gpu, rows, &prompt[1..], &mut gpu_cache);
    let want = predict(on_cpu, rows, &prompt[1..], &mut cpu_cache);
    let mut worst = 0.0f32;
    for (row, ((g, w), (gh, wh))) in
        got.logits.iter().zip(&want.logits).zip(got.hidden.iter().zip(&want.hidden)).enumerate()
    {
        assert_eq!(argmax(g), argmax(w), "row {row}: the head's greedy drafts differ");
        worst = worst.max(largest_difference(g, w)).max(largest_difference(gh, wh));
    }
    // A chained draft: the head's own last output with the token it drafted.
    let draft = argmax(want.logits.last().unwrap());
    let last = want.hidden.last().unwrap();
    let got = predict(on_gpu, last, &[draft], &mut gpu_cache);
    let want = predict(on_cpu, last, &[draft], &mut cpu_cache);
    assert_eq!(argmax(&got.logits[0]), argmax(&want.logits[0]), "the chained drafts differ");
    worst = worst.max(largest_difference(&got.logits[0], &want.logits[0]));
    assert_eq!((gpu_cache.len(), cpu_cache.len()), (prompt.len(), prompt.len()));
    eprintln!("MTP head: hidden states within {hidden_difference:.2e}, head within {worst:.2e}");
    assert!(hidden_difference <= TOLERANCE, "hidden states differ by {hidden_difference}");
    assert!(worst <= HEAD_TOLERANCE, "the head differs by {worst}");
    assert_eq!(got.logits[0].len(), VOCAB);
}

/// The head goes on the device only when the placement asks for it, and then counts there.
#[test]
fn the_mtp_head_is_loaded_and_counted_only_when_asked_for() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), &HybridShape::TINY_MTP);
    let (cfg, mut weights) = spindle_models::open_hybrid(&path).unwrap();
    let bytes = ModelBytes::of_hybrid(&cfg, &weights);
    assert!(bytes.draft_head > 0, "{bytes:?}");
    for asked in [false, true] {
        let request = PlacementRequest { draft_head: asked, ..PlacementRequest::default() };
        let placement = Placement::plan(&bytes, &request).unwrap();
        let experts: u64 = bytes.experts.iter().sum();
        let head = if asked { bytes.draft_head } else { 0 };
        assert_eq!(placement.device_weights, bytes.dense + experts + head);
        let model =
            GpuHybrid::load_placed(device.clone(), cfg.clone(), &mut weights, &placement).unwrap();
        assert_eq!(model.draft_head().is_some(), asked);
    }
}
