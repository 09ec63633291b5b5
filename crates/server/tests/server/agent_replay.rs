//! The first request of each real coding agent, as `scripts/agents/run.sh` recorded it against
//! `spindle serve` (tests/data/agents: Claude Code on the Messages API, Codex on the Responses
//! API, Qwen Code on Chat Completions), sent again to a test server: every field the clients send
//! is accepted (a 200, never a 4xx), and the answer streams as the client asked with well-formed
//! events in its protocol's grammar.
//!
//! The requests go whole (8-19K tokens of system prompt and tool schemas) to the tiny model
//! behind Qwen3's template, which reads them in seconds.

use crate::common;

use common::{client, start_with, Setup};
use serde_json::Value;

/// (fixture, endpoint) for each client.
const AGENTS: [(&str, &str); 3] = [
    ("claude_code.json", "/v1/messages?beta=true"),
    ("codex.json", "/v1/responses"),
    ("qwen_code.json", "/v1/chat/completions"),
];

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/data/agents/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The request as the client sent it, for `model`, with a short answer: the output limit the
/// client's protocol names is set to `max_tokens` (the clients ask for up to 32,000).
fn replayed(name: &str, model: &str, max_tokens: u32) -> Value {
    let mut body = fixture(name);
    body["model"] = model.into();
    let limit = if name == "codex.json" { "max_output_tokens" } else { "max_tokens" };
    body[limit] = max_tokens.into();
    body
}

/// Sends `body` and checks the answer: a 200, streamed as the client asked, each event in the
/// grammar of `path`'s protocol. Returns the events' data.
async fn replay(base: &str, path: &str, body: &Value) -> Vec<Value> {
    let response = client().post(format!("{base}{path}")).json(body).send().await.unwrap();
    let status = response.status();
    let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "{path}: {text}");
    assert_eq!(body["stream"], true, "the clients stream their first request");
    assert!(content_type.starts_with("text/event-stream"), "{path}: {content_type}");
    let events: Vec<(Option<String>, String)> = text
        .split("\n\n")
        .filter_map(|event| {
            let field = |name: &str| {
                event.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim_start().to_string())
            };
            field("data:").map(|data| (field("event:"), data))
        })
        .collect();
    let (last, events) =
        events.split_last().unwrap_or_else(|| panic!("{path}: no events in {text:?}"));
    let mut data: Vec<Value> = events
        .iter()
        .map(|(_, data)| {
            serde_json::from_str(data).unwrap_or_else(|e| panic!("{path}: {e} in {data:?}"))
        })
        .collect();
    if path.starts_with("/v1/chat/completions") {
        assert_eq!(last.1, "[DONE]", "{path}");
        check_chat(&data);
    } else {
        data.push(serde_json::from_str(&last.1).unwrap());
        for ((name, _), event) in events.iter().chain([last]).zip(&data) {
            assert_eq!(
                name.as_deref(),
                event["type"].as_str(),
                "{path}: the event line names the data's type"
            );
        }
        if path.starts_with("/v1/messages") {
            check_messages(&data)
        } else {
            check_responses(&data)
        }
    }
    data
}

/// Anthropic's grammar: `message_start` (with input tokens), blocks that open at the next index,
/// take deltas of their own kind and close, `message_delta` with a stop reason, `message_stop`.
fn check_messages(events: &[Value]) {
    let kinds: Vec<&str> =
        events.iter().map(|e| e["type"].as_str().unwrap()).filter(|&k| k != "ping").collect();
    assert_eq!(kinds.first(), Some(&"message_start"), "{kinds:?}");
    assert_eq!(kinds[kinds.len() - 2..], ["message_delta", "message_stop"], "{kinds:?}");
    assert!(events[0]["message"]["usage"]["input_tokens"].is_u64(), "{}", events[0]);
    let mut open: Option<(u64, String)> = None;
    let mut next = 0;
    for event in events.iter().filter(|e| e["type"].as_str().unwrap().starts_with("content_block"))
    {
        let index = event["index"].as_u64().unwrap();
        match event["type"].as_str().unwrap() {
            "content_block_start" => {
                assert!(open.is_none() && index == next, "{event}");
                open = Some((index, event["content_block"]["type"].as_str().unwrap().to_string()));
            }
            "content_block_delta" => {
                let (at, kind) =
                    open.as_ref().unwrap_or_else(|| panic!("delta outside a block: {event}"));
                let allowed: &[&str] = match kind.as_str() {
                    "text" => &["text_delta"],
                    "tool_use" => &["input_json_delta"],
                    "thinking" => &["thinking_delta", "signature_delta"],
                    other => panic!("block type {other}"),
                };
                assert!(
                    *at == index && allowed.contains(&event["delta"]["type"].as_str().unwrap()),
                    "{kind}: {event}"
                );
            }
            _ => {
                assert_eq!(open.take().map(|(at, _)| at), Some(index), "{event}");
                next += 1;
            }
        }
    }
    assert!(open.is_none());
    assert!(events[events.len() - 2]["delta"]["stop_reason"].is_string());
}

/// OpenAI's Responses grammar: sequence numbers 0, 1, 2, …, `response.created` first,
/// `response.completed` (or `response.incomplete` at the output limit) with usage last, function
/// calls done with a call id and a name.
fn check_responses(events: &[Value]) {
    for (n, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], n, "{event}");
        if event["type"] == "response.output_item.done" && event["item"]["type"] == "function_call"
        {
            assert!(event["item"]["call_id"].as_str().is_some_and(|id| !id.is_empty()), "{event}");
            assert!(event["item"]["name"].as_str().is_some_and(|name| !name.is_empty()), "{event}");
        }
    }
    assert_eq!(events[0]["type"], "response.created");
    let last = events.last().unwrap();
    assert!(
        ["response.completed", "response.incomplete"].contains(&last["type"].as_str().unwrap()),
        "{last}"
    );
    assert!(last["response"]["usage"]["input_tokens"].is_u64(), "{last}");
}

/// Chat Completions chunks: a role first, one finish reason, tool calls opened with an id and
/// a name.
fn check_chat(chunks: &[Value]) {
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"), "{chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let choices: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"].get(0)).collect();
    assert_eq!(choices.iter().filter(|c| c["finish_reason"].is_string()).count(), 1, "{chunks:?}");
    let mut opened = std::collections::HashSet::new();
    for call in
        choices.iter().flat_map(|c| c["delta"]["tool_calls"].as_array().into_iter().flatten())
    {
        if opened.insert(call["index"].as_u64().unwrap()) {
            assert!(call["id"].is_string() && call["function"]["name"].is_string(), "{call}");
        }
    }
}

#[tokio::test]
async fn every_client_first_request_is_accepted_and_streams_well_formed_events() {
    let base = start_with(Setup::Wide, |config| config.ctx_size = 32768);
    for (name, path) in AGENTS {
        let started = std::time::Instant::now();
        let events = replay(&base, path, &replayed(name, common::TINY, 4)).await;
        eprintln!("{name}: {} events in {:.1} s", events.len(), started.elapsed().as_secs_f64());
    }
}
