//! The other endpoints (legacy completions, models, health, metrics, tokenize, detokenize,
//! cancel) and the lifecycle of a request whose client goes away.

use crate::common;

use std::time::Duration;

use common::{chat_body, client, post, post_stream, server, sse_data, Setup};
use serde_json::{json, Value};

async fn metrics(base: &str) -> String {
    client().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap()
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} missing from\n{metrics}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn models_health_and_metrics() {
    let base = server(Setup::Default);
    let models: Value =
        client().get(format!("{base}/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "smollm2-135m");
    assert_eq!(models["data"][0]["object"], "model");
    let health: Value =
        client().get(format!("{base}/health")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");

    let (status, _) = post(&base, "/v1/chat/completions", &chat_body("Hi there", 3)).await;
    assert_eq!(status, 200);
    let text = metrics(&base).await;
    for name in [
        "spindle_requests_total",
        "spindle_queue_depth",
        "spindle_prompt_tokens_total",
        "spindle_generated_tokens_total",
        "spindle_cached_prompt_tokens_total",
        "spindle_time_to_first_token_seconds_bucket",
        "spindle_inter_token_latency_seconds_bucket",
        "spindle_prefill_tokens_per_second_bucket",
        "spindle_prefix_cache_snapshot_bytes",
        "spindle_kv_window_released_blocks",
        "spindle_orphan_prefill_tokens_total",
        "spindle_orphan_prefill_reused_tokens_total",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    assert!(gauge(&text, "spindle_generated_tokens_total") >= 3.0);
    // vLLM's prefix-cache counters read the same totals as ours.
    assert_eq!(
        gauge(&text, "vllm:prefix_cache_queries_total"),
        gauge(&text, "spindle_prompt_tokens_total")
    );
    assert_eq!(
        gauge(&text, "vllm:prefix_cache_hits_total"),
        gauge(&text, "spindle_cached_prompt_tokens_total")
    );
    let usage = gauge(&text, "vllm:kv_cache_usage_perc");
    assert!((0.0..=1.0).contains(&usage), "{usage}");
    assert!(gauge(&text, "spindle_time_to_first_token_seconds_count") >= 1.0);
    assert!(text.contains("endpoint=\"/v1/chat/completions\",status=\"200\""), "{text}");
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let base = server(Setup::Default);
    let text = "Grüße, 世界! 🦀 fn main() {}";
    let (status, tokens) =
        post(&base, "/v1/tokenize", &json!({"prompt": text, "add_special_tokens": false})).await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(
        tokens["count"].as_u64().unwrap() as usize,
        tokens["tokens"].as_array().unwrap().len()
    );
    assert_eq!(tokens["max_model_len"], 2048);
    let (_, back) = post(&base, "/v1/detokenize", &json!({"tokens": tokens["tokens"]})).await;
    assert_eq!(back["prompt"], text);
    let (status, bad) = post(&base, "/v1/detokenize", &json!({"tokens": [999999999]})).await;
    assert_eq!(status, 400, "{bad}");
}

#[tokio::test]
async fn legacy_completions_stream_and_not() {
    let base = server(Setup::Default);
    let body = json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "logprobs": 2});
    let (status, whole) = post(&base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.contains("Paris"), "{text}");
    let logprobs = &whole["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 8);
    assert_eq!(
        logprobs["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<String>(),
        text
    );
    assert_eq!(logprobs["top_logprobs"][0].as_object().unwrap().len(), 2);

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let data = post_stream(&base, "/v1/completions", &streamed_body).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text);

    let mut echo = body.clone();
    echo["echo"] = json!(true);
    echo.as_object_mut().unwrap().remove("logprobs");
    let (_, echoed) = post(&base, "/v1/completions", &echo).await;
    assert_eq!(echoed["choices"][0]["text"], format!("The capital of France is{text}"));
}

/// Starts a long streamed chat and returns its response after the first data chunk, and the id.
async fn start_long_stream(base: &str) -> (reqwest::Response, String) {
    let mut body = chat_body("Write a very long story about a dragon and a knight.", 1500);
    body["stream"] = json!(true);
    let mut response =
        client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        seen.push_str(&String::from_utf8_lossy(
            &response.chunk().await.unwrap().expect("a first chunk"),
        ));
    }
    let first: Value = serde_json::from_str(&sse_data(&seen)[0]).unwrap();
    (response, first["id"].as_str().unwrap().to_string())
}

/// The tiny server runs one request at a time: the tests that fill it take turns.
static TINY_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn wait_until_idle(base: &str) {
    for _ in 0..200 {
        if gauge(&metrics(base).await, "spindle_running_requests") == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the engine still runs a request whose client is gone");
}

#[tokio::test]
async fn a_disconnected_client_cancels_its_generation() {
    let _turn = TINY_TURN.lock().await;
    let base = server(Setup::Tiny);
    let (response, _) = start_long_stream(&base).await;
    drop(response);
    wait_until_idle(&base).await;
    // The HTTP layer lets go of the request's slot when it drops the response body, which may
    // come a moment after the engine has stopped.
    let mut status = 0;
    for _ in 0..100 {
        status = post(&base, "/v1/chat/completions", &chat_body("Hi", 2)).await.0;
        if status != 429 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_cancel_endpoint_ends_a_running_request() {
    let _turn = TINY_TURN.lock().await;
    let base = server(Setup::Tiny);
    let (response, id) = start_long_stream(&base).await;
    let (status, cancelled) =
        post(&base, &format!("/v1/chat/completions/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["cancelled"], true);
    // The stream ends promptly instead of running to 1500 tokens.
    let rest = tokio::time::timeout(Duration::from_secs(30), response.text())
        .await
        .expect("the stream ended");
    assert!(rest.is_ok());
    wait_until_idle(&base).await;
    let (status, missing) =
        post(&base, "/v1/chat/completions/chatcmpl-unknown/cancel", &json!({})).await;
    assert_eq!(status, 404, "{missing}");
}
