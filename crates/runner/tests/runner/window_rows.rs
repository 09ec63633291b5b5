//! Sliding-window rows given back to the OS (Gemma 3: five of every six layers see only the
//! last 512 positions). On the real Gemma-3-270M: outputs are bitwise those of an engine that
//! keeps every row, a cached system prompt still resumes (its window is pinned), and a prompt
//! that could resume where the rows are gone reads its prompt again instead of zeros.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{greedy, run, BLOCK_SIZE};
use spindle_hub::ModelFiles;
use spindle_runner::{CacheConfig, Engine, EngineConfig, ModelBundle};

const CONTEXT: usize = 4096;

fn gemma3() -> Arc<ModelBundle> {
    let path = spindle_hub::pull("gemma3-270m", &spindle_hub::spindle_home())
        .unwrap_or_else(|e| panic!("gemma3-270m: {e}"));
    Arc::new(ModelBundle::load(&ModelFiles::Gguf(path)).unwrap())
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
    let bundle = gemma3();
    let windows: Vec<_> = bundle.model.kv_shapes().iter().flatten().map(|s| s.window).collect();
    assert_eq!(windows.iter().filter(|w| **w == Some(512)).count(), 15, "{windows:?}");
    // Past the 512-position window and no longer (every position read costs time).
    let system = tokens(1, 600);
    let with = |head: &[u32], seed| [head, &tokens(seed, 200)].concat();
    // A system prompt and two users (snapshots at the end of each message), then a prompt
    // sharing only the first 400 positions of the system prompt.
    let prompts = [
        (with(&system, 2), vec![600, 800]),
        (with(&system, 3), vec![600, 800]),
        (with(&system[..400], 4), vec![600]),
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
    // The first prompt ended ~730 positions past blocks 0..5 (positions 0..80); the system
    // prompt's snapshot pins the 512 positions before it (88..600), so the second prompt adds
    // none; the third, read anew, gives back its own first blocks.
    assert_eq!(released[..2], [5, 5]);
    assert!(released[2] > 5, "{released:?}");
    assert_eq!(kept, &[0, 0, 0]);
    for (i, ((a, _), (b, _))) in released_runs.iter().zip(kept_runs).enumerate() {
        assert_eq!(a, b, "prompt {i}: the same bits either way");
    }
    let cached = |runs: &Vec<(common::Output, usize)>| runs.iter().map(|r| r.1).collect::<Vec<_>>();
    // The second user resumes after the system prompt in both. The third prompt could resume
    // after the 400 positions it shares, which needs positions 0..400, whose first rows are
    // gone in the first engine: it reads its prompt again there.
    assert_eq!(cached(kept_runs), [0, 600, 400]);
    assert_eq!(cached(released_runs), [0, 600, 0]);
}
