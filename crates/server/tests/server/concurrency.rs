//! Many clients at once: a burst past the server's limits gets only answers and 429s, each
//! answer its own request's; a client that leaves mid-stream frees its sequence at once.

use crate::common;

use std::collections::{HashMap, HashSet};

use common::{chat_body, client, post, sse_data, start_with, Setup};
use futures_util::future::join_all;
use serde_json::{json, Value};

const BURST: usize = 80;
const MAX_CONCURRENT: usize = 16;

/// Prompts of different lengths and answers, so that a response given to the wrong request
/// shows in its text and its prompt tokens.
const QUESTIONS: [&str; 4] = [
    "What is the capital of France?",
    "Name three primary colours, please.",
    "Say hello in Spanish.",
    "What do bees make? Answer in one short sentence, then stop.",
];

/// What a request's own answer holds: its text and its prompt's length.
fn answer_of(response: &Value) -> (String, u64) {
    let text = response["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    (text, response["usage"]["prompt_tokens"].as_u64().unwrap())
}

#[tokio::test]
async fn a_burst_past_the_limits_gets_answers_and_429s_each_answer_its_own() {
    let base = start_with(Setup::Default, |config| {
        (config.max_concurrent, config.max_queue) = (MAX_CONCURRENT, 2 * MAX_CONCURRENT)
    });
    // Greedy output does not depend on what runs beside it: each question's answer alone is
    // the one it must get in the burst.
    let mut expected = HashMap::new();
    for question in QUESTIONS {
        let (status, response) = post(&base, "/v1/chat/completions", &chat_body(question, 8)).await;
        assert_eq!(status, 200, "{response}");
        expected.insert(question, answer_of(&response));
    }
    let requests = (0..BURST).map(|i| {
        let question = QUESTIONS[i % QUESTIONS.len()];
        let base = base.clone();
        async move {
            let response = client()
                .post(format!("{base}/v1/chat/completions"))
                .json(&chat_body(question, 8))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").cloned();
            let body: Value = response.json().await.unwrap();
            (question, status, retry_after, body)
        }
    });
    let mut answered = 0;
    let mut ids = HashSet::new();
    for (question, status, retry_after, body) in join_all(requests).await {
        match status {
            200 => {
                answered += 1;
                assert_eq!(answer_of(&body), expected[question], "{question}: {body}");
                assert!(ids.insert(body["id"].as_str().unwrap().to_string()), "{body}");
            }
            429 => {
                assert!(retry_after.is_some(), "a 429 without Retry-After: {body}");
                assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
            }
            _ => panic!("{question}: {status} {body}"),
        }
    }
    // The running and waiting requests at least: the server takes what its limits allow.
    assert!(answered >= MAX_CONCURRENT, "only {answered} of {BURST} answered");
}

/// `vllm:num_requests_running` from `/metrics`.
async fn running(base: &str) -> f64 {
    let text = client().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("vllm:num_requests_running{")?.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no vllm:num_requests_running in\n{text}"))
        .parse()
        .unwrap()
}

/// A streamed chat that generates for long, read up to its first token.
async fn long_stream(base: &str) -> (reqwest::Response, String) {
    let mut body = chat_body("Count from one to five hundred in words, separated by commas.", 1500);
    body["stream"] = json!(true);
    let mut response =
        client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut seen = String::new();
    while content_events(&seen) == 0 {
        seen.push_str(&String::from_utf8_lossy(&response.chunk().await.unwrap().unwrap()));
    }
    (response, seen)
}

/// Data events in `sse` that carry generated text.
fn content_events(sse: &str) -> usize {
    sse_data(sse)
        .iter()
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter(|chunk| {
            chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty())
        })
        .count()
}

/// Steps are counted on a second stream, one token each: no timing involved.
#[tokio::test]
async fn a_client_leaving_mid_stream_frees_its_sequence_within_a_step() {
    let base = start_with(Setup::Default, |config| config.max_concurrent = 2);
    let (leaving, _) = long_stream(&base).await;
    let (mut staying, mut seen) = long_stream(&base).await;
    assert_eq!(running(&base).await, 2.0);
    drop(leaving);
    // The server notices the closed connection when it writes the next token (one step), the
    // engine ends the sequence on the step after, and publishes its count after that step: by
    // the time the other stream has four more tokens, the count must be down.
    let before = content_events(&seen);
    while content_events(&seen) < before + 4 {
        let chunk = staying.chunk().await.unwrap().expect("the stream goes on");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(running(&base).await, 1.0);
    drop(staying);
}
