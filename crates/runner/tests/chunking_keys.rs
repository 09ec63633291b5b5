//! The prefix cache reuses a block only when it was computed under the same prefill cuts as the
//! prompt would compute it: the keys and values of a position depend on the chunk that computed
//! them, so blocks of equal tokens from a prompt cut elsewhere would make a cached run differ from
//! a cold one. Runs on the real default model (SmolLM2-135M, pulled on first use) and on the tiny
//! hybrid fixture, with a small prefill chunk so that short prompts have several cuts.

mod common;

use std::sync::Arc;

use common::{engine, greedy, hybrid, smollm2, Output, PREFILL_CHUNK};
use spindle_runner::{Engine, ModelBundle};

/// The shared prefix: a multiple of neither the block size nor the chunk.
const SHARED: usize = 25;

/// One greedy request run to its end: its output and the prompt positions taken from the cache.
fn greedy_run(engine: &Engine, prompt: &[u32], snapshots: &[usize]) -> (Output, usize) {
    common::run(engine, prompt, snapshots, greedy(), 256)
}

/// A shared prefix of [`SHARED`] tokens and three continuations, as SmolLM2 ids.
fn smollm2_prompts(bundle: &ModelBundle) -> [Vec<u32>; 4] {
    let encode = |text: &str, special| bundle.tokenizer.encode(text, special).unwrap();
    let mut shared = encode(
        "The lighthouse keeper wrote in his log every evening. He noted the wind, the colour of the sea, the ships \
         that passed and the birds that rested on the rail.",
        true,
    );
    assert!(shared.len() > SHARED, "{} tokens", shared.len());
    shared.truncate(SHARED);
    let turns = [
        " One winter the lamp failed on the longest night, and he climbed the stairs with a lantern.",
        " In the spring a storm tore the roof from the boat house and scattered the nets.",
        " His daughter came every summer with letters from the town across the bay.",
    ];
    let [a, b, c] = turns.map(|turn| [shared.clone(), encode(turn, false)].concat());
    for prompt in [&a, &b, &c] {
        assert!(
            prompt.len() > PREFILL_CHUNK,
            "{} tokens: the first chunk must end past the shared prefix",
            prompt.len()
        );
    }
    [shared, a, b, c]
}

/// The same shape of prompts for the hybrid fixture (ids below its vocabulary of 512).
fn hybrid_prompts() -> [Vec<u32>; 4] {
    let shared: Vec<u32> = (0..SHARED as u32).map(|i| (i * 37 + 11) % 500).collect();
    let turn = |seed: u32| (0..20u32).map(|i| (i * 91 + seed) % 500).collect::<Vec<_>>();
    [
        shared.clone(),
        [shared.clone(), turn(3)].concat(),
        [shared.clone(), turn(5)].concat(),
        [shared, turn(7)].concat(),
    ]
}

/// Prompt `a` (no snapshots: the shared prefix is computed in its first chunk, `0..32`) runs
/// first; then `b` and `c` (a snapshot at the end of the shared prefix: their first chunk is
/// `0..25`) must give exactly what they give on a fresh engine.
fn a_prefix_computed_under_other_cuts_is_not_reused(
    bundle: &Arc<ModelBundle>,
    [_, a, b, c]: [Vec<u32>; 4],
) {
    let cold =
        |prompt: &[u32], snapshots: &[usize]| greedy_run(&engine(bundle, None), prompt, snapshots);
    let (cold_a, _) = cold(&a, &[]);
    let (cold_b, _) = cold(&b, &[SHARED]);
    let (cold_c, _) = cold(&c, &[SHARED]);

    let warm = engine(bundle, None);
    assert_eq!(greedy_run(&warm, &a, &[]), (cold_a.clone(), 0));
    // No snapshot at 25 yet: `b` prefills all of it, and leaves one.
    assert_eq!(greedy_run(&warm, &b, &[SHARED]), (cold_b.clone(), 0));
    // `c` resumes there, on `b`'s blocks, not on `a`'s blocks of the same tokens.
    assert_eq!(
        greedy_run(&warm, &c, &[SHARED]),
        (cold_c, SHARED),
        "resumed from the shared prefix"
    );
    // Whole prompts from the cache, and decoding on their blocks.
    assert_eq!(greedy_run(&warm, &b, &[SHARED]), (cold_b, b.len()));
    assert_eq!(greedy_run(&warm, &a, &[]), (cold_a, a.len()));
}

#[test]
fn blocks_of_a_prompt_cut_elsewhere_are_not_reused() {
    a_prefix_computed_under_other_cuts_is_not_reused(&smollm2(), smollm2_prompts(&smollm2()));
}

#[test]
fn blocks_of_a_prompt_cut_elsewhere_are_not_reused_by_a_hybrid_model() {
    a_prefix_computed_under_other_cuts_is_not_reused(&hybrid(), hybrid_prompts());
}

/// A prompt that ends where a longer prompt left a snapshot without logits: its own logits are
/// added to that snapshot, in memory and on disk, so that it is served from the cache next time.
fn a_prompt_ending_at_a_logits_less_snapshot_keeps_its_logits(
    bundle: &Arc<ModelBundle>,
    [shared, long, ..]: [Vec<u32>; 4],
) {
    let root = tempfile::tempdir().unwrap();
    let (cold_short, _) = greedy_run(&engine(bundle, None), &shared, &[]);
    let (cold_long, _) = greedy_run(&engine(bundle, None), &long, &[SHARED]);

    let warm = engine(bundle, Some(root.path()));
    assert_eq!(greedy_run(&warm, &long, &[SHARED]), (cold_long, 0));
    // The snapshot at 25 has no logits: the short prompt computes them...
    assert_eq!(greedy_run(&warm, &shared, &[]), (cold_short.clone(), 0));
    // ... and keeps them.
    assert_eq!(greedy_run(&warm, &shared, &[]), (cold_short.clone(), SHARED));
    drop(warm);
    // The file at 25 was rewritten with them.
    assert_eq!(greedy_run(&engine(bundle, Some(root.path())), &shared, &[]), (cold_short, SHARED));
}

#[test]
fn a_prompt_ending_at_a_snapshot_without_logits_keeps_its_logits() {
    a_prompt_ending_at_a_logits_less_snapshot_keeps_its_logits(
        &smollm2(),
        smollm2_prompts(&smollm2()),
    );
}

#[test]
fn a_prompt_ending_at_a_snapshot_without_logits_keeps_its_logits_on_a_hybrid_model() {
    a_prompt_ending_at_a_logits_less_snapshot_keeps_its_logits(&hybrid(), hybrid_prompts());
}
