//! Bad input gets the OpenAI error object with the right status, and never disturbs the
//! server: every test ends by checking that a good request still works.

mod common;

use common::{chat_body, client, post, server, Setup, API_KEY, SMALL_KV_TOKENS};
use serde_json::{json, Value};

async fn raw(base: &str, path: &str, body: &str) -> (u16, Value) {
    let response = client()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

fn assert_error(status: u16, body: &Value, expected_status: u16, needle: &str) {
    assert_eq!(status, expected_status, "{body}");
    let error = &body["error"];
    assert!(error["message"].as_str().unwrap().contains(needle), "{needle:?} not in {body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("param").is_some() && error.get("code").is_some(), "{body}");
}

async fn still_serves(base: &str) {
    let (status, body) = post(base, "/v1/chat/completions", &chat_body("Hi", 2)).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn malformed_and_invalid_requests_are_400_naming_the_problem() {
    let base = server(Setup::Default);
    let cases: &[(&str, &str)] = &[
        ("{\"messages\": [", "malformed JSON"),
        ("{\"model\": \"smollm2-135m\"}", "messages"),
        ("{\"messages\": []}", "messages must not be empty"),
        ("{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}", "wizard"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": \"hot\"}", "invalid"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": -3}", "invalid"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, \"top_logprobs\": 21}", "top_logprobs"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": 3}", "temperature"),
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 2}", "n"),
    ];
    for (body, needle) in cases {
        let (status, response) = raw(&base, "/v1/chat/completions", body).await;
        assert_error(status, &response, 400, needle);
    }
    let (status, response) = raw(&base, "/v1/completions", "{\"prompt\": 5}").await;
    assert_error(status, &response, 400, "invalid");
    still_serves(&base).await;
}

/// A body that parses as JSON but does not fit the request type names the JSON path of the
/// field at fault, in the message and in `param`.
#[tokio::test]
async fn a_field_that_does_not_fit_is_a_400_naming_its_json_path() {
    let base = server(Setup::Default);
    let hi = r#"{"role": "user", "content": "hi"}"#;
    let cases = [
        (
            "/v1/chat/completions",
            format!(
                r#"{{"messages": [{hi}, {{"role": "assistant", "content": "ok"}},
                {{"role": "user", "content": {{"text": "a map"}}}}]}}"#
            ),
            "messages[2].content",
        ),
        // Sampling fields are flattened into the request, where serde loses their path.
        (
            "/v1/chat/completions",
            format!(r#"{{"messages": [{hi}], "temperature": "hot"}}"#),
            "temperature",
        ),
        ("/v1/chat/completions", r#"{"messages": [{"content": "hi"}]}"#.into(), "messages[0].role"),
        ("/v1/chat/completions", r#"{"temperature": 0}"#.into(), "messages"),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"messages": [{hi}], "tools": [{{"type": "function", "function": {{"name": 7}}}}]}}"#
            ),
            "tools[0].function.name",
        ),
        ("/v1/completions", r#"{"prompt": "hi", "top_p": [1]}"#.into(), "top_p"),
        ("/v1/completions", r#"{"prompt": "hi", "max_tokens": "ten"}"#.into(), "max_tokens"),
        ("/v1/responses", r#"{"input": "hi", "seed": "lucky"}"#.into(), "seed"),
        (
            "/v1/tokenize",
            r#"{"messages": [{"role": "user", "content": 5}]}"#.into(),
            "messages[0].content",
        ),
        ("/v1/batches", r#"{"input_file_id": 5}"#.into(), "input_file_id"),
    ];
    for (path, body, param) in &cases {
        let (status, response) = raw(&base, path, body).await;
        assert_error(status, &response, 400, param);
        assert_eq!(response["error"]["param"], *param, "{path} {body}: {response}");
    }
    // The Messages route keeps Anthropic's error shape, the path in its message.
    let body = r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, {"role": 5}]}"#;
    let (status, response) = raw(&base, "/v1/messages", body).await;
    assert_eq!(status, 400, "{response}");
    assert_eq!(response["type"], "error", "{response}");
    assert!(
        response["error"]["message"].as_str().unwrap().contains("messages[1].role"),
        "{response}"
    );
    still_serves(&base).await;
}

#[tokio::test]
async fn unknown_model_and_route_are_404() {
    let base = server(Setup::Default);
    let mut body = chat_body("Hi", 2);
    body["model"] = json!("gpt-17");
    let (status, response) = post(&base, "/v1/chat/completions", &body).await;
    assert_error(status, &response, 404, "gpt-17");
    assert_eq!(response["error"]["code"], "model_not_found");
    let (status, response) = post(&base, "/v1/nothing-here", &json!({})).await;
    assert_error(status, &response, 404, "/v1/nothing-here");
}

#[tokio::test]
async fn a_prompt_longer_than_the_context_is_context_length_exceeded() {
    let base = server(Setup::SmallContext);
    let long = "word ".repeat(200);
    let (status, response) = post(&base, "/v1/chat/completions", &chat_body(&long, 2)).await;
    assert_error(status, &response, 400, "context");
    assert_eq!(response["error"]["code"], "context_length_exceeded");
    let (status, response) = post(&base, "/v1/completions", &json!({"prompt": long})).await;
    assert_error(status, &response, 400, "context");
    // max_tokens beyond the room left is clipped, not refused.
    let (status, response) = post(&base, "/v1/chat/completions", &chat_body("Hi", 5000)).await;
    assert_eq!(status, 200, "{response}");
}

#[tokio::test]
async fn a_prompt_larger_than_the_kv_pool_is_a_400_and_max_tokens_omitted_is_not() {
    let base = server(Setup::SmallKv);
    let long = "word ".repeat(SMALL_KV_TOKENS);
    let (status, response) = post(&base, "/v1/chat/completions", &chat_body(&long, 2)).await;
    assert_error(status, &response, 400, "--kv-cache-memory");
    assert_eq!(response["error"]["code"], "context_length_exceeded");
    // Omitting max_tokens reserves nothing: the request runs in the small pool.
    let mut body = chat_body("Count from one to five.", 2);
    body.as_object_mut().unwrap().remove("max_tokens");
    body["stop"] = json!(["\n"]);
    let (status, response) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
}

#[tokio::test]
async fn an_oversize_body_is_413() {
    let base = server(Setup::Default);
    let huge = chat_body(&"x".repeat(100 * 1024), 2);
    let (status, response) = post(&base, "/v1/chat/completions", &huge).await;
    assert_error(status, &response, 413, "larger");
    still_serves(&base).await;
}

#[tokio::test]
async fn the_api_key_is_required_when_set() {
    let base = server(Setup::ApiKey);
    let (status, response) = post(&base, "/v1/chat/completions", &chat_body("Hi", 2)).await;
    assert_error(status, &response, 401, "API key");
    let wrong =
        client().get(format!("{base}/v1/models")).bearer_auth("sk-wrong").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let right = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(API_KEY)
        .json(&chat_body("Hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
    // Health and the CORS preflight need no key.
    assert_eq!(client().get(format!("{base}/health")).send().await.unwrap().status(), 200);
    let preflight = client()
        .request(reqwest::Method::OPTIONS, format!("{base}/v1/chat/completions"))
        .header("origin", "http://localhost:3000")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 200);
    assert!(preflight.headers().contains_key("access-control-allow-origin"));
}

#[tokio::test]
async fn a_full_queue_is_429_with_retry_after() {
    let base = server(Setup::Tiny);
    // Hold the only slot with a long streamed generation.
    let mut body = chat_body("Write a long essay about the history of Rome.", 2000);
    body["stream"] = json!(true);
    let mut holder =
        client().post(format!("{base}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(holder.status(), 200);
    holder.chunk().await.unwrap().expect("first chunk");
    let refused = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat_body("Hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    // Dropping the stream frees the slot.
    drop(holder);
    let mut status = 0;
    for _ in 0..100 {
        status = client()
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body("Hi", 2))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200);
}
