//! A growing conversation, as coding agents send it: each call is the previous prompt, the
//! model's reply and a new message. Given the snapshot positions the server asks for (the end
//! of every earlier message and of every earlier prompt), each call resumes at least where the
//! previous call's prompt ended (on an attention-only model, after the reply that followed it),
//! and its output is bitwise the one a cold engine gives.

use crate::common;

use std::sync::Arc;

use common::{engine, greedy, hybrid, run, tiny_dense, vocab};
use spindle_runner::ModelBundle;

const TURNS: usize = 10;

/// Deterministic ids below `vocab` (the hybrid fixture's vocabulary is 512).
fn message(turn: usize, len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 31 + turn as u32 * 97 + 11) % (vocab - 2) + 1).collect()
}

/// Whether a finished reply stays cached after its prompt.
#[derive(Clone, Copy, PartialEq)]
enum Reply {
    Kept,
    ReadAgain,
}

fn check_growing_conversation(bundle: &Arc<ModelBundle>, vocab: u32, reply: Reply) {
    let warm = engine(bundle, None);
    let mut prompt = message(0, 70, vocab);
    let mut snapshots: Vec<usize> = vec![40];
    let mut resumes_at = None;
    for turn in 0..TURNS {
        let (output, cached) = run(&warm, &prompt, &snapshots, greedy(), 4096);
        if let Some(expected) = resumes_at {
            assert_eq!(cached, expected, "turn {turn} resumes where the previous call ended");
        }
        let cold = engine(bundle, None);
        let (expected, cold_cached) = run(&cold, &prompt, &snapshots, greedy(), 4096);
        assert_eq!(cold_cached, 0);
        assert_eq!(output, expected, "turn {turn} gives the cold output");

        // The next call: this prompt, the reply (ended by a message end), a tool result.
        // The last reply token was sampled, never run.
        let reply_run = output.tokens.len() - 1;
        resumes_at = Some(prompt.len() + if reply == Reply::Kept { reply_run } else { 0 });
        snapshots.push(prompt.len());
        prompt.extend(output.tokens.iter().map(|t| t.id));
        prompt.push(2);
        snapshots.push(prompt.len());
        prompt.extend(message(turn + 1, 23 + 7 * turn, vocab));
    }
}

#[test]
fn each_turn_resumes_after_the_previous_reply_on_the_dense_model() {
    let bundle = tiny_dense();
    check_growing_conversation(&bundle, vocab(&bundle), Reply::Kept);
}

#[test]
fn each_turn_resumes_at_the_previous_prompt_on_the_hybrid_model() {
    check_growing_conversation(&hybrid(), 512, Reply::ReadAgain);
}
