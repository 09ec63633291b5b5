//! A client that gives up while its prompt is read (a time-out, a cancel) leaves the chunks
//! read so far in the prefix cache: the same request sent again resumes there, with the output
//! a cold engine gives.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{engine, greedy, hybrid, run, smollm2, PREFILL_CHUNK};
use spindle_runner::{Engine, ModelBundle, ReasoningMode, SequenceEvent, SequenceRequest};

const PROMPT: usize = 640;
const CONTEXT: usize = 4096;

fn prompt(vocab: u32) -> Vec<u32> {
    (0..PROMPT as u32).map(|i| (i * 37 + 5) % (vocab - 2) + 1).collect()
}

/// How the client gives up.
#[derive(Clone, Copy)]
enum GiveUp {
    /// Raises the cancel flag (`/cancel`): the engine reports the end.
    Cancel,
    /// Drops the receiver (the connection closed).
    Disconnect,
}

/// Submits `prompt` and gives up once at least `chunks` prefill chunks are in; returns the
/// positions read by then.
fn read_partly(engine: &Engine, prompt: &[u32], chunks: usize, give_up: GiveUp) -> usize {
    let (events, mut inbox) = tokio::sync::mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    engine
        .submit(SequenceRequest {
            prompt_ids: prompt.to_vec(),
            snapshot_positions: Vec::new(),
            max_tokens: 12,
            sampling: greedy(),
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            reasoning: ReasoningMode::Off,
            reasoning_budget: None,
            context: CONTEXT,
            cancel: cancel.clone(),
            events,
            constraint: None,
        })
        .unwrap();
    loop {
        match inbox.blocking_recv().expect("events until the end") {
            SequenceEvent::Prefilled { read, total } if read >= chunks * PREFILL_CHUNK => {
                assert!(read < total, "the prompt must be longer than what is read before giving up");
                match give_up {
                    GiveUp::Cancel => {
                        cancel.store(true, Ordering::Relaxed);
                        while !matches!(inbox.blocking_recv(), Some(SequenceEvent::Finished(_)) | None) {}
                    }
                    GiveUp::Disconnect => {
                        drop(inbox);
                        // The engine notices at its next step; a retry sent before that would
                        // run beside the dropped request instead of after it.
                        let deadline = Instant::now() + Duration::from_secs(60);
                        while engine.load().active.load(Ordering::Relaxed) > 0 {
                            assert!(Instant::now() < deadline, "the dropped request never ended");
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
                return read;
            }
            SequenceEvent::Prefilled { .. } => {}
            other => panic!("unexpected before the prompt is read: {other:?}"),
        }
    }
}

fn check_retry_resumes(bundle: &Arc<ModelBundle>, vocab: u32, give_up: GiveUp) {
    let prompt = prompt(vocab);
    let warm = engine(bundle, None);
    let read = read_partly(&warm, &prompt, 3, give_up);
    let (retried, cached) = run(&warm, &prompt, &[], greedy(), CONTEXT);
    assert!(cached >= read, "the retry resumes where the dropped request was ({cached} < {read})");
    assert!(cached < prompt.len(), "the dropped request did not read the whole prompt");
    assert_eq!(cached % PREFILL_CHUNK, 0, "it resumes at a chunk cut");

    let (cold, cold_cached) = run(&engine(bundle, None), &prompt, &[], greedy(), CONTEXT);
    assert_eq!(cold_cached, 0);
    assert_eq!(retried, cold, "the resumed retry gives the cold output");
}

#[test]
fn a_cancelled_prefill_is_resumed_by_its_retry_on_the_dense_model() {
    check_retry_resumes(&smollm2(), 49152, GiveUp::Cancel);
}

#[test]
fn a_disconnected_prefill_is_resumed_by_its_retry_on_the_hybrid_model() {
    check_retry_resumes(&hybrid(), 512, GiveUp::Disconnect);
}
