//! Bad input gets the OpenAI error object with the right status, and never disturbs the
//! server: every test ends by checking that a good request still works.

use crate::common;

use common::{
    chat_body, client, post, server, start_with, Setup, API_KEY, SMALL_KV_TOKENS, TEMPLATE_BREAKER,
};
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
    // A server of its own: the shared one-slot server is busy with other tests' streams.
    let base = start_with(Setup::Tiny, |_| {});
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
    // A streamed request is refused before its first byte too: a 429, not an SSE error.
    let (status, body) = streamed(&base, "/v1/chat/completions", chat_body("Hi", 2)).await;
    assert_error(status, &body, 429, "");
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

/// A body with `"stream": true`, sent as is: its status and JSON body. A request refused
/// before the first byte is an HTTP error, not an SSE error event under a 200.
async fn streamed(base: &str, path: &str, mut body: Value) -> (u16, Value) {
    body["stream"] = json!(true);
    let response = client().post(format!("{base}{path}")).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
    let text = response.text().await.unwrap();
    assert!(content_type.starts_with("application/json"), "{status} {content_type}: {text}");
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

/// The template's own `raise_exception` is the request's fault: a 400 naming `messages` with
/// the template's words. A template failing by itself is the server's: a 500 naming a request
/// id, its detail left in the log.
#[tokio::test]
async fn a_template_refusal_is_a_400_and_a_template_fault_a_500_without_detail() {
    let base = server(Setup::StrictTemplate);
    let mut refused = chat_body("Hi", 2);
    refused["messages"] = json!([{"role": "assistant", "content": "Hello"}]);
    let broken = chat_body(TEMPLATE_BREAKER, 2);
    for stream in [false, true] {
        let send = |body: &Value| {
            let body = body.clone();
            let base = base.clone();
            async move {
                if stream {
                    streamed(&base, "/v1/chat/completions", body).await
                } else {
                    post(&base, "/v1/chat/completions", &body).await
                }
            }
        };
        let (status, response) = send(&refused).await;
        assert_error(status, &response, 400, "Conversation must start with a user message");
        assert_eq!(response["error"]["param"], "messages");
        let (status, response) = send(&broken).await;
        assert_error(status, &response, 500, "request req_");
        assert_eq!(response["error"]["type"], "server_error");
        let message = response["error"]["message"].as_str().unwrap();
        assert!(!message.contains("no_such_method") && !message.contains("template"), "{message}");
    }
    still_serves(&base).await;
}

/// What is known before the response starts (the body, the model, the context, the queue)
/// comes back as an HTTP status on streamed requests too.
#[tokio::test]
async fn a_streamed_request_refused_before_its_first_byte_gets_an_http_status() {
    let base = server(Setup::SmallContext);
    let mut hot = chat_body("Hi", 2);
    hot["temperature"] = json!(3);
    let (status, response) = streamed(&base, "/v1/chat/completions", hot).await;
    assert_error(status, &response, 400, "temperature");
    let mut unknown = chat_body("Hi", 2);
    unknown["model"] = json!("gpt-17");
    let (status, response) = streamed(&base, "/v1/chat/completions", unknown).await;
    assert_error(status, &response, 404, "gpt-17");
    let long = "word ".repeat(200);
    let (status, response) = streamed(&base, "/v1/chat/completions", chat_body(&long, 2)).await;
    assert_error(status, &response, 400, "context");
    let (status, response) =
        streamed(&base, "/v1/completions", json!({"prompt": long, "max_tokens": 2})).await;
    assert_error(status, &response, 400, "context");
    let (status, response) =
        streamed(&base, "/v1/responses", json!({"input": long, "max_output_tokens": 16})).await;
    assert_error(status, &response, 400, "context");
    let messages = json!({"max_tokens": 2, "messages": [{"role": "user", "content": long}]});
    let (status, response) = streamed(&base, "/v1/messages", messages).await;
    assert_eq!(status, 400, "{response}");
    assert_eq!(response["type"], "error", "{response}");
}
