//! The hybrid model on the GPU path (`GpuHybrid`: Gated DeltaNet, gated attention, the sparse
//! MoE) against the CPU's f32 path of the same file, on a tiny random Qwen3.5-MoE GGUF (Q4_K
//! matrices; 3 DeltaNet layers of 2 key and 4 value heads in llama.cpp's tiled order, 1
//! attention layer; 4 experts, top 2): the same greedy tokens, logits within a recorded bound;
//! a sequence's logits bitwise the same alone and batched; drafts verified and rejected ones
//! forgotten on the device; bad input refused with the caches unchanged. And the hybrid fixtures' GGUF files (Qwen3-Next, Qwen3.5-MoE, Qwen3.5) against
//! transformers' own logits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use spindle_gpu::{Gpu, GpuHybrid};
use spindle_models::random_hybrid::{placeholder_tokenizer, write_random_hybrid, HybridShape};
use spindle_models::{BatchEntry, CausalLm, KvType, PagedKv, SequenceCache};

use crate::harness::{gpu_or_skip, same_bits};
use crate::model::{agreement, argmax, greedy_on_gpu};

pub(crate) const VOCAB: usize = 256;

/// Largest logit difference between the GPU and the CPU's f32 path (measured on lavapipe over
/// a 6-token prompt and 7 steps, logits of a few units: 1.5e-5 with the MoE, 1.9e-5 dense). The CPU runs a prompt's
/// delta rule in its chunked form (a triangular solve: other rounding than the GPU's token by
/// token), the device's `exp` differs in the last bits, and four layers of 256-wide sums.
const LOGIT_TOLERANCE: f32 = 1e-4;

pub(crate) fn tiny_hybrid(dir: &Path) -> PathBuf {
    write_tiny(dir, &HybridShape::TINY)
}

pub(crate) fn write_tiny(dir: &Path, shape: &HybridShape) -> PathBuf {
    let path = dir.join(shape.file_name(1));
    let mut file = std::fs::File::create(&path).unwrap();
    write_random_hybrid(&mut file, shape, 1, placeholder_tokenizer(VOCAB)).unwrap();
    path
}

pub(crate) fn load_on_gpu(path: &Path, gpu: Arc<Gpu>) -> GpuHybrid {
    let (cfg, mut weights) = spindle_models::open_hybrid(path).unwrap();
    GpuHybrid::load(gpu, cfg, &mut weights).unwrap()
}

/// `shape` on the GPU for 64 greedy steps against the CPU's f32 path of the same file.
fn greedy_against_the_cpu(shape: &HybridShape, what: &str) {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny(dir.path(), shape);
    // A device of its own: the other tests' submissions would mix into its count.
    let device = Arc::new(Gpu::open(None).unwrap());
    let gpu = load_on_gpu(&path, device.clone());
    let steps = 64;
    let before = device.submissions();
    let run = greedy_on_gpu(&gpu, &[3, 141, 59, 26, 5, 35], steps);
    assert_eq!(device.submissions() - before, steps as u64, "one submission a step");
    let cpu = spindle_models::load_gguf_f32(&path).unwrap();
    let (agreed, worst) = agreement(cpu.as_ref(), &run);
    eprintln!("{what}: {agreed}/{steps} greedy tokens agree; max logit difference {worst:.2e}");
    assert_eq!(agreed, steps, "greedy tokens differ");
    assert!(worst <= LOGIT_TOLERANCE, "logits differ by {worst}");
}

#[test]
fn the_tiny_hybrid_on_the_gpu_decodes_the_cpu_f32_paths_greedy_tokens() {
    greedy_against_the_cpu(&HybridShape::TINY, "tiny hybrid");
}

/// Qwen3.5 without experts: a dense MLP in every layer.
#[test]
fn the_tiny_dense_hybrid_on_the_gpu_decodes_the_cpu_f32_paths_greedy_tokens() {
    greedy_against_the_cpu(&HybridShape::TINY_DENSE, "tiny dense hybrid");
}

/// A cache in `pool` (shared with other sequences) on the blocks given, out of order.
fn shared_cache(gpu: &GpuHybrid, pool: &Arc<PagedKv>, blocks: Vec<u32>) -> SequenceCache {
    let limit = blocks.len() * pool.block_size();
    SequenceCache::resume(pool.clone(), blocks, 0, gpu.initial_recurrent_state(), limit)
}

#[test]
fn a_hybrid_sequence_gets_the_same_logits_alone_and_among_others() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    same_alone_and_batched(&load_on_gpu(&tiny_hybrid(dir.path()), device.clone()));
}

/// A sequence's logits (prompt and two steps) and states are bitwise the same alone and in
/// one pool with two others, on blocks out of order.
pub(crate) fn same_alone_and_batched(gpu: &GpuHybrid) {
    let target: Vec<u32> = (0..11).map(|i| (i * 37 + 11) % VOCAB as u32).collect();
    let mut alone = gpu.new_cache(64);
    let mut want = vec![gpu.forward(&target, &mut alone).unwrap()];
    for token in [7, 200] {
        want.push(gpu.forward(&[token], &mut alone).unwrap());
    }
    let pool = Arc::new(PagedKv::new(&gpu.kv_shapes(), KvType::F32, 16, 8));
    let mut mine = shared_cache(gpu, &pool, vec![9, 2, 14]);
    let mut other = shared_cache(gpu, &pool, vec![0, 11, 7]);
    let mut third = shared_cache(gpu, &pool, vec![15, 1]);
    let other_prompt: Vec<u32> = (0..7).map(|i| (i * 5 + 1) % VOCAB as u32).collect();
    let mut got = gpu
        .forward_batch(&mut [
            BatchEntry::new(&other_prompt, &mut other),
            BatchEntry::new(&target, &mut mine),
            BatchEntry::new(&[4, 8, 15], &mut third),
        ])
        .unwrap();
    let mut steps = vec![got.swap_remove(1)];
    for token in [7, 200] {
        let mut batched = gpu
            .forward_batch(&mut [
                BatchEntry::new(&[42], &mut other),
                BatchEntry::new(&[16, 23], &mut third),
                BatchEntry::new(&[token], &mut mine),
            ])
            .unwrap();
        steps.push(batched.swap_remove(2));
    }
    for (step, (a, b)) in want.iter().zip(&steps).enumerate() {
        same_bits(&format!("step {step} alone and batched"), a, b);
    }
    same_bits(
        "the recurrent states alone and batched",
        &alone.recurrent().to_floats(),
        &mine.recurrent().to_floats(),
    );
}

#[test]
fn bad_input_to_the_hybrid_is_refused_and_changes_no_cache() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gpu = load_on_gpu(&tiny_hybrid(dir.path()), device.clone());
    let mut cache = gpu.new_cache(64);
    gpu.forward(&[1, 2, 3], &mut cache).unwrap();
    let state = cache.recurrent().clone();
    let mut fine = gpu.new_cache(64);
    // A token id past the vocabulary, beside a good entry.
    let past = VOCAB as u32;
    let refused = gpu.forward_batch(&mut [
        BatchEntry::new(&[5], &mut fine),
        BatchEntry::new(&[4, past], &mut cache),
    ]);
    assert!(matches!(refused, Err(spindle_models::ModelError::Gpu(_))), "{refused:?}");
    // A cache without the model's recurrent state (another model's).
    let pool = Arc::new(PagedKv::new(&gpu.kv_shapes(), KvType::F32, 4, 8));
    let mut foreign = SequenceCache::resume(
        pool,
        vec![0],
        0,
        spindle_models::RecurrentState::none(gpu.config().num_hidden_layers),
        8,
    );
    assert!(gpu.forward(&[1], &mut foreign).is_err());
    assert_eq!((cache.len(), fine.len(), foreign.len()), (3, 0, 0));
    assert_eq!(cache.recurrent(), &state, "a refused step moved a state on");
}

/// With keys and values in f16 (the served default: half a pool of f32), the GPU decodes the
/// greedy tokens the CPU's f32 path decodes over its own f16 cache, logits within the f32
/// bound (both round each stored value once, alike).
#[test]
fn with_f16_keys_and_values_the_hybrid_decodes_the_cpus_greedy_tokens() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_hybrid(dir.path());
    let gpu = load_on_gpu(&path, device.clone());
    let cpu = spindle_models::load_gguf_f32(&path).unwrap();
    let f16_cache = |model: &dyn CausalLm| {
        let state = model.initial_recurrent_state();
        SequenceCache::standalone(&model.kv_shapes(), KvType::F16, state, 64)
    };
    let (mut on_gpu, mut on_cpu) = (f16_cache(&gpu), f16_cache(cpu.as_ref()));
    let mut fed = vec![3, 141, 59, 26, 5, 35];
    let mut worst = 0.0f32;
    for step in 0..8 {
        let (got, want) =
            (gpu.forward(&fed, &mut on_gpu).unwrap(), cpu.forward(&fed, &mut on_cpu).unwrap());
        assert_eq!(argmax(&got), argmax(&want), "step {step}: greedy tokens differ");
        worst = worst.max(got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max));
        fed = vec![argmax(&got)];
    }
    eprintln!("f16 keys and values: 8/8 greedy tokens agree; max logit difference {worst:.2e}");
    assert!(worst <= LOGIT_TOLERANCE, "logits differ by {worst}");
}

/// A decoding sequence's DeltaNet states stay on the device: uploaded once as it starts and
/// read back only when its cache is asked for them (as for a snapshot), with the bits of a run
/// whose states go to the host and back every step; a finished sequence's slot is the next
/// one's.
#[test]
fn decoding_keeps_the_deltanet_states_on_the_device_until_the_host_asks() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gpu = load_on_gpu(&tiny_hybrid(dir.path()), device.clone());
    let steps: [&[u32]; 4] = [&[1, 2, 3], &[4], &[5], &[6]];
    let mut resident = gpu.new_cache(64);
    let mut logits = Vec::new();
    for tokens in &steps[..3] {
        logits.push(gpu.forward(tokens, &mut resident).unwrap());
    }
    let traffic = gpu.state_traffic();
    assert_eq!((traffic.uploads, traffic.downloads), (1, 0), "{traffic:?}");
    // Through the host every step: the cache's state read back and set again (which lets the
    // device's go), so each step uploads it.
    let mut round_trips = gpu.new_cache(64);
    for (step, tokens) in steps[..3].iter().enumerate() {
        let got = gpu.forward(tokens, &mut round_trips).unwrap();
        same_bits(&format!("step {step} resident and through the host"), &logits[step], &got);
        let floats = round_trips.recurrent().to_floats();
        round_trips.set_recurrent_floats(&floats).unwrap();
    }
    let traffic = gpu.state_traffic();
    assert_eq!((traffic.uploads, traffic.downloads), (4, 3), "{traffic:?}");
    // Asked for its state (as for a prefix-cache snapshot), the resident cache reads it back
    // once and keeps it on the device for the next step.
    assert_eq!(resident.recurrent(), round_trips.recurrent());
    assert_eq!(resident.recurrent(), round_trips.recurrent());
    let next = gpu.forward(steps[3], &mut resident).unwrap();
    same_bits("the step after", &next, &gpu.forward(steps[3], &mut round_trips).unwrap());
    let traffic = gpu.state_traffic();
    assert_eq!((traffic.uploads, traffic.downloads), (5, 4), "{traffic:?}");
    // Sequences one after another reuse the slots the finished ones held; held at once, they
    // take more.
    let slots = traffic.slots;
    drop((resident, round_trips));
    for _ in 0..2 * slots {
        gpu.forward(&[7, 8], &mut gpu.new_cache(64)).unwrap();
    }
    assert_eq!(gpu.state_traffic().slots, slots, "slots of finished sequences reused");
    let mut held: Vec<SequenceCache> = (0..slots + 1).map(|_| gpu.new_cache(64)).collect();
    for cache in &mut held {
        gpu.forward(&[7, 8], cache).unwrap();
    }
    assert!(gpu.state_traffic().slots > slots, "{:?}", gpu.state_traffic());
}

/// Speculation on the device: a pass that runs a decided token and three drafts gives each
/// row bitwise the logits plain decoding gives; going back to any accepted draft happens on the
/// device (no state read back), and decoding then goes on bitwise as the plain run. Only the
/// latest pass's positions can be gone back to.
#[test]
fn a_pass_verifying_drafts_decodes_as_plain_steps_and_goes_back_on_the_device() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    verifying_decodes_as_plain_steps(&load_on_gpu(&tiny_hybrid(dir.path()), device.clone()));
}

/// A decided token and 3 drafts in one pass: each row bitwise plain decoding's logits; after
/// keeping 0 to 3 drafts the next step bitwise the plain run's, with no state read back from
/// the device and one rollback there per rejection; no going back past the latest pass.
pub(crate) fn verifying_decodes_as_plain_steps(gpu: &GpuHybrid) {
    let vocab = gpu.config().vocab_size;
    let prompt = [3, 141, 59, 26, 5, 35];
    let round = [10, 20, 30, 40];
    // Plain decoding: the logits after each token of the round, and after a next token 99
    // once `accepted` drafts were kept.
    let plain = |accepted: usize| {
        let mut cache = gpu.new_cache(64);
        gpu.forward(&prompt, &mut cache).unwrap();
        let steps: Vec<Vec<f32>> =
            round[..accepted + 1].iter().map(|&t| gpu.forward(&[t], &mut cache).unwrap()).collect();
        (steps, gpu.forward(&[99], &mut cache).unwrap())
    };
    let (all_four, _) = plain(3);
    for accepted in 0..4 {
        let mut cache = gpu.new_cache(64);
        gpu.forward(&prompt, &mut cache).unwrap();
        let before = gpu.state_traffic();
        let mut rows = gpu
            .forward_batch(&mut [BatchEntry { tokens: &round, cache: &mut cache, logit_rows: 4 }])
            .unwrap();
        let rows = rows.remove(0);
        for (position, want) in all_four.iter().enumerate() {
            let got = &rows[position * vocab..][..vocab];
            same_bits(&format!("verifying row {position} and plain decoding"), got, want);
        }
        cache.truncate(prompt.len() + 1 + accepted).unwrap();
        let next = gpu.forward(&[99], &mut cache).unwrap();
        let (_, want) = plain(accepted);
        same_bits(&format!("the step after keeping {accepted} drafts"), &next, &want);
        let traffic = gpu.state_traffic();
        let went_back = u64::from(accepted < 3);
        assert_eq!(traffic.downloads, before.downloads, "a state read back: {traffic:?}");
        assert_eq!(traffic.rollbacks - before.rollbacks, went_back, "{traffic:?}");
        // The pass before the last can no longer be gone back to.
        assert!(cache.truncate(prompt.len() + 1).is_err(), "went back past the latest pass");
    }
    // Nor can a position before a pass's first, whose state it never kept.
    let mut cache = gpu.new_cache(64);
    gpu.forward(&prompt, &mut cache).unwrap();
    gpu.forward_batch(&mut [BatchEntry { tokens: &round, cache: &mut cache, logit_rows: 4 }])
        .unwrap();
    assert!(cache.truncate(prompt.len()).is_err());
    assert_eq!(cache.len(), prompt.len() + 4, "a refused truncation changed the length");
}

/// Several sequences verifying drafts in one pass, beside one decoding plainly, each keep their
/// own positions' states (history rows one after another): each goes back to its own last
/// accepted draft and decodes on bitwise as it would alone.
#[test]
fn sequences_verifying_drafts_together_each_go_back_to_their_own_positions() {
    let Some(device) = gpu_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gpu = load_on_gpu(&tiny_hybrid(dir.path()), device.clone());
    let prompts: [&[u32]; 3] = [&[3, 141, 59], &[26, 5, 35, 8], &[97, 13]];
    let rounds: [&[u32]; 3] = [&[10, 20, 30], &[40], &[50, 60, 70, 80]];
    // Accepted drafts per sequence; the middle one decodes plainly.
    let kept = [1, 0, 2];
    let alone: Vec<Vec<f32>> = (0..3)
        .map(|i| {
            let mut cache = gpu.new_cache(64);
            gpu.forward(prompts[i], &mut cache).unwrap();
            for &t in &rounds[i][..=kept[i]] {
                gpu.forward(&[t], &mut cache).unwrap();
            }
            gpu.forward(&[99], &mut cache).unwrap()
        })
        .collect();
    let mut caches: Vec<SequenceCache> = (0..3).map(|_| gpu.new_cache(64)).collect();
    for (cache, prompt) in caches.iter_mut().zip(prompts) {
        gpu.forward(prompt, cache).unwrap();
    }
    {
        let mut batch: Vec<BatchEntry> = caches
            .iter_mut()
            .zip(rounds)
            .map(|(cache, round)| BatchEntry { tokens: round, cache, logit_rows: round.len() })
            .collect();
        gpu.forward_batch(&mut batch).unwrap();
    }
    for (i, cache) in caches.iter_mut().enumerate() {
        cache.truncate(prompts[i].len() + 1 + kept[i]).unwrap();
    }
    let mut next = {
        let mut batch: Vec<BatchEntry> =
            caches.iter_mut().map(|cache| BatchEntry::new(&[99], cache)).collect();
        gpu.forward_batch(&mut batch).unwrap()
    };
    for (i, want) in alone.iter().enumerate().rev() {
        same_bits(&format!("sequence {i} after its drafts"), &next.pop().unwrap(), want);
    }
}

/// A decode step in its steady state binds the buffers it bound the step before (outputs,
/// indices and parameter blocks come back from the device's pool place by place), so after
/// the first decode step it makes no bind group and reuses one for every dispatch; the pool
/// stays bounded.
#[test]
fn decode_steps_reuse_their_bind_groups_and_buffers() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A device of its own: the other tests' steps would count too.
    let device = Arc::new(Gpu::open(None).unwrap());
    let gpu = load_on_gpu(&tiny_hybrid(dir.path()), device.clone());
    let mut cache = gpu.new_cache(64);
    gpu.forward(&[3, 141, 59, 26], &mut cache).unwrap();
    gpu.forward(&[5], &mut cache).unwrap();
    let before = device.bind_group_count();
    for token in [7, 9, 11] {
        gpu.forward(&[token], &mut cache).unwrap();
    }
    let after = device.bind_group_count();
    eprintln!("3 steady steps: {:?} → {after:?}; {} bytes pooled", before, device.pooled_bytes());
    assert_eq!(after.made, before.made, "a steady step made bind groups");
    // 133 dispatches a step (measured).
    assert!(after.reused >= before.reused + 3 * 100, "{before:?} → {after:?}");
    assert!(device.pooled_bytes() < 64 << 20, "{} bytes pooled", device.pooled_bytes());
}

/// Largest logit difference from transformers' float32 logits on the hybrid fixtures, the
/// CPU's own bound there (measured on lavapipe: qwen3_next 6.2e-5, qwen3_5_moe 3.6e-4, qwen3_5
/// 7.5e-5; the CPU's 1.1e-4 to 3.0e-4; transformers' two f32 paths differ by up to 2e-4;
/// logits O(10)).
const TRANSFORMERS_TOLERANCE: f32 = 1e-3;

#[derive(Deserialize)]
struct Fixture {
    prompts: Vec<Prompt>,
}

#[derive(Deserialize)]
struct Prompt {
    ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    /// `step_logits[i]` chose `greedy_ids[i]`; step 0 is the prefill's last position.
    step_logits: Vec<Vec<f32>>,
}

/// Greedy steps checked after each fixture prompt: every decode step runs the same kernels (all
/// 15 made each test ~4.5 s on lavapipe, 4 make it ~2.5 s).
const FIXTURE_STEPS: usize = 4;

/// Fixture `name` (tests/data/hybrid/<name>: a tiny seeded model as F32 GGUF, and
/// transformers' logits, from scripts/reference/hybrid/make_hybrid_fixtures.py) on the GPU:
/// each prompt (5, 17 and 80 tokens) and its first greedy steps, fed transformers' tokens,
/// within the bound and with transformers' top-1 at every step.
fn against_transformers(name: &str) {
    let Some(device) = gpu_or_skip() else { return };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid").join(name);
    let text = std::fs::read_to_string(dir.join("fixture.json")).unwrap();
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    let gpu = load_on_gpu(&dir.join("model.gguf"), device.clone());
    let mut worst = 0.0f32;
    // The prompts run batched, a step of each per pass (a row's bits do not depend on the rows
    // beside it, tested above): a third of the passes.
    let mut caches: Vec<_> = fixture.prompts.iter().map(|_| gpu.new_cache(256)).collect();
    for step in 0..=FIXTURE_STEPS {
        let mut batch: Vec<BatchEntry> = (fixture.prompts.iter().zip(&mut caches))
            .map(|(p, cache)| {
                let tokens = match step {
                    0 => &p.ids[..],
                    _ => std::slice::from_ref(&p.greedy_ids[step - 1]),
                };
                BatchEntry::new(tokens, cache)
            })
            .collect();
        let all_logits = gpu.forward_batch(&mut batch).unwrap();
        for (p, logits) in fixture.prompts.iter().zip(all_logits) {
            let at = format!("{name}, {} tokens, step {step}", p.ids.len());
            assert_eq!(argmax(&logits), p.greedy_ids[step], "{at}: top-1");
            let want = &p.step_logits[step];
            worst =
                worst.max(logits.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max));
            assert!(worst <= TRANSFORMERS_TOLERANCE, "{at}: logits differ by {worst}");
        }
    }
    eprintln!("{name} on the GPU: max logit difference from transformers {worst:.2e}");
}

#[test]
fn the_qwen3_next_fixture_on_the_gpu_matches_transformers() {
    against_transformers("qwen3_next");
}

#[test]
fn the_qwen3_5_moe_fixture_on_the_gpu_matches_transformers() {
    against_transformers("qwen3_5_moe");
}

#[test]
fn the_qwen3_5_dense_fixture_on_the_gpu_matches_transformers() {
    against_transformers("qwen3_5");
}
