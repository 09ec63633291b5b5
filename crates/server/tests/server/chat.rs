//! `/v1/chat/completions` against the real server and model: the shape and usage of a real
//! answer, streaming equals non-streaming, seeds, and the model's own logprobs. Rendering,
//! limits and stop strings are tested without a model (tests/routes).

use crate::common;

use common::{chat_body, parse_chat_stream, post, post_stream, server, Setup};
use serde_json::{json, Value};

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

fn content(response: &Value) -> String {
    response["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn non_streaming_response_has_the_openai_shape() {
    let base = server(Setup::Smol);
    let mut request = chat_body(QUESTION, 24);
    request["model"] = json!(Setup::Smol.model());
    let (status, body) = post(&base, "/v1/chat/completions", &request).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "smollm2-135m");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(content(&body).contains("Paris"), "{body}");
    assert!(
        choice["message"].get("reasoning_content").is_none(),
        "no think tags in SmolLM2's template"
    );
    assert!(choice["logprobs"].is_null());
    let usage = &body["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!(completion > 0 && completion <= 24);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion
    );
    // Other tests on this server may have cached the same prompt.
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
            <= usage["prompt_tokens"].as_u64().unwrap()
    );
    let reason = choice["finish_reason"].as_str().unwrap();
    assert!(reason == "stop" || (reason == "length" && completion == 24), "{reason}");
}

#[tokio::test]
async fn streaming_gives_the_same_text_as_non_streaming() {
    let base = server(Setup::Default);
    for sampling in
        [json!({"temperature": 0}), json!({"temperature": 0.9, "top_p": 0.95, "seed": 7})]
    {
        let mut body = chat_body("Write a haiku about rivers.", 40);
        body.as_object_mut().unwrap().extend(sampling.as_object().unwrap().clone());
        let (_, whole) = post(&base, "/v1/chat/completions", &body).await;
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let streamed = parse_chat_stream(&post_stream(&base, "/v1/chat/completions", &body).await);
        assert_eq!(streamed.content, content(&whole), "{sampling}");
        assert_eq!(streamed.finish_reason, whole["choices"][0]["finish_reason"]);
        // The second run of the same prompt starts from the prefix cache, and gives the same text.
        let mut usage = streamed.usage.clone().unwrap();
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"], whole["usage"]["prompt_tokens"],
            "{sampling}"
        );
        usage["prompt_tokens_details"]["cached_tokens"] =
            whole["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
        assert_eq!(usage, whole["usage"]);
        // The usage chunk comes last and has no choices.
        let last = streamed.chunks.last().unwrap();
        assert_eq!(last["choices"].as_array().unwrap().len(), 0);
        assert!(streamed.chunks.len() > 3, "one chunk per token, not one blob");
    }
}

#[tokio::test]
async fn same_seed_gives_identical_text_and_another_seed_differs() {
    let base = server(Setup::Default);
    let sample = |seed: u64| {
        let base = base.clone();
        async move {
            let mut body = chat_body("Tell me a short story about a cat.", 48);
            body["temperature"] = json!(1.2);
            body["seed"] = json!(seed);
            content(&post(&base, "/v1/chat/completions", &body).await.1)
        }
    };
    // Concurrent requests must not disturb each other's random streams.
    let (a, b, c) = tokio::join!(sample(11), sample(11), sample(12));
    assert_eq!(a, b);
    assert_ne!(a, c, "a different seed at temperature 1.2 should change 48 tokens");
}

#[tokio::test]
async fn logprobs_describe_each_generated_token() {
    let base = server(Setup::Default);
    let mut body = chat_body(QUESTION, 12);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (status, whole) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let entries = whole["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(entries.len() as u64, whole["usage"]["completion_tokens"].as_u64().unwrap());
    let mut bytes = Vec::new();
    for entry in &entries {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one, and logprobs are sorted.
        assert_eq!(top[0]["token"], entry["token"]);
        assert_eq!(top[0]["logprob"], entry["logprob"]);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        bytes.extend(entry["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8));
    }
    // A random model may split a character across tokens or leave one unfinished: the bytes
    // decode as the text does, replacement characters included.
    assert_eq!(String::from_utf8_lossy(&bytes), content(&whole));

    body["stream"] = json!(true);
    let streamed = parse_chat_stream(&post_stream(&base, "/v1/chat/completions", &body).await);
    let streamed_entries: Vec<Value> = streamed
        .chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["logprobs"].get("content").cloned())
        .flat_map(|c| c.as_array().unwrap().clone())
        .collect();
    assert_eq!(streamed_entries, entries);

    body["stream"] = json!(false);
    body["logprobs"] = json!(false);
    body.as_object_mut().unwrap().remove("top_logprobs");
    assert!(post(&base, "/v1/chat/completions", &body).await.1["choices"][0]["logprobs"].is_null());
}
