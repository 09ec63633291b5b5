//! The reasoning budget never leaves the answer empty: once the engine has closed the reasoning
//! block itself, the next token may not end the sequence.

use crate::common;

use common::{engine, request, smollm2};
use spindle_runner::{
    sequence_channel, Engine, FinishReason, ModelBundle, ReasoningBudget, ReasoningMode,
    SequenceEvent, SequenceRequest,
};

const BUDGET: usize = 3;
const MAX_TOKENS: usize = 40;

/// A ChatML prompt whose assistant turn opens the reasoning block, as Qwen3's template does.
fn thinking_prompt(bundle: &ModelBundle) -> Vec<u32> {
    let text = "<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n\
                <|im_start|>assistant\n<think>\n";
    bundle.tokenizer.encode(text, false).unwrap()
}

/// The bare tag, without the newlines the server puts around it, so that the model's first
/// answer token (a newline) is none of the tag's: the test makes that token a stop id.
fn close_ids(bundle: &ModelBundle) -> Vec<u32> {
    bundle.tokenizer.encode("</think>", false).unwrap()
}

/// Runs the prompt greedily with a reasoning budget of [`BUDGET`], ending at `stop_ids`: the
/// tokens generated and how the sequence ended.
fn run(engine: &Engine, bundle: &ModelBundle, stop_ids: Vec<u32>) -> (Vec<u32>, FinishReason) {
    let (caller, mut inbox) = sequence_channel();
    engine
        .submit(
            SequenceRequest {
                stop_ids,
                reasoning: ReasoningMode::Tagged {
                    open: "<think>".into(),
                    close: "</think>".into(),
                    starts_inside: true,
                },
                reasoning_budget: Some(ReasoningBudget {
                    max_tokens: Some(BUDGET),
                    close_ids: close_ids(bundle),
                }),
                ..request(&thinking_prompt(bundle), MAX_TOKENS, 256)
            },
            caller,
        )
        .unwrap();
    let mut tokens = Vec::new();
    loop {
        match inbox.blocking_recv().expect("every sequence ends with an event") {
            SequenceEvent::Token { token, .. } => tokens.push(token.id),
            SequenceEvent::Finished(summary) => return (tokens, summary.finish_reason),
            SequenceEvent::Failed(message) => panic!("the sequence failed: {message}"),
            SequenceEvent::Prefilled { .. } => {}
        }
    }
}

/// Where the forced close tag ends in `tokens`.
fn close_end(tokens: &[u32], close: &[u32]) -> usize {
    let start = tokens.windows(close.len()).position(|w| w == close).expect("the tag was forced");
    start + close.len()
}

#[test]
fn after_the_engine_closes_the_block_the_answer_gets_a_token_before_any_stop() {
    let bundle = smollm2();
    let engine = engine(&bundle, None);
    let close = close_ids(&bundle);
    let im_end = bundle.tokenizer.token_to_id("<|im_end|>").unwrap();
    let (free, _) = run(&engine, &bundle, vec![im_end]);
    let answer_start = close_end(&free, &close);
    assert_eq!(answer_start, BUDGET + close.len(), "the budget closed the block: {free:?}");
    // Make the token the model answers with a stop id: sampled right after the forced tag, it
    // would end the sequence with nothing answered.
    let first_answer = free[answer_start];
    assert!(!close.contains(&first_answer) && first_answer != im_end, "{free:?}");
    let (tokens, finish) = run(&engine, &bundle, vec![im_end, first_answer]);
    assert_eq!(tokens[..answer_start], free[..answer_start]);
    assert!(tokens.len() > answer_start, "the answer is empty ({finish:?}): {tokens:?}");
    assert_ne!(tokens[answer_start], first_answer);
}
