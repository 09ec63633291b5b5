//! Paged keys/values: a sequence whose blocks are scattered through a shared pool, or that
//! resumes from blocks another sequence wrote (copying the partly filled last one), computes
//! bit for bit what a sequence with storage of its own computes, given the same prefill chunks.
//! (Different chunks do change low bits, even for attention-only models: matmuls of different
//! row counts round differently. So the prefix cache resumes a prompt only where its own chunking
//! would have cut it anyway.)
//! All of this holds for every KV cache type: rows are converted when written, one by one.

use crate::common;

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use std::sync::Arc;

use spindle_models::{
    load_gguf, load_safetensors, BatchEntry, CausalLm, KvType, PagedKv, SequenceCache,
};

const BLOCK: usize = 16;

/// The KV types SmolLM2 runs here: the default and the one stored in quantized blocks. Every
/// type goes through the same pool and attention code on the tiny hybrid, at a fraction of a
/// real model's cost.
const SMOLLM2_KV_TYPES: [KvType; 2] = [KvType::F16, KvType::Q8_0];

fn smollm2() -> Box<dyn CausalLm> {
    let path = spindle_hub::pull("smollm2-135m", &spindle_hub::spindle_home())
        .unwrap_or_else(|e| panic!("smollm2-135m: {e}"));
    load_gguf(&path).unwrap()
}

fn tiny_hybrid() -> Box<dyn CausalLm> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid/qwen3_5_moe");
    load_safetensors(&dir).unwrap()
}

/// The tiny random hybrid fixture `name` (`qwen3_5_moe`, `qwen3_5`, `qwen3_next`), from its
/// safetensors.
fn hybrid_fixture(name: &str) -> Box<dyn CausalLm> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid").join(name);
    load_safetensors(&dir).unwrap()
}

fn tiny_hybrid_gguf() -> Box<dyn CausalLm> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/hybrid/qwen3_5_moe/model.gguf");
    load_gguf(&path).unwrap()
}

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7919 + seed * 104_729) % 500 + 10).collect()
}

/// Runs `tokens` in chunks ending at `cuts` (and at the end), adding blocks from `free` as
/// positions need them; returns the logits after the last token.
fn run_chunks(
    model: &dyn CausalLm,
    cache: &mut SequenceCache,
    tokens: &[u32],
    cuts: &[usize],
    free: &mut Vec<u32>,
) -> Vec<f32> {
    let mut start = cache.len();
    let mut logits = Vec::new();
    let first = start;
    for end in cuts.iter().copied().filter(|&c| c > first && c < tokens.len()).chain([tokens.len()])
    {
        let need = cache.blocks_needed(end - start);
        let blocks: Vec<u32> = free.drain(..need).collect();
        cache.add_blocks(&blocks);
        logits = model.forward(&tokens[start..end], cache).unwrap();
        start = end;
    }
    logits
}

/// A cache of `kind` with storage of its own.
fn own_cache(model: &dyn CausalLm, kind: KvType, limit: usize) -> SequenceCache {
    SequenceCache::standalone(&model.kv_shapes(), kind, model.initial_recurrent_state(), limit)
}

fn alone(model: &dyn CausalLm, kind: KvType, tokens: &[u32], cuts: &[usize]) -> Vec<f32> {
    let mut cache = own_cache(model, kind, 512);
    run_chunks(model, &mut cache, tokens, cuts, &mut Vec::new())
}

fn shared_pool(model: &dyn CausalLm, kind: KvType) -> Arc<PagedKv> {
    Arc::new(PagedKv::new(&model.kv_shapes(), kind, 64, BLOCK))
}

/// Blocks handed out out of order, so no sequence's positions are contiguous in the pool.
fn scrambled_free_list() -> Vec<u32> {
    (0..64u32).map(|i| (i * 37 + 11) % 64).collect()
}

#[track_caller]
fn assert_bits(a: &[f32], b: &[f32], what: &str) {
    let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert!(a.len() == b.len() && differ == 0, "{what}: {differ} of {} logits differ", a.len());
}

/// Two sequences share a prompt prefix that ends mid-block; the second resumes from the
/// first's blocks, copies the partial one, and both then diverge.
fn check_shared_prefix(model: &dyn CausalLm, kind: KvType, name: &str) {
    let name = &format!("{name} ({kind} KV)");
    let kv = shared_pool(model, kind);
    let mut free = scrambled_free_list();
    let prefix = prompt(45, 1);
    let first: Vec<u32> = prefix.iter().copied().chain(prompt(20, 2)).collect();
    let second: Vec<u32> = prefix.iter().copied().chain(prompt(30, 3)).collect();
    let cuts = [prefix.len()];

    let mut a =
        SequenceCache::resume(kv.clone(), Vec::new(), 0, model.initial_recurrent_state(), 512);
    run_chunks(model, &mut a, &first[..prefix.len()], &[], &mut free);
    let at_prefix = a.recurrent().clone();
    let a_logits = run_chunks(model, &mut a, &first, &cuts, &mut free);
    assert_bits(
        &a_logits,
        &alone(model, kind, &first, &cuts),
        &format!("{name}: scattered blocks"),
    );

    // The second sequence takes the first's full blocks and a copy of the partial one.
    let full = prefix.len() / BLOCK;
    let mut blocks = a.blocks()[..full].to_vec();
    let copy = free.remove(0);
    kv.copy_positions(a.blocks()[full], copy, prefix.len() % BLOCK).unwrap();
    blocks.push(copy);
    let mut b = SequenceCache::resume(kv.clone(), blocks, prefix.len(), at_prefix, 512);
    let b_logits = run_chunks(model, &mut b, &second, &cuts, &mut free);
    assert_bits(
        &b_logits,
        &alone(model, kind, &second, &cuts),
        &format!("{name}: resumed from a shared prefix"),
    );

    // The first goes on decoding in its own blocks, undisturbed by the second.
    let decoded: Vec<u32> = first.iter().copied().chain([42]).collect();
    let a_next = run_chunks(model, &mut a, &decoded, &[], &mut free);
    let expected = alone(model, kind, &decoded, &[prefix.len(), first.len()]);
    assert_bits(
        &a_next,
        &expected,
        &format!("{name}: the writer of the shared prefix decoding on"),
    );
}

#[test]
fn sequences_in_a_shared_pool_match_sequences_alone() {
    let (smollm2, hybrid) = (smollm2(), tiny_hybrid());
    for kind in KvType::ALL {
        check_shared_prefix(hybrid.as_ref(), kind, "qwen3_5_moe");
    }
    for kind in SMOLLM2_KV_TYPES {
        check_shared_prefix(smollm2.as_ref(), kind, "smollm2");
    }
}

#[test]
fn a_standalone_snapshot_continues_like_the_original() {
    let model = smollm2();
    let tokens = prompt(70, 5);
    for kind in KvType::ALL {
        let mut cache = own_cache(model.as_ref(), kind, 256);
        model.forward(&tokens[..50], &mut cache).unwrap();
        let mut copy = cache.snapshot().unwrap();
        let original = model.forward(&tokens[50..], &mut cache).unwrap();
        let resumed = model.forward(&tokens[50..], &mut copy).unwrap();
        assert_bits(&resumed, &original, &format!("snapshot ({kind} KV)"));
    }
}

/// Several sequences decoding together — at different lengths, some still prefilling — get the
/// very logits each gets alone.
fn check_batch_invariance(model: &dyn CausalLm, kind: KvType, name: &str) {
    let name = &format!("{name} ({kind} KV)");
    let prompts: Vec<Vec<u32>> = (0..5).map(|i| prompt(9 + 13 * i, 10 + i as u32)).collect();
    let next: Vec<u32> = (0..5).map(|i| 20 + 3 * i).collect();
    // Alone: each prompt, then one decode step.
    let alone: Vec<(Vec<f32>, Vec<f32>)> = prompts
        .iter()
        .zip(&next)
        .map(|(p, &t)| {
            let mut cache = own_cache(model, kind, 256);
            let after_prompt = model.forward(p, &mut cache).unwrap();
            (after_prompt, model.forward(&[t], &mut cache).unwrap())
        })
        .collect();
    // Together: all prompts in one pass, then all decode steps in one pass.
    let mut caches: Vec<SequenceCache> =
        prompts.iter().map(|_| own_cache(model, kind, 256)).collect();
    let mut batch: Vec<BatchEntry> =
        prompts.iter().zip(caches.iter_mut()).map(|(p, cache)| BatchEntry::new(p, cache)).collect();
    let after_prompts = model.forward_batch(&mut batch).unwrap();
    let steps: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
    let mut batch: Vec<BatchEntry> =
        steps.iter().zip(caches.iter_mut()).map(|(t, cache)| BatchEntry::new(t, cache)).collect();
    let after_steps = model.forward_batch(&mut batch).unwrap();
    for (i, (prompt_logits, step_logits)) in alone.iter().enumerate() {
        assert_bits(
            &after_prompts[i],
            prompt_logits,
            &format!("{name}: sequence {i}'s prompt in a batch of 5"),
        );
        assert_bits(
            &after_steps[i],
            step_logits,
            &format!("{name}: sequence {i}'s decode step in a batch of 5"),
        );
    }
}

#[test]
fn sequences_batched_together_match_sequences_alone() {
    let (smollm2, hybrid) = (smollm2(), tiny_hybrid_gguf());
    for kind in KvType::ALL {
        check_batch_invariance(hybrid.as_ref(), kind, "qwen3_5_moe (GGUF)");
    }
    for kind in SMOLLM2_KV_TYPES {
        check_batch_invariance(smollm2.as_ref(), kind, "smollm2");
    }
    // Quantized weights take candle's repacked kernels, which tile rows.
    let tmp = tempfile::tempdir().unwrap();
    let q8 = tmp.path().join("q8_0.gguf");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/hybrid/qwen3_5_moe/model.gguf");
    assert!(common::gguf_rewrite::rewrite_gguf(&source, &q8, GgmlDType::Q8_0) > 0);
    check_batch_invariance(
        load_gguf(&q8).unwrap().as_ref(),
        KvType::default(),
        "qwen3_5_moe (Q8_0 GGUF)",
    );
    check_batch_invariance(
        tiny_hybrid().as_ref(),
        KvType::default(),
        "qwen3_5_moe (f32 safetensors)",
    );
}

/// A speculative round: a run of tokens in one pass, with logits wanted after each, gets the
/// very logits decoding them one at a time gets; forgetting the last of them and running
/// another token instead gets that token's decode logits too.
fn check_verified_run(model: &dyn CausalLm, kind: KvType, name: &str) {
    let name = &format!("{name} ({kind} KV)");
    let prompt = prompt(37, 5);
    let run: Vec<u32> = (0..5).map(|i| 40 + 11 * i).collect();
    let mut one_by_one = own_cache(model, kind, 256);
    model.forward(&prompt, &mut one_by_one).unwrap();
    let decoded: Vec<Vec<f32>> =
        run.iter().map(|&t| model.forward(&[t], &mut one_by_one).unwrap()).collect();
    let mut verified = own_cache(model, kind, 256);
    model.forward(&prompt, &mut verified).unwrap();
    let mut entry = BatchEntry::new(&run, &mut verified);
    entry.logit_rows = run.len();
    let rows = model.forward_batch(&mut [entry]).unwrap().pop().unwrap();
    let vocab = decoded[0].len();
    assert_eq!(rows.len(), run.len() * vocab, "{name}: one vocabulary per row");
    for (i, (row, want)) in rows.chunks_exact(vocab).zip(&decoded).enumerate() {
        assert_bits(row, want, &format!("{name}: row {i} of a run of {}", run.len()));
    }
    // The last two drafts rejected: the cache goes back and runs another token there.
    verified.truncate(prompt.len() + 3).unwrap();
    let other = model.forward(&[7], &mut verified).unwrap();
    if one_by_one.recurrent().is_empty() {
        // Attention forgets positions wherever they came from.
        one_by_one.truncate(prompt.len() + 3).unwrap();
        assert_bits(&other, &model.forward(&[7], &mut one_by_one).unwrap(), name);
    }
    let mut fresh = own_cache(model, kind, 256);
    model.forward(&prompt, &mut fresh).unwrap();
    let after: Vec<u32> = run[..3].iter().copied().chain([7]).collect();
    let want = after.iter().map(|&t| model.forward(&[t], &mut fresh).unwrap()).last().unwrap();
    assert_bits(&other, &want, &format!("{name}: a token after forgetting two"));
}

#[test]
fn a_verified_run_gets_each_tokens_decode_logits() {
    let smollm2 = smollm2();
    for kind in SMOLLM2_KV_TYPES {
        check_verified_run(smollm2.as_ref(), kind, "smollm2");
    }
    let hybrid = tiny_hybrid_gguf();
    for kind in KvType::ALL {
        check_verified_run(hybrid.as_ref(), kind, "qwen3_5_moe (GGUF)");
    }
}

/// `run` (one verification pass) after `prompt`, with logits for every row.
fn verify(model: &dyn CausalLm, cache: &mut SequenceCache, run: &[u32]) -> Vec<f32> {
    let mut entry = BatchEntry::new(run, cache);
    entry.logit_rows = run.len();
    model.forward_batch(&mut [entry]).unwrap().pop().unwrap()
}

/// The recurrent state's numbers as bits, for a bitwise comparison.
fn state_bits(cache: &SequenceCache) -> Vec<u32> {
    cache.recurrent().to_floats().iter().map(|v| v.to_bits()).collect()
}

/// On every hybrid fixture, a verification pass of `k` positions kept up to its `j`-th leaves
/// the recurrent state (the delta rule's matrices and the convolution window) bitwise what
/// decoding exactly those `j` tokens one at a time leaves, and the next token's logits too;
/// going back twice within one pass, and a second pass after going back, work alike.
#[test]
fn a_verified_run_kept_to_any_position_is_that_many_tokens_decoded() {
    let prompt = prompt(37, 5);
    let run: Vec<u32> = (0..6).map(|i| 40 + 11 * i).collect();
    for name in ["qwen3_5_moe", "qwen3_5", "qwen3_next"] {
        let model = hybrid_fixture(name);
        let model = model.as_ref();
        let decoded_after = |tokens: &[u32]| {
            let mut cache = own_cache(model, KvType::default(), 256);
            model.forward(&prompt, &mut cache).unwrap();
            for &t in tokens {
                model.forward(&[t], &mut cache).unwrap();
            }
            cache
        };
        for keep in 1..=run.len() {
            let what = format!("{name}: {keep} of {} positions kept", run.len());
            let mut verified = own_cache(model, KvType::default(), 256);
            model.forward(&prompt, &mut verified).unwrap();
            verify(model, &mut verified, &run);
            verified.truncate(prompt.len() + keep).unwrap();
            let mut decoded = decoded_after(&run[..keep]);
            assert_eq!(verified.len(), decoded.len(), "{what}");
            assert!(state_bits(&verified) == state_bits(&decoded), "{what}: states differ");
            let next = model.forward(&[7], &mut verified).unwrap();
            assert_bits(&next, &model.forward(&[7], &mut decoded).unwrap(), &what);
        }
        // Back twice within one pass, then a second pass from there.
        let mut cache = own_cache(model, KvType::default(), 256);
        model.forward(&prompt, &mut cache).unwrap();
        verify(model, &mut cache, &run);
        cache.truncate(prompt.len() + 4).unwrap();
        cache.truncate(prompt.len() + 2).unwrap();
        verify(model, &mut cache, &[9, 8, 7]);
        cache.truncate(prompt.len() + 3).unwrap();
        let decoded = decoded_after(&[run[0], run[1], 9]);
        assert!(state_bits(&cache) == state_bits(&decoded), "{name}: back twice, then again");
    }
}

/// A recurrent state goes back only within the latest verification pass; anywhere else the
/// cache refuses and stays as it was.
#[test]
fn a_recurrent_state_goes_back_only_within_the_latest_verification() {
    let model = tiny_hybrid();
    let model = model.as_ref();
    let mut cache = own_cache(model, KvType::default(), 64);
    model.forward(&prompt(9, 1), &mut cache).unwrap();
    let before = state_bits(&cache);
    assert!(cache.truncate(5).is_err(), "after a prompt chunk");
    verify(model, &mut cache, &[11, 12, 13]);
    let verified = state_bits(&cache);
    assert!(cache.truncate(9).is_err(), "before the pass's first position");
    assert!(cache.truncate(12).is_ok(), "to the pass's last position: nothing to do");
    assert_eq!((cache.len(), state_bits(&cache) == verified), (12, true));
    model.forward(&[14], &mut cache).unwrap();
    assert!(cache.truncate(11).is_err(), "a plain step after the pass ends it");
    assert_eq!(cache.len(), 13);
    assert!(state_bits(&cache) != before);
}
