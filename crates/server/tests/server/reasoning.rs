//! Reasoning on a real model: SmolLM2 behind a template that opens `<think>` in the prompt (as
//! Qwen3's does), so the opening tag is never generated and the block must be closed by the
//! model or by the engine's budget.

use crate::common;

use common::{chat_body, parse_chat_stream, post, post_stream, server, Setup};
use serde_json::{json, Value};

const QUESTION: &str = "What is the capital of Japan?";

fn message(response: &Value) -> (String, String) {
    let m = &response["choices"][0]["message"];
    (
        m["content"].as_str().unwrap_or("").to_string(),
        m["reasoning_content"].as_str().unwrap_or("").to_string(),
    )
}

fn assert_no_tags(text: &str) {
    assert!(!text.contains("<think>") && !text.contains("</think>"), "tag leaked: {text:?}");
}

/// Tokens of the close tag the engine forces.
async fn close_tag_tokens(base: &str) -> u64 {
    let (_, tokens) = post(
        base,
        "/v1/tokenize",
        &json!({"prompt": "\n</think>\n\n", "add_special_tokens": false}),
    )
    .await;
    tokens["count"].as_u64().unwrap()
}

#[tokio::test]
async fn a_small_max_tokens_still_leaves_an_answer() {
    let base = server(Setup::Thinking);
    let close = close_tag_tokens(&base).await;
    // SmolLM2 answers the question inside the block and ends there: the engine closes the block
    // instead. The essay rambles on in the block until a quarter of max_tokens is left.
    for question in [QUESTION, "Write a long essay about the history of Rome."] {
        let (status, response) =
            post(&base, "/v1/chat/completions", &chat_body(question, 50)).await;
        assert_eq!(status, 200, "{response}");
        let (content, reasoning) = message(&response);
        assert!(!reasoning.is_empty(), "{response}");
        assert!(!content.trim().is_empty(), "thinking ate the whole budget: {response}");
        assert_no_tags(&content);
        assert_no_tags(&reasoning);
        let usage = &response["usage"];
        let reasoning_tokens =
            usage["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
        assert!(
            reasoning_tokens > close
                && reasoning_tokens < usage["completion_tokens"].as_u64().unwrap()
        );
        // Content got at least a quarter of max_tokens to work with.
        assert!(reasoning_tokens <= 50 - 50 / 4, "{usage}");
    }
}

/// With thinking on, the output must have room for the close tag the engine may force plus one
/// answer token; less is refused naming `max_tokens`, since it could only end in an empty answer.
#[tokio::test]
async fn max_tokens_without_room_to_close_the_block_and_answer_is_a_400() {
    let base = server(Setup::Thinking);
    let close = close_tag_tokens(&base).await;
    let (status, response) =
        post(&base, "/v1/chat/completions", &chat_body(QUESTION, close as u32)).await;
    assert_eq!(status, 400, "{response}");
    assert_eq!(response["error"]["param"], "max_tokens", "{response}");
    // Room for the tag and one token: the engine closes the block at once, and the answer gets
    // its token (the runner's tests check that it cannot be an end-of-sequence).
    let (status, response) =
        post(&base, "/v1/chat/completions", &chat_body(QUESTION, close as u32 + 1)).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["usage"]["completion_tokens"], close + 1, "{response}");
    assert_eq!(response["choices"][0]["finish_reason"], "length", "{response}");
    // Without thinking no tag is owed.
    let mut body = chat_body(QUESTION, 1);
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (status, response) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
}

#[tokio::test]
async fn the_thinking_budget_closes_the_block() {
    let base = server(Setup::Thinking);
    let (_, free) = post(&base, "/v1/chat/completions", &chat_body(QUESTION, 200)).await;
    let unlimited =
        free["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
    for field in ["thinking_budget", "max_reasoning_tokens"] {
        let mut body = chat_body(QUESTION, 200);
        body[field] = json!(3);
        let (_, response) = post(&base, "/v1/chat/completions", &body).await;
        let (content, reasoning) = message(&response);
        let reasoning_tokens =
            response["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
        // The 3 budget tokens; the close tag the server forced after them is not thinking.
        assert_eq!(reasoning_tokens, 3, "{field}: {response}");
        assert!(reasoning_tokens < unlimited, "{field}: the budget did not bind");
        assert!(!reasoning.is_empty() && !content.trim().is_empty(), "{field}: {response}");
        assert_no_tags(&content);
    }
}

#[tokio::test]
async fn streaming_splits_reasoning_the_same_way() {
    let base = server(Setup::Thinking);
    let mut body = chat_body(QUESTION, 60);
    body["thinking_budget"] = json!(12);
    let (_, whole) = post(&base, "/v1/chat/completions", &body).await;
    body["stream"] = json!(true);
    let streamed = parse_chat_stream(&post_stream(&base, "/v1/chat/completions", &body).await);
    let (content, reasoning) = message(&whole);
    assert_eq!(streamed.content, content);
    assert_eq!(streamed.reasoning, reasoning);
    // No chunk carries a tag, and none mixes the two kinds inside a tag.
    for chunk in &streamed.chunks {
        for field in ["content", "reasoning_content"] {
            assert_no_tags(
                chunk["choices"].get(0).and_then(|c| c["delta"][field].as_str()).unwrap_or(""),
            );
        }
    }
}

#[tokio::test]
async fn no_thinking_turns_it_off_unless_a_request_turns_it_on() {
    let base = server(Setup::NoThinking);
    let (_, off) = post(&base, "/v1/chat/completions", &chat_body(QUESTION, 30)).await;
    assert!(message(&off).1.is_empty(), "{off}");
    assert!(!message(&off).0.is_empty(), "{off}");
    let mut body = chat_body(QUESTION, 30);
    body["chat_template_kwargs"] = json!({"enable_thinking": true});
    let (_, on) = post(&base, "/v1/chat/completions", &body).await;
    assert!(!message(&on).1.is_empty(), "{on}");
}

#[tokio::test]
async fn a_stop_string_inside_reasoning_keeps_both_fields_clean() {
    let base = server(Setup::Thinking);
    let (_, free) = post(&base, "/v1/chat/completions", &chat_body(QUESTION, 50)).await;
    let (_, reasoning) = message(&free);
    let words: Vec<&str> = reasoning.split_whitespace().collect();
    assert!(words.len() >= 3, "{free}");
    let stop = words[2];
    let mut body = chat_body(QUESTION, 50);
    body["stop"] = json!([stop]);
    for stream in [false, true] {
        body["stream"] = json!(stream);
        let (content, cut) = if stream {
            let s = parse_chat_stream(&post_stream(&base, "/v1/chat/completions", &body).await);
            assert_eq!(s.finish_reason, "stop");
            (s.content, s.reasoning)
        } else {
            let (_, response) = post(&base, "/v1/chat/completions", &body).await;
            assert_eq!(response["choices"][0]["finish_reason"], "stop");
            message(&response)
        };
        assert_eq!(cut, reasoning[..reasoning.find(stop).unwrap()], "stream={stream}");
        assert!(content.is_empty());
        assert_no_tags(&cut);
    }
}

#[tokio::test]
async fn response_format_binds_the_answer_and_leaves_reasoning_free() {
    let base = server(Setup::Thinking);
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    let mut body = chat_body("Tell me about a cat named Tom.", 120);
    body["thinking_budget"] = json!(12);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "cat", "strict": true, "schema": schema}});
    let (status, response) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    let (content, reasoning) = message(&response);
    // Held to the schema from its first token, reasoning could only be JSON and could never
    // close its block; free, it is the model's prose.
    assert!(!reasoning.trim().is_empty() && !reasoning.trim_start().starts_with('{'), "{response}");
    assert_no_tags(&reasoning);
    let answer: Value =
        serde_json::from_str(&content).unwrap_or_else(|e| panic!("{e}: {response}"));
    assert!(
        answer["name"].is_string()
            && answer["age"].is_u64()
            && answer.as_object().unwrap().len() == 2,
        "{answer}"
    );
    assert_eq!(response["choices"][0]["finish_reason"], "stop", "{response}");
}
