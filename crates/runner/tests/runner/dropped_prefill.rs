//! A client that gives up while its prompt is read (a time-out, a cancel) costs no work: the
//! chunks read so far stay in the prefix cache, the engine goes on reading the prompt while it
//! has nothing else to do, and yields to live requests at once. A retry resumes, a twin sent
//! beside it waits and reads nothing twice, and every output is the cold one.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    engine, engine_with_orphans, greedy, hybrid, request, run, tiny_dense, vocab, PREFILL_CHUNK,
};
use spindle_runner::{sequence_channel, Engine, ModelBundle, SequenceEvent, SequenceEvents};

const PROMPT: usize = 640;
const CONTEXT: usize = 4096;

fn prompt(vocab: u32, seed: u32) -> Vec<u32> {
    (0..PROMPT as u32).map(|i| (i * 37 + 5 + seed * 101) % (vocab - 2) + 1).collect()
}

/// How the client gives up.
#[derive(Clone, Copy)]
enum GiveUp {
    /// Raises the cancel flag (`/cancel`): the engine reports the end.
    Cancel,
    /// Drops the receiver (the connection closed).
    Disconnect,
}

fn submit(engine: &Engine, prompt: &[u32]) -> SequenceEvents {
    let (caller, inbox) = sequence_channel();
    engine.submit(request(prompt, 12, CONTEXT), caller).unwrap();
    inbox
}

/// Submits `prompt` and gives up once at least `chunks` prefill chunks are in; returns the
/// positions read by then.
fn read_partly(engine: &Engine, prompt: &[u32], chunks: usize, give_up: GiveUp) -> usize {
    let mut inbox = submit(engine, prompt);
    loop {
        match inbox.blocking_recv().expect("events until the end") {
            SequenceEvent::Prefilled { read, total, .. } if read >= chunks * PREFILL_CHUNK => {
                assert!(
                    read < total,
                    "the prompt must be longer than what is read before giving up"
                );
                match give_up {
                    GiveUp::Cancel => {
                        inbox.canceller().cancel();
                        while !matches!(
                            inbox.blocking_recv(),
                            Some(SequenceEvent::Finished(_)) | None
                        ) {}
                    }
                    GiveUp::Disconnect => drop(inbox),
                }
                return read;
            }
            SequenceEvent::Prefilled { .. } => {}
            other => panic!("unexpected before the prompt is read: {other:?}"),
        }
    }
}

/// Waits until the engine runs nothing (a dropped prompt read to its end, or given up).
fn wait_idle(engine: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while engine.load().active.load(Ordering::Relaxed) > 0 {
        assert!(Instant::now() < deadline, "the engine never went idle");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn cold(bundle: &Arc<ModelBundle>, prompt: &[u32]) -> common::Output {
    let (output, cached) = run(&engine(bundle, None), prompt, &[], greedy(), CONTEXT);
    assert_eq!(cached, 0);
    output
}

/// With reading after a drop turned off, the retry resumes at the last chunk read.
fn check_retry_resumes(bundle: &Arc<ModelBundle>, vocab: u32, give_up: GiveUp) {
    let prompt = prompt(vocab, 0);
    let warm = engine_with_orphans(bundle, None, 0);
    let read = read_partly(&warm, &prompt, 3, give_up);
    wait_idle(&warm);
    let (retried, cached) = run(&warm, &prompt, &[], greedy(), CONTEXT);
    assert!(cached >= read, "the retry resumes where the dropped request was ({cached} < {read})");
    assert!(cached < prompt.len(), "nothing read the rest of the dropped prompt");
    assert_eq!(cached % PREFILL_CHUNK, 0, "it resumes at a chunk cut");
    assert_eq!(retried, cold(bundle, &prompt), "the resumed retry gives the cold output");
}

#[test]
fn a_cancelled_prefill_is_resumed_by_its_retry_on_the_dense_model() {
    let bundle = tiny_dense();
    check_retry_resumes(&bundle, vocab(&bundle), GiveUp::Cancel);
}

#[test]
fn a_disconnected_prefill_is_resumed_by_its_retry_on_the_hybrid_model() {
    check_retry_resumes(&hybrid(), 512, GiveUp::Disconnect);
}

/// An idle engine reads a dropped prompt to its end: the retry reads nothing.
fn check_idle_engine_finishes_the_prompt(bundle: &Arc<ModelBundle>, vocab: u32) {
    // The engine may read the whole prompt before it sees the client go (the test thread is
    // descheduled after the event that says two chunks are in): then nothing was dropped to
    // check, and the case is tried again with another prompt.
    for seed in 1..=5 {
        let prompt = prompt(vocab, seed);
        let warm = engine(bundle, None);
        read_partly(&warm, &prompt, 2, GiveUp::Disconnect);
        wait_idle(&warm);
        let orphan_tokens = warm.load().orphan_prefill_tokens.load(Ordering::Relaxed);
        if orphan_tokens > 0 {
            return check_dropped_prompt_reused(bundle, &warm, &prompt, orphan_tokens);
        }
    }
    panic!("in five tries the engine read every prompt before it saw the client go");
}

/// The retry of a prompt `orphan_tokens` of which were read after its client went: the whole
/// prompt comes from the cache, with the cold output.
fn check_dropped_prompt_reused(
    bundle: &Arc<ModelBundle>,
    warm: &Engine,
    prompt: &[u32],
    orphan_tokens: usize,
) {
    let (retried, cached) = run(warm, prompt, &[], greedy(), CONTEXT);
    assert_eq!(cached, prompt.len(), "the whole prompt was read while idle");
    assert_eq!(retried, cold(bundle, prompt));
    // Every position read after the drop was reused by the retry (published after its first
    // step, long before its last).
    let reused = warm.load().orphan_tokens_reused.load(Ordering::Relaxed);
    assert_eq!(reused, orphan_tokens, "positions of the dropped prompt the retry reused");
}

#[test]
fn an_idle_engine_reads_a_dropped_prompt_to_its_end_on_the_dense_model() {
    let bundle = tiny_dense();
    check_idle_engine_finishes_the_prompt(&bundle, vocab(&bundle));
}

#[test]
fn an_idle_engine_reads_a_dropped_prompt_to_its_end_on_the_hybrid_model() {
    check_idle_engine_finishes_the_prompt(&hybrid(), 512);
}

#[test]
fn a_dropped_prefill_yields_to_a_live_request() {
    let bundle = tiny_dense();
    let dropped = prompt(vocab(&bundle), 2);
    let warm = engine(&bundle, None);
    let read = read_partly(&warm, &dropped, 2, GiveUp::Disconnect);
    let live = prompt(vocab(&bundle), 3);
    let (output, _) = run(&warm, &live, &[], greedy(), CONTEXT);
    assert_eq!(output, cold(&bundle, &live));
    wait_idle(&warm);
    // Read while the live request waited: at most the steps until it was admitted.
    let orphan_tokens = warm.load().orphan_prefill_tokens.load(Ordering::Relaxed);
    assert!(
        orphan_tokens < dropped.len() - read,
        "the dropped prompt was read to its end ({orphan_tokens})"
    );
}

/// Two identical prompts sent together: the second waits for the first and reads nothing.
fn check_twins_read_once(bundle: &Arc<ModelBundle>, vocab: u32) {
    let prompt = prompt(vocab, 4);
    let warm = engine(bundle, None);
    // Both queued before the engine looks: the second is behind the first whatever the timing.
    let first_events = common::submit(&warm, &prompt, &[], greedy(), CONTEXT);
    let second_events = common::submit(&warm, &prompt, &[], greedy(), CONTEXT);
    let (first, first_cached) = common::collect(first_events);
    let (second, cached) = common::collect(second_events);
    assert_eq!(first_cached, 0);
    assert_eq!(cached, prompt.len(), "the twin resumed from the first one's cache");
    assert_eq!(second, first);
    assert_eq!(first, cold(bundle, &prompt));
}

#[test]
fn a_twin_request_waits_and_reads_nothing_twice_on_the_dense_model() {
    let bundle = tiny_dense();
    check_twins_read_once(&bundle, vocab(&bundle));
}

#[test]
fn a_twin_request_waits_and_reads_nothing_twice_on_the_hybrid_model() {
    check_twins_read_once(&hybrid(), 512);
}
