//! Reasoning: with thinking on, the reasoning arrives in `reasoning_content` and the answer's
//! `content` holds no think tags, streamed or not; `thinking_budget` caps the reasoning tokens.
//!
//! A model that shows no reasoning at all (none in `reasoning_content`, no think tag in the
//! content) has nothing to split: the checks are skipped.

use serde_json::{json, Value};

use super::wire::{self, clip, content, user_request};
use super::{Check, CheckResult, EvalContext, Tier};
use crate::client::Client;

const SECTION: &str = "reasoning";
const PROMPT: &str = "What is 17 + 25? Think it through, then answer with the number.";
/// The budget the budget check asks for.
const BUDGET: u64 = 16;
const TAGS: [&str; 2] = ["<think>", "</think>"];

fn thinking_request(max_tokens: u32) -> Value {
    let mut body = user_request(PROMPT, max_tokens);
    body["chat_template_kwargs"] = json!({"enable_thinking": true});
    body
}

pub(super) async fn run(context: &EvalContext) -> Vec<CheckResult> {
    if !context.runs(Tier::Standard) {
        return Vec::new();
    }
    let client = &context.client;
    let [split, streamed, budget] = checks();
    let answer = match client.chat_completion(thinking_request(256)).await {
        Ok(answer) => answer,
        Err(e) => return vec![split.error(e)],
    };
    let message = &answer["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap_or_default();
    let text = content(&answer);
    if reasoning.is_empty() && !has_tag(&text) {
        let why = "the model showed no reasoning (none in reasoning_content, no think tag)";
        return vec![split.skip(why), streamed.skip(why), budget.skip(why)];
    }
    vec![
        split.judge(split_ok(reasoning, &text), describe(reasoning, &text)),
        split_streamed(client, streamed).await,
        spent_within_budget(client, budget).await,
    ]
}

/// The split, streamed split and budget checks.
fn checks() -> [Check; 3] {
    [
        Check::server(
            SECTION,
            "reasoning-split",
            "thinking on: reasoning in reasoning_content, no think tag in content",
        ),
        Check::server(
            SECTION,
            "reasoning-split-streamed",
            "streamed with thinking on: reasoning deltas in reasoning_content, no think tag in \
             content",
        ),
        Check::server(
            SECTION,
            "reasoning-budget",
            &format!("thinking_budget {BUDGET}: at most {BUDGET} reasoning tokens"),
        ),
    ]
}

fn has_tag(text: &str) -> bool {
    TAGS.iter().any(|t| text.contains(t))
}

fn split_ok(reasoning: &str, content: &str) -> bool {
    !reasoning.is_empty() && !has_tag(content) && !has_tag(reasoning)
}

fn describe(reasoning: &str, content: &str) -> String {
    format!("reasoning_content {:?}, content {:?}", clip(reasoning), clip(content))
}

async fn split_streamed(client: &Client, check: Check) -> CheckResult {
    check.judge_result(
        wire::stream(client, thinking_request(256))
            .await
            .map(|s| (split_ok(&s.reasoning, &s.content), describe(&s.reasoning, &s.content))),
    )
}

async fn spent_within_budget(client: &Client, check: Check) -> CheckResult {
    let mut body = thinking_request(256);
    body["thinking_budget"] = json!(BUDGET);
    check.judge_result(wire::stream(client, body).await.map(|s| {
        // The server's own count when it gives one; else the chunks that carried reasoning.
        let reported = s.usage.as_ref().and_then(|u| {
            u["completion_tokens_details"]["reasoning_tokens"].as_u64().filter(|&n| n > 0)
        });
        let spent = reported.unwrap_or(s.reasoning_chunks as u64);
        let source = if reported.is_some() { "usage reasoning_tokens" } else { "reasoning chunks" };
        (spent <= BUDGET, format!("{spent} ({source}); reasoning {:?}", clip(&s.reasoning)))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_needs_reasoning_and_no_tags() {
        assert!(split_ok("17 plus 25", "42"));
        assert!(!split_ok("", "<think>17 plus 25</think>42"));
        assert!(!split_ok("17 plus 25</think>", "42"));
        assert!(!split_ok("", "42"));
    }
}
