//! A request that could never run fails at once with a typed error naming why, instead of
//! waiting in the queue or failing half-way.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use common::{greedy, smollm2, BLOCK_SIZE, PREFILL_CHUNK};
use spindle_runner::{
    CacheConfig, Engine, EngineConfig, ReasoningMode, RunnerError, SequenceEvent, SequenceRequest,
};

/// KV positions in the pool of [`small_pool_engine`].
const POOL_TOKENS: usize = 4 * BLOCK_SIZE;

/// An engine whose KV pool holds exactly [`POOL_TOKENS`] positions.
fn small_pool_engine() -> Engine {
    let bundle = smollm2();
    let cache = CacheConfig { block_size: BLOCK_SIZE, ..CacheConfig::default() }
        .holding(&bundle, POOL_TOKENS);
    assert_eq!(cache.kv_tokens(&bundle), POOL_TOKENS);
    let config = EngineConfig {
        max_active: 2,
        prefill_chunk: PREFILL_CHUNK,
        step_tokens: 2 * PREFILL_CHUNK,
        cache,
        orphan_prefill_tokens: usize::MAX,
    };
    Engine::start(bundle, config)
}

/// The error `engine` ends a request for `prompt_len` tokens in `context` with.
fn failure(engine: &Engine, prompt_len: usize, context: usize) -> RunnerError {
    let (events, mut inbox) = tokio::sync::mpsc::unbounded_channel();
    engine
        .submit(SequenceRequest {
            prompt_ids: (0..prompt_len as u32).map(|i| 100 + i).collect(),
            snapshot_positions: Vec::new(),
            max_tokens: 4,
            sampling: greedy(),
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            reasoning: ReasoningMode::Off,
            reasoning_budget: None,
            context,
            cancel: Arc::new(AtomicBool::new(false)),
            events,
            constraint: None,
        })
        .unwrap();
    loop {
        match inbox.blocking_recv().expect("every sequence ends with an event") {
            SequenceEvent::Failed(error) => return error,
            SequenceEvent::Finished(summary) => panic!("the request ran: {summary:?}"),
            SequenceEvent::Token { .. } | SequenceEvent::Prefilled { .. } => {}
        }
    }
}

#[test]
fn a_prompt_that_can_never_fit_fails_typed_and_the_engine_serves_on() {
    let engine = small_pool_engine();
    // The prompt fills the pool, leaving no position for a generated token.
    match failure(&engine, POOL_TOKENS, 1024) {
        RunnerError::PromptExceedsKvPool { prompt, kv_tokens } => {
            assert_eq!((prompt, kv_tokens), (POOL_TOKENS, POOL_TOKENS));
        }
        other => panic!("{other:?}"),
    }
    match failure(&engine, 20, 20) {
        RunnerError::PromptExceedsContext { prompt: 20, context: 20 } => {}
        other => panic!("{other:?}"),
    }
    // A prompt that fits still runs.
    let (events, mut inbox) = tokio::sync::mpsc::unbounded_channel();
    engine
        .submit(SequenceRequest {
            prompt_ids: vec![100, 101, 102],
            snapshot_positions: Vec::new(),
            max_tokens: 2,
            sampling: greedy(),
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            reasoning: ReasoningMode::Off,
            reasoning_budget: None,
            context: 1024,
            cancel: Arc::new(AtomicBool::new(false)),
            events,
            constraint: None,
        })
        .unwrap();
    loop {
        match inbox.blocking_recv().expect("every sequence ends with an event") {
            SequenceEvent::Finished(summary) => break assert_eq!(summary.completion_tokens, 2),
            SequenceEvent::Failed(error) => panic!("{error}"),
            SequenceEvent::Token { .. } | SequenceEvent::Prefilled { .. } => {}
        }
    }
}
