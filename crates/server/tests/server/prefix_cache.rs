//! The prefix cache through the HTTP API: one chat request (with a system message longer than a
//! prefill chunk) gives the same text and logprobs streamed or not, cold or from the cache, sent
//! alone or 4 or 16 at a time; `usage.prompt_tokens_details.cached_tokens` says how much of the
//! prompt was reused.

use crate::common;

use common::{parse_chat_stream, post, post_stream, server, Setup};
use futures_util::future::join_all;
use serde_json::{json, Value};
use tokio::sync::Mutex;

/// The tests of this file take turns: 16 requests of one and 16 of another would overflow the
/// server's 20 places (4 running, 16 queued) and be refused.
static TURNS: Mutex<()> = Mutex::const_new(());

/// A system prompt of well over 256 tokens (the server's prefill chunk), made unique per test
/// by `name` so that each test's first request is really cold.
fn system_prompt(name: &str) -> String {
    let rules = [
        "Greet the customer by name when they give one.",
        "Answer questions about bread, pastries, cakes and opening hours briefly and politely.",
        "Never invent prices; point to the price list by the till instead.",
        "Mention allergens (gluten, eggs, milk, nuts, sesame) whenever a product contains them.",
        "Recommend the seasonal pastry when asked for a recommendation.",
        "Orders for cakes need two days' notice and a deposit, paid in the shop.",
        "The bakery opens at seven every morning except Monday, and closes at one on Sundays.",
        "Bread left at closing time goes to the food bank on the corner of the square.",
        "Do not discuss other bakeries, the weather or politics; steer back to the bakery.",
        "If a question is unclear, ask one short question back rather than guessing.",
    ];
    let mut text = format!(
        "You are the assistant of {name}, a family bakery in the old town of Lyon. Rules:\n"
    );
    for round in 0..3 {
        for (i, rule) in rules.iter().enumerate() {
            text.push_str(&format!("{}. {rule}\n", round * rules.len() + i + 1));
        }
    }
    text
}

fn chat_request(system: &str, user: &str, sampling: &Value, stream: bool) -> Value {
    let mut body = json!({
        "model": "smollm2-135m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 10,
        "logprobs": true,
        "top_logprobs": 3,
        "stream": stream,
    });
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body.as_object_mut().unwrap().extend(sampling.as_object().unwrap().clone());
    body
}

/// What must not depend on how a response was produced.
#[derive(Debug, PartialEq)]
struct Answer {
    text: String,
    finish_reason: String,
    /// The `logprobs.content` entries, in order.
    logprobs: Vec<Value>,
}

/// Sends `body`, streamed or not as it says; returns the answer and the usage.
async fn send(base: &str, body: &Value) -> (Answer, Value) {
    if body["stream"] == true {
        let streamed = parse_chat_stream(&post_stream(base, "/v1/chat/completions", body).await);
        let logprobs = streamed
            .chunks
            .iter()
            .filter_map(|c| c["choices"].get(0)?["logprobs"].get("content").cloned())
            .flat_map(|c| c.as_array().unwrap().clone())
            .collect();
        let answer =
            Answer { text: streamed.content, finish_reason: streamed.finish_reason, logprobs };
        (answer, streamed.usage.expect("a usage chunk"))
    } else {
        let (status, whole) = post(base, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{whole}");
        let choice = &whole["choices"][0];
        let answer = Answer {
            text: choice["message"]["content"].as_str().unwrap().to_string(),
            finish_reason: choice["finish_reason"].as_str().unwrap().to_string(),
            logprobs: choice["logprobs"]["content"].as_array().unwrap().clone(),
        };
        (answer, whole["usage"].clone())
    }
}

fn cached_tokens(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {usage}"))
}

/// Tokens of the rendered system message and the user turn's header: where a request with
/// another user turn parts from a cached one, and so resumes (on this attention-only model).
async fn shared_tokens(base: &str, system: &str) -> u64 {
    tokens_of(base, &format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n")).await
}

async fn tokens_of(base: &str, text: &str) -> u64 {
    let (status, tokens) =
        post(base, "/v1/tokenize", &json!({"prompt": text, "add_special_tokens": false})).await;
    assert_eq!(status, 200, "{tokens}");
    tokens["count"].as_u64().unwrap()
}

/// For one sampling: the first request (cold, streamed or not as `cold_streamed` says), then the
/// same request again alone, 4 at a time and 16 at a time, half of them streamed: every answer
/// is the cold one, every later one is served from the cache in full. A request with another
/// user turn resumes where it parts from the cached one, after the system message.
async fn check_same_answer_everywhere(name: &str, sampling: Value, cold_streamed: bool) {
    let _turn = TURNS.lock().await;
    let base = server(Setup::Smol);
    let system = system_prompt(name);
    let user = "Can I order a birthday cake for Saturday, and what should I tell you?";
    let (cold, usage) = send(&base, &chat_request(&system, user, &sampling, cold_streamed)).await;
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt_tokens > 256,
        "the system prompt should span more than one prefill chunk ({prompt_tokens} tokens)"
    );
    // Other tests' prompts on this server share the system turn's header at most.
    let header = tokens_of(&base, "<|im_start|>system\nYou are the assistant of ").await;
    assert!(cached_tokens(&usage) <= header, "{name}: the first request should read its prompt");
    assert_eq!(cold.logprobs.len() as u64, usage["completion_tokens"].as_u64().unwrap());
    assert!(!cold.text.is_empty());

    for concurrency in [1, 4, 16] {
        let bodies: Vec<Value> = (0..concurrency)
            .map(|i| chat_request(&system, user, &sampling, (i % 2 == 0) != cold_streamed))
            .collect();
        let results = join_all(bodies.iter().map(|b| send(&base, b))).await;
        for (i, (answer, usage)) in results.iter().enumerate() {
            let how = format!(
                "{name}, {sampling}: request {i} of {concurrency} (stream {})",
                bodies[i]["stream"]
            );
            assert_eq!(answer, &cold, "{how} differs from the cold answer");
            assert_eq!(
                cached_tokens(usage),
                prompt_tokens,
                "{how} was not served from the cache in full"
            );
            assert_eq!(usage["prompt_tokens"].as_u64(), Some(prompt_tokens));
        }
    }

    let expected = shared_tokens(&base, &system).await;
    let other = chat_request(&system, "Which bread keeps longest?", &sampling, !cold_streamed);
    let (_, usage) = send(&base, &other).await;
    assert_eq!(
        cached_tokens(&usage),
        expected,
        "{name}: another user turn should resume where it parts, after the system message"
    );
}

#[tokio::test]
async fn greedy_answers_are_identical_streamed_or_not_cold_or_cached_alone_or_concurrent() {
    check_same_answer_everywhere("Maison Rivet", json!({"temperature": 0}), false).await;
}

#[tokio::test]
async fn seeded_answers_are_identical_streamed_or_not_cold_or_cached_alone_or_concurrent() {
    check_same_answer_everywhere(
        "Boulangerie Perret",
        json!({"temperature": 0.9, "seed": 1234}),
        true,
    )
    .await;
}
