//! Bad input gets the OpenAI error object with the right status (Anthropic's on the Messages
//! routes), before any byte of a stream, and never disturbs the server: tests end by checking
//! that a good request still works.

use axum::body::Body;
use axum::http::{header, Request};
use serde_json::{json, Value};

use crate::common::{body_text, chat_body, replying, server_with, Gate, Reply, TestServer, MODEL};

/// A body sent as is (not necessarily JSON).
async fn raw(server: &TestServer, path: &str, body: &str) -> (u16, Value) {
    let request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    server.send_json(request).await
}

pub fn assert_error(status: u16, body: &Value, expected_status: u16, needle: &str) {
    assert_eq!(status, expected_status, "{body}");
    let error = &body["error"];
    assert!(error["message"].as_str().unwrap().contains(needle), "{needle:?} not in {body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("param").is_some() && error.get("code").is_some(), "{body}");
}

async fn still_serves(server: &TestServer) {
    let (status, body) = server.post("/v1/chat/completions", &chat_body("Hi", 2)).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn malformed_and_invalid_requests_are_400_naming_the_problem() {
    let server = replying("Fine.");
    let cases: &[(&str, &str)] = &[
        ("{\"messages\": [", "malformed JSON"),
        ("{\"model\": \"scripted\"}", "messages"),
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
        let (status, response) = raw(&server, "/v1/chat/completions", body).await;
        assert_error(status, &response, 400, needle);
    }
    let (status, response) = raw(&server, "/v1/completions", "{\"prompt\": 5}").await;
    assert_error(status, &response, 400, "invalid");
    assert!(server.engine.seen().is_empty(), "no refused request reaches the engine");
    still_serves(&server).await;
}

/// A body that parses as JSON but does not fit the request type names the JSON path of the
/// field at fault, in the message and in `param`.
#[tokio::test]
async fn a_field_that_does_not_fit_is_a_400_naming_its_json_path() {
    let server = replying("Fine.");
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
        let (status, response) = raw(&server, path, body).await;
        assert_error(status, &response, 400, param);
        assert_eq!(response["error"]["param"], *param, "{path} {body}: {response}");
    }
    let body = r#"{"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, {"role": 5}]}"#;
    let (status, response) = raw(&server, "/v1/messages", body).await;
    assert_eq!(status, 400, "{response}");
    assert_eq!(response["type"], "error", "{response}");
    let message = response["error"]["message"].as_str().unwrap();
    assert!(message.contains("messages[1].role"), "{response}");
    still_serves(&server).await;
}

#[tokio::test]
async fn unknown_model_and_route_are_404() {
    let server = replying("Fine.");
    let mut body = chat_body("Hi", 2);
    body["model"] = json!("gpt-17");
    let (status, response) = server.post("/v1/chat/completions", &body).await;
    assert_error(status, &response, 404, "gpt-17");
    assert_eq!(response["error"]["code"], "model_not_found");
    let (status, response) = server.post("/v1/nothing-here", &json!({})).await;
    assert_error(status, &response, 404, "/v1/nothing-here");
}

fn small_context() -> TestServer {
    server_with(|_| Reply::text("Fine."), |config, _| config.ctx_size = 64)
}

#[tokio::test]
async fn a_prompt_longer_than_the_context_is_context_length_exceeded_naming_its_field() {
    let server = small_context();
    let long = "word ".repeat(200);
    let (status, response) = server.post("/v1/chat/completions", &chat_body(&long, 2)).await;
    assert_error(status, &response, 400, "context");
    assert_eq!(response["error"]["code"], "context_length_exceeded");
    assert_eq!(response["error"]["param"], "messages");
    let (status, response) = server.post("/v1/completions", &json!({"prompt": long})).await;
    assert_error(status, &response, 400, "shorten the prompt");
    assert_eq!(response["error"]["code"], "context_length_exceeded");
    assert_eq!(response["error"]["param"], "prompt");
    let (status, response) = server.post("/v1/responses", &json!({"input": long})).await;
    assert_error(status, &response, 400, "context");
    assert_eq!(response["error"]["code"], "context_length_exceeded");
    assert_eq!(response["error"]["param"], "input");
    // max_tokens beyond the room left is clipped, not refused.
    let (status, response) = server.post("/v1/chat/completions", &chat_body("Hi", 5000)).await;
    assert_eq!(status, 200, "{response}");
    let seen = server.engine.last();
    assert_eq!(seen.max_tokens, 64 - seen.prompt_tokens);
}

#[tokio::test]
async fn the_served_context_is_at_most_the_models() {
    let server = server_with(|_| Reply::text("Fine."), |_, model| model.max_positions = 32);
    let (status, response) =
        server.post("/v1/chat/completions", &chat_body(&"word ".repeat(40), 2)).await;
    assert_error(status, &response, 400, "context holds 32");
}

#[tokio::test]
async fn a_prompt_larger_than_the_kv_pool_is_a_400_and_max_tokens_omitted_is_not() {
    let server = server_with(|_| Reply::text("Fine."), |_, model| model.kv_tokens = 48);
    let long = "word ".repeat(100);
    let (status, response) = server.post("/v1/chat/completions", &chat_body(&long, 2)).await;
    assert_error(status, &response, 400, "--kv-cache-memory");
    assert_eq!(response["error"]["code"], "context_length_exceeded");
    let mut body = chat_body("Count from one to five.", 2);
    body.as_object_mut().unwrap().remove("max_tokens");
    let (status, response) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
}

#[tokio::test]
async fn an_oversize_body_is_413() {
    let server = replying("Fine.");
    let huge = chat_body(&"x".repeat(100 * 1024), 2);
    let (status, response) = server.post("/v1/chat/completions", &huge).await;
    assert_error(status, &response, 413, "larger");
    still_serves(&server).await;
}

pub const API_KEY: &str = "sk-test-key";

pub fn with_api_key() -> TestServer {
    server_with(|_| Reply::text("Fine."), |config, _| config.api_key = Some(API_KEY.into()))
}

#[tokio::test]
async fn the_api_key_is_required_when_set() {
    let server = with_api_key();
    let (status, response) = server.post("/v1/chat/completions", &chat_body("Hi", 2)).await;
    assert_error(status, &response, 401, "API key");
    let wrong = Request::get("/v1/models")
        .header(header::AUTHORIZATION, "Bearer sk-wrong")
        .body(Body::empty())
        .unwrap();
    assert_eq!(server.send(wrong).await.status(), 401);
    let right = Request::post("/v1/chat/completions")
        .header(header::AUTHORIZATION, format!("Bearer {API_KEY}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(chat_body("Hi", 2).to_string()))
        .unwrap();
    assert_eq!(server.send(right).await.status(), 200);
    let (status, _) = server.get("/health").await;
    assert_eq!(status, 200, "health needs no key");
    let preflight = Request::options("/v1/chat/completions")
        .header(header::ORIGIN, "http://localhost:3000")
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "authorization, content-type")
        .body(Body::empty())
        .unwrap();
    let preflight = server.send(preflight).await;
    assert_eq!(preflight.status(), 200);
    assert!(preflight.headers().contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));
}

/// A body with `"stream": true`: its status and JSON body. A request refused before the first
/// byte is an HTTP error, not an SSE error event under a 200.
pub async fn streamed(server: &TestServer, path: &str, mut body: Value) -> (u16, Value) {
    body["stream"] = json!(true);
    let response = server.send(crate::common::post_json(path, &body)).await;
    let status = response.status().as_u16();
    let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
    let text = body_text(response).await;
    assert!(content_type.starts_with("application/json"), "{status} {content_type}: {text}");
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
}

#[tokio::test]
async fn a_full_queue_is_429_with_retry_after_and_a_finished_request_frees_its_place() {
    let gate = Gate::default();
    let held = gate.clone();
    let server = server_with(
        move |_| Reply::Held { text: "Done.".into(), gate: held.clone() },
        |config, _| (config.max_concurrent, config.max_queue) = (1, 0),
    );
    let holder = server.clone();
    let holder = tokio::spawn(async move {
        holder.post("/v1/chat/completions", &chat_body("Hold the slot", 8)).await
    });
    // The holder is in flight once the engine has it.
    while server.engine.seen().is_empty() {
        tokio::task::yield_now().await;
    }
    let (status, body) = server.post("/v1/chat/completions", &chat_body("Hi", 2)).await;
    assert_error(status, &body, 429, "limit");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    let refused =
        server.send(crate::common::post_json("/v1/chat/completions", &chat_body("Hi", 2))).await;
    assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
    let (status, body) = streamed(&server, "/v1/chat/completions", chat_body("Hi", 2)).await;
    assert_error(status, &body, 429, "");
    gate.open();
    let (status, answer) = holder.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    still_serves(&server).await;
}

/// The STRICT template refuses a conversation not opened by a user or system message with its
/// own `raise_exception`, and fails by itself on a message saying `break the template`.
const STRICT_TEMPLATE: &str = "{% for m in messages %}{% if loop.first and m.role not in ['user', 'system'] %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}{% if m.content == 'break the template' %}{{ m.content.no_such_method() }}{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

#[tokio::test]
async fn a_template_refusal_is_a_400_and_a_template_fault_a_500_without_detail() {
    let server = server_with(
        |_| Reply::text("Fine."),
        |_, model| {
            model.template =
                spindle_chat::ChatTemplate::new(STRICT_TEMPLATE, None, Some("<|im_end|>")).unwrap()
        },
    );
    let mut refused = chat_body("Hi", 2);
    refused["messages"] = json!([{"role": "assistant", "content": "Hello"}]);
    let broken = chat_body("break the template", 2);
    for stream in [false, true] {
        for (body, status, needle) in [
            (&refused, 400, "Conversation must start with a user message"),
            (&broken, 500, "request req_"),
        ] {
            let (got, response) = if stream {
                streamed(&server, "/v1/chat/completions", body.clone()).await
            } else {
                server.post("/v1/chat/completions", body).await
            };
            assert_error(got, &response, status, needle);
            let message = response["error"]["message"].as_str().unwrap();
            if status == 500 {
                assert_eq!(response["error"]["type"], "server_error");
                assert!(!message.contains("no_such_method") && !message.contains("template"));
            } else {
                assert_eq!(response["error"]["param"], "messages");
            }
        }
    }
    still_serves(&server).await;
}

#[tokio::test]
async fn a_streamed_request_refused_before_its_first_byte_gets_an_http_status() {
    let server = small_context();
    let mut hot = chat_body("Hi", 2);
    hot["temperature"] = json!(3);
    let (status, response) = streamed(&server, "/v1/chat/completions", hot).await;
    assert_error(status, &response, 400, "temperature");
    let mut unknown = chat_body("Hi", 2);
    unknown["model"] = json!("gpt-17");
    let (status, response) = streamed(&server, "/v1/chat/completions", unknown).await;
    assert_error(status, &response, 404, "gpt-17");
    let long = "word ".repeat(200);
    let (status, response) = streamed(&server, "/v1/chat/completions", chat_body(&long, 2)).await;
    assert_error(status, &response, 400, "context");
    let (status, response) =
        streamed(&server, "/v1/completions", json!({"prompt": long, "max_tokens": 2})).await;
    assert_error(status, &response, 400, "context");
    let (status, response) =
        streamed(&server, "/v1/responses", json!({"input": long, "max_output_tokens": 16})).await;
    assert_error(status, &response, 400, "context");
    let messages =
        json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": long}]});
    let (status, response) = streamed(&server, "/v1/messages", messages).await;
    assert_eq!(status, 400, "{response}");
    assert_eq!(response["type"], "error", "{response}");
}

/// A failure the engine reports after the stream started comes as an error event, then
/// `[DONE]`; before, as the HTTP status. Either way a 500 names only a request id.
#[tokio::test]
async fn an_engine_failure_is_a_500_naming_the_request_whole_or_streamed() {
    let server = crate::common::server(|_| {
        Reply::Fail(spindle_runner::RunnerError::Internal("the model step panicked: boom".into()))
    });
    let (status, response) = server.post("/v1/chat/completions", &chat_body("Hi", 4)).await;
    assert_error(status, &response, 500, "chatcmpl-");
    assert!(!response.to_string().contains("boom"), "{response}");
    let mut body = chat_body("Hi", 4);
    body["stream"] = json!(true);
    let data = server.post_stream("/v1/chat/completions", &body).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains("chatcmpl-"), "{error}");
    assert!(!data.concat().contains("boom"));
}
