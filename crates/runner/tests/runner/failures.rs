//! A request that could never run fails at once with a typed error naming why, instead of
//! waiting in the queue or failing half-way.

use crate::common;

use common::{request, smollm2, BLOCK_SIZE, PREFILL_CHUNK};
use spindle_runner::{
    sequence_channel, CacheConfig, Engine, EngineConfig, RunnerError, SequenceEvent,
    SequenceSummary,
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
        fault_injection: None,
        speculation: Default::default(),
    };
    Engine::start(bundle, config)
}

/// How `engine` ends a request for `prompt_len` tokens in `context` with `max_tokens`.
fn end(
    engine: &Engine,
    prompt_len: usize,
    max_tokens: usize,
    context: usize,
) -> Result<SequenceSummary, RunnerError> {
    let (caller, mut inbox) = sequence_channel();
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| 100 + i).collect();
    engine.submit(request(&prompt, max_tokens, context), caller).unwrap();
    loop {
        match inbox.blocking_recv().expect("every sequence ends with an event") {
            SequenceEvent::Failed(error) => return Err(error),
            SequenceEvent::Finished(summary) => return Ok(summary),
            SequenceEvent::Token { .. } | SequenceEvent::Prefilled { .. } => {}
        }
    }
}

#[test]
fn a_prompt_that_can_never_fit_fails_typed_and_the_engine_serves_on() {
    let engine = small_pool_engine();
    // The prompt fills the pool, leaving no position for a generated token.
    match end(&engine, POOL_TOKENS, 4, 1024) {
        Err(RunnerError::PromptExceedsKvPool { prompt, kv_tokens }) => {
            assert_eq!((prompt, kv_tokens), (POOL_TOKENS, POOL_TOKENS));
        }
        other => panic!("{other:?}"),
    }
    match end(&engine, 20, 4, 20) {
        Err(RunnerError::PromptExceedsContext { prompt: 20, context: 20 }) => {}
        other => panic!("{other:?}"),
    }
    // A prompt that fits still runs.
    assert_eq!(end(&engine, 3, 2, 1024).unwrap().completion_tokens, 2);
}
