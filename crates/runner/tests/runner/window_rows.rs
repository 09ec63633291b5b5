//! Sliding-window rows given back to the OS (Gemma 3: five of every six layers see only the
//! last positions of a window). On a tiny random Gemma 3 whose window is 64 positions (the real
//! model's mechanism at an eighth of its 512, so prompts run past it in a few hundred
//! positions): outputs are bitwise those of an engine that keeps every row, a cached system
//! prompt still resumes (its window is pinned), and a prompt that could resume where the rows
//! are gone reads its prompt again instead of zeros.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{greedy, run, smollm2, BLOCK_SIZE};
use spindle_chat::ChatTemplate;
use spindle_models::random_gemma::{write_random_gemma, GemmaShape};
use spindle_runner::{CacheConfig, Engine, EngineConfig, ModelBundle};

const CONTEXT: usize = 1024;

/// The sliding layers' window.
const WINDOW: usize = 64;

/// A tiny Gemma 3 over SmolLM2's vocabulary and tokenizer (two sliding layers, then a global
/// one).
fn tiny_gemma() -> Arc<ModelBundle> {
    let smollm2 = smollm2();
    let dir = tempfile::tempdir().unwrap();
    let shape = GemmaShape::tiny(smollm2.model.config().vocab_size, WINDOW);
    write_random_gemma(dir.path(), &shape, 61).unwrap();
    Arc::new(ModelBundle {
        model: spindle_models::load_safetensors(dir.path()).unwrap(),
        tokenizer: smollm2.tokenizer.clone(),
        template: ChatTemplate::chatml(),
        fingerprint: "tiny-gemma".into(),
        sampling: Default::default(),
    })
}

fn engine(bundle: &Arc<ModelBundle>, release_window_rows: bool) -> Engine {
    let cache = CacheConfig {
        kv_bytes: 256 << 20,
        snapshot_bytes: 64 << 20,
        block_size: BLOCK_SIZE,
        release_window_rows,
        ..CacheConfig::default()
    };
    let config =
        EngineConfig { prefill_chunk: 128, step_tokens: 256, ..EngineConfig::new(1, cache) };
    Engine::start(bundle.clone(), config)
}

/// `n` token ids from a fixed sequence of `seed` (ordinary vocabulary entries).
fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1000 + (i.wrapping_mul(7919) ^ seed.wrapping_mul(104_729)) % 30_000)
        .collect()
}

#[test]
fn released_window_rows_change_no_output_and_are_never_resumed_from() {
    let bundle = tiny_gemma();
    let windows: Vec<_> = bundle.model.kv_shapes().iter().flatten().map(|s| s.window).collect();
    assert_eq!(windows, [Some(WINDOW), Some(WINDOW), None]);
    // Past the window and then some: 160 positions of system prompt.
    let system = tokens(1, 160);
    let with = |head: &[u32], seed| [head, &tokens(seed, 64)].concat();
    // A system prompt and two users (snapshots at the end of each message), then a prompt
    // sharing only the first 96 positions of the system prompt.
    let prompts = [
        (with(&system, 2), vec![160, 224]),
        (with(&system, 3), vec![160, 224]),
        (with(&system[..96], 4), vec![96]),
    ];
    let mut results = Vec::new();
    for release in [true, false] {
        let engine = engine(&bundle, release);
        let mut runs = Vec::new();
        let mut released = Vec::new();
        for (prompt, snapshots) in &prompts {
            runs.push(run(&engine, prompt, snapshots, greedy(), CONTEXT));
            released.push(engine.load().kv_window_released_blocks.load(Ordering::Relaxed));
        }
        results.push((runs, released));
    }
    let [(released_runs, released), (kept_runs, kept)] = &results[..] else { unreachable!() };
    // The first prompt ended 12 tokens past its 224, well past blocks 0..6 (positions 0..96);
    // the system prompt's snapshot pins the window before it (96..160), so the second prompt
    // adds none; the third, read anew, gives back its own first blocks.
    assert_eq!(released[..2], [6, 6]);
    assert!(released[2] > 6, "{released:?}");
    assert_eq!(kept, &[0, 0, 0]);
    for (i, ((a, _), (b, _))) in released_runs.iter().zip(kept_runs).enumerate() {
        assert_eq!(a, b, "prompt {i}: the same bits either way");
    }
    let cached = |runs: &Vec<(common::Output, usize)>| runs.iter().map(|r| r.1).collect::<Vec<_>>();
    // The second user resumes after the system prompt in both. The third prompt could resume
    // after the 96 positions it shares, which needs positions 0..96, whose rows in the sliding
    // layers are gone in the first engine: it reads its prompt again there.
    assert_eq!(cached(kept_runs), [0, 160, 96]);
    assert_eq!(cached(released_runs), [0, 160, 0]);
}
