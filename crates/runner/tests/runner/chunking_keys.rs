//! Where prompts are cut, and what the prefix cache may reuse because of it. On a hybrid model the
//! recurrent state of a position depends on the chunks that computed it, so a block is reused only
//! when it was computed under the prompt's own cuts. On an attention-only model every kernel
//! computes a row alone, so outputs do not depend on the cuts at all: a prompt resumes wherever it
//! stops sharing tokens with a cached one, even inside a message, and after a cached reply. Runs on
//! the real default model (SmolLM2-135M, pulled on first use) and on the tiny hybrid fixture, with
//! a small prefill chunk so that short prompts have several cuts.

use crate::common;

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
/// `0..25`) must give exactly what they give on a fresh engine. `b` resumes on `a`'s blocks at
/// `b_resumes_at`: 0 where other cuts compute other bits.
fn prompts_cut_differently(
    bundle: &Arc<ModelBundle>,
    [_, a, b, c]: [Vec<u32>; 4],
    b_resumes_at: usize,
) {
    let cold =
        |prompt: &[u32], snapshots: &[usize]| greedy_run(&engine(bundle, None), prompt, snapshots);
    let (cold_a, _) = cold(&a, &[]);
    let (cold_b, _) = cold(&b, &[SHARED]);
    let (cold_c, _) = cold(&c, &[SHARED]);

    let warm = engine(bundle, None);
    assert_eq!(greedy_run(&warm, &a, &[]), (cold_a.clone(), 0));
    assert_eq!(greedy_run(&warm, &b, &[SHARED]), (cold_b.clone(), b_resumes_at));
    // `c` resumes at the snapshot `b` left at 25.
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
fn blocks_of_a_prompt_cut_elsewhere_are_reused_by_an_attention_only_model() {
    let prompts = smollm2_prompts(&smollm2());
    let shared = common_prefix(&prompts[1], &prompts[2]);
    assert!(shared >= SHARED);
    prompts_cut_differently(&smollm2(), prompts, shared);
}

#[test]
fn blocks_of_a_prompt_cut_elsewhere_are_not_reused_by_a_hybrid_model() {
    prompts_cut_differently(&hybrid(), hybrid_prompts(), 0);
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A prompt that ends where a longer prompt left a snapshot without logits: its own logits are
/// added to that snapshot, in memory and on disk, so that it is served from the cache next time.
/// The first time it computes them from `resumes_at` (an attention-only model reads just the
/// last token again; a hybrid one has no state one token earlier).
fn a_prompt_ending_at_a_logits_less_snapshot_keeps_its_logits(
    bundle: &Arc<ModelBundle>,
    [shared, long, ..]: [Vec<u32>; 4],
    resumes_at: usize,
) {
    let root = tempfile::tempdir().unwrap();
    let (cold_short, _) = greedy_run(&engine(bundle, None), &shared, &[]);
    let (cold_long, _) = greedy_run(&engine(bundle, None), &long, &[SHARED]);

    let warm = engine(bundle, Some(root.path()));
    assert_eq!(greedy_run(&warm, &long, &[SHARED]), (cold_long, 0));
    // The snapshot at 25 has no logits: the short prompt computes them...
    assert_eq!(greedy_run(&warm, &shared, &[]), (cold_short.clone(), resumes_at));
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
        SHARED - 1,
    );
}

#[test]
fn a_prompt_ending_at_a_snapshot_without_logits_keeps_its_logits_on_a_hybrid_model() {
    a_prompt_ending_at_a_logits_less_snapshot_keeps_its_logits(&hybrid(), hybrid_prompts(), 0);
}

/// The foundation of the attention-only rules: the same prompt cut anywhere (down to a token per
/// chunk) gives the same bits.
#[test]
fn attention_only_outputs_do_not_depend_on_the_cuts() {
    let bundle = smollm2();
    let [_, a, ..] = smollm2_prompts(&bundle);
    let (reference, _) = greedy_run(&engine(&bundle, None), &a, &[]);
    let every: Vec<usize> = (1..a.len()).collect();
    for cuts in [vec![SHARED], vec![1, 2, 3, 17], vec![5, 13, 29, 30], every] {
        assert_eq!(greedy_run(&engine(&bundle, None), &a, &cuts).0, reference, "cuts {cuts:?}");
    }
}

/// Two prompts that share 79 tokens and then differ inside the same message, with no snapshot
/// or chunk cut where they part: the second resumes at the 79th token, bitwise cold.
#[test]
fn an_attention_only_prompt_resumes_where_it_parts_from_a_cached_one() {
    let bundle = smollm2();
    let encode = |text: &str| bundle.tokenizer.encode(text, false).unwrap();
    let text =
        "The harbour master counted the boats each morning before the fog lifted. ".repeat(8);
    let mut shared = encode(&text);
    shared.truncate(79);
    let x = [shared.clone(), encode(" Then the bell rang twice and the gulls rose from the pier.")]
        .concat();
    let y = [shared, encode(" Nobody had seen the lighthouse dark in forty years of service.")]
        .concat();
    let parted = common_prefix(&x, &y);
    assert!((79..81).contains(&parted), "{parted}");
    let (cold_y, _) = greedy_run(&engine(&bundle, None), &y, &[]);
    let warm = engine(&bundle, None);
    greedy_run(&warm, &x, &[]);
    assert_eq!(greedy_run(&warm, &y, &[]), (cold_y, parted));
}

/// A client sends the reply back as history: the next prompt resumes after the reply's last
/// token that went into the model, bitwise cold.
#[test]
fn an_attention_only_reply_stays_cached_after_its_prompt() {
    let bundle = smollm2();
    let [_, a, ..] = smollm2_prompts(&bundle);
    let (first, _) = greedy_run(&engine(&bundle, None), &a, &[]);
    let reply: Vec<u32> = first.tokens.iter().map(|t| t.id).collect();
    assert_eq!(reply.len(), 12, "runs to max_tokens (no stop ids)");
    let next =
        [a.clone(), reply.clone(), bundle.tokenizer.encode(" And then?", false).unwrap()].concat();
    let (cold_next, _) = greedy_run(&engine(&bundle, None), &next, &[]);
    let warm = engine(&bundle, None);
    assert_eq!(greedy_run(&warm, &a, &[]), (first, 0));
    // The last reply token was sampled but never run: the cache holds the others.
    assert_eq!(greedy_run(&warm, &next, &[]), (cold_next, a.len() + reply.len() - 1));
}
