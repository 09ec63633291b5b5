//! Admission takes no blocks for tokens not yet generated: requests that together outgrow the
//! KV pool all start, and when the pool runs out the most recently admitted is preempted (its
//! blocks freed, sent back to the front of the queue, run again from its prompt without
//! resending a token). Every request completes, with the output it gets alone (on a pool
//! that holds the whole burst).

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{greedy, hybrid, request, seeded, tiny_dense, vocab, BLOCK_SIZE, PREFILL_CHUNK};
use spindle_runner::sampler::SamplingParams;
use spindle_runner::{
    sequence_channel, CacheConfig, Engine, EngineConfig, ModelBundle, SequenceEvent,
    SequenceEvents, SequenceRequest,
};

const CONTEXT: usize = 160;
const REQUESTS: usize = 8;

fn engine(bundle: &Arc<ModelBundle>, blocks: usize) -> Engine {
    let probe = CacheConfig { kv_bytes: 1 << 20, block_size: BLOCK_SIZE, ..CacheConfig::default() };
    let block_bytes = probe.kv_bytes / probe.kv_blocks(bundle);
    let cache = CacheConfig {
        kv_bytes: blocks * block_bytes,
        snapshot_bytes: 64 << 20,
        block_size: BLOCK_SIZE,
        disk: None,
        ..CacheConfig::default()
    };
    let config = EngineConfig {
        max_active: REQUESTS,
        prefill_chunk: PREFILL_CHUNK,
        step_tokens: 2 * PREFILL_CHUNK,
        cache,
        orphan_prefill_tokens: usize::MAX,
        fault_injection: None,
        speculation: Default::default(),
    };
    Engine::start(bundle.clone(), config)
}

fn prompt(vocab: u32, i: usize) -> Vec<u32> {
    let len = 72 + 6 * i;
    (0..len as u32).map(|p| (p * 13 + i as u32 * 71 + 3) % (vocab - 2) + 1).collect()
}

fn submit(engine: &Engine, prompt: &[u32], sampling: SamplingParams) -> SequenceEvents {
    let (caller, inbox) = sequence_channel();
    engine
        .submit(
            SequenceRequest {
                sampling,
                // What the server asks for when max_tokens is omitted: the rest of the context.
                ..request(prompt, CONTEXT - prompt.len(), CONTEXT)
            },
            caller,
        )
        .unwrap();
    inbox
}

/// The token ids and logprob bits a client receives, each once.
fn collect(mut inbox: SequenceEvents) -> Vec<(u32, u32)> {
    let mut tokens = Vec::new();
    loop {
        match inbox.blocking_recv().expect("every sequence ends with an event") {
            SequenceEvent::Token { token, .. } => tokens.push((token.id, token.logprob.to_bits())),
            SequenceEvent::Finished(summary) => {
                assert_eq!(summary.completion_tokens, tokens.len());
                return tokens;
            }
            SequenceEvent::Failed(message) => panic!("a request failed: {message}"),
            SequenceEvent::Prefilled { .. } => {}
        }
    }
}

/// Each request read by a client of its own, as a server's are: one read after another, the
/// later ones would wait for room and never outgrow the pool together.
fn collect_each(inboxes: Vec<SequenceEvents>) -> Vec<Vec<(u32, u32)>> {
    std::thread::scope(|scope| {
        let readers: Vec<_> =
            inboxes.into_iter().map(|inbox| scope.spawn(move || collect(inbox))).collect();
        readers.into_iter().map(|reader| reader.join().unwrap()).collect()
    })
}

fn check_burst_outgrowing_the_pool(bundle: &Arc<ModelBundle>, vocab: u32) {
    let sampling = |i: usize| if i.is_multiple_of(2) { greedy() } else { seeded() };
    // Room for the longest request alone, and about two and a half in all.
    let blocks = 2 * CONTEXT / BLOCK_SIZE + CONTEXT / (2 * BLOCK_SIZE);
    let shared = engine(bundle, blocks);
    let inboxes: Vec<_> =
        (0..REQUESTS).map(|i| submit(&shared, &prompt(vocab, i), sampling(i))).collect();
    let outputs = collect_each(inboxes);
    let preemptions = shared.load().preemptions.load(Ordering::Relaxed);
    assert!(preemptions > 0, "the burst outgrew the pool, so some sequence was preempted");
    // The outputs without preemption: the burst again on a pool that holds it all. Batched,
    // as a sequence's bits do not depend on the rows beside it (prefix_cache's concurrency
    // test checks that against runs alone), so these are the outputs alone.
    let roomy = engine(bundle, REQUESTS * CONTEXT / BLOCK_SIZE);
    let inboxes: Vec<_> =
        (0..REQUESTS).map(|i| submit(&roomy, &prompt(vocab, i), sampling(i))).collect();
    let unpreempted = collect_each(inboxes);
    assert_eq!(roomy.load().preemptions.load(Ordering::Relaxed), 0);
    for (i, (output, alone)) in outputs.iter().zip(&unpreempted).enumerate() {
        assert_eq!(
            output.len(),
            CONTEXT - prompt(vocab, i).len(),
            "request {i} ran to the end of its context"
        );
        assert_eq!(
            output, alone,
            "request {i} gives what it gives without preemption ({preemptions} preemptions)"
        );
    }
}

#[test]
fn a_burst_outgrowing_the_pool_completes_with_solo_outputs_on_the_hybrid_model() {
    check_burst_outgrowing_the_pool(&hybrid(), 512);
}

#[test]
fn a_burst_outgrowing_the_pool_completes_with_solo_outputs_on_the_dense_model() {
    let bundle = tiny_dense();
    check_burst_outgrowing_the_pool(&bundle, vocab(&bundle));
}
