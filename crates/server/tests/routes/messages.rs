//! Anthropic's Messages API: whole and streamed answers carry the same blocks, streams follow
//! Anthropic's event grammar, thinking follows the request's switch and budget, tool use comes
//! back as `tool_use` blocks, errors come in Anthropic's shape, the key may come as
//! `x-api-key`, and count_tokens matches what a request is charged.

use axum::body::Body;
use axum::http::{header, Request};
use serde_json::{json, Value};
use spindle_runner::ReasoningMode;

use crate::common::{
    body_text, post_json, replying, server, server_with, Reply, TestServer, MODEL,
};
use crate::errors::{with_api_key, API_KEY};

fn body(user: &str, max_tokens: u32) -> Value {
    json!({
        "model": MODEL,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": user}],
    })
}

/// The `(event, data)` pairs of a streamed response.
pub async fn post_events(server: &TestServer, path: &str, body: &Value) -> Vec<(String, Value)> {
    let response = server.send(post_json(path, body)).await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    let text = body_text(response).await;
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty() && !event.starts_with(':'))
        .map(|event| {
            let field = |name: &str| {
                event.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim_start().to_string())
            };
            let data = field("data:").unwrap_or_else(|| panic!("no data in {event:?}"));
            (
                field("event:").unwrap_or_else(|| panic!("no event line in {event:?}")),
                serde_json::from_str(&data).unwrap(),
            )
        })
        .collect()
}

/// A streamed message rebuilt by the client's rules, after checking the grammar: `message_start`,
/// `ping`, then blocks that open at the next index, take deltas of their own kind and close
/// before the next opens (a thinking block signed before it closes), then `message_delta`
/// and `message_stop`; every event line names its data's `type`.
struct Streamed {
    start: Value,
    content: Vec<Value>,
    stop_reason: Value,
    stop_sequence: Value,
    usage: Value,
}

fn read_stream(events: &[(String, Value)]) -> Streamed {
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    let start = events[0].1["message"].clone();
    assert_eq!(start["content"], json!([]));
    let mut out = Streamed {
        start,
        content: Vec::new(),
        stop_reason: Value::Null,
        stop_sequence: Value::Null,
        usage: Value::Null,
    };
    let mut open: Option<usize> = None;
    let mut partial_json = String::new();
    for (name, data) in events {
        assert_eq!(data["type"], name.as_str(), "{data}");
        let index = data["index"].as_u64().map(|i| i as usize);
        match name.as_str() {
            "content_block_start" => {
                assert_eq!((open, index), (None, Some(out.content.len())), "{names:?}");
                out.content.push(data["content_block"].clone());
                open = index;
                partial_json.clear();
            }
            "content_block_delta" => {
                assert_eq!(
                    index.filter(|_| open.is_some()),
                    open,
                    "a delta outside the open block: {names:?}"
                );
                let block = &mut out.content[index.unwrap()];
                let delta = &data["delta"];
                let append = |block: &mut Value, field: &str, more: &Value| {
                    block[field] = json!(format!(
                        "{}{}",
                        block[field].as_str().unwrap(),
                        more.as_str().unwrap()
                    ));
                };
                match (block["type"].as_str().unwrap(), delta["type"].as_str().unwrap()) {
                    ("text", "text_delta") => append(block, "text", &delta["text"]),
                    ("thinking", "thinking_delta") => append(block, "thinking", &delta["thinking"]),
                    ("thinking", "signature_delta") => {
                        append(block, "signature", &delta["signature"])
                    }
                    ("tool_use", "input_json_delta") => {
                        partial_json.push_str(delta["partial_json"].as_str().unwrap())
                    }
                    other => panic!("delta {other:?} on the wrong block"),
                }
            }
            "content_block_stop" => {
                assert_eq!(index.filter(|_| open.is_some()), open, "{names:?}");
                let block = &mut out.content[index.unwrap()];
                match block["type"].as_str().unwrap() {
                    "tool_use" if !partial_json.is_empty() => {
                        block["input"] = serde_json::from_str(&partial_json).unwrap()
                    }
                    "thinking" => {
                        assert!(
                            !block["signature"].as_str().unwrap().is_empty(),
                            "an unsigned thinking block"
                        )
                    }
                    _ => {}
                }
                open = None;
            }
            "message_delta" => {
                assert_eq!(open, None, "message_delta inside a block");
                out.stop_reason = data["delta"]["stop_reason"].clone();
                out.stop_sequence = data["delta"]["stop_sequence"].clone();
                out.usage = data["usage"].clone();
            }
            "message_start" | "ping" | "message_stop" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    out
}

fn usage_counts(usage: &Value) -> (u64, u64, u64) {
    let count =
        |field: &str| usage[field].as_u64().unwrap_or_else(|| panic!("no {field} in {usage}"));
    assert_eq!(count("cache_creation_input_tokens"), 0);
    (count("input_tokens"), count("cache_read_input_tokens"), count("output_tokens"))
}

fn assert_anthropic_error(
    status: u16,
    body: &Value,
    expected_status: u16,
    kind: &str,
    needle: &str,
) {
    assert_eq!(status, expected_status, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(needle),
        "{needle:?} not in {body}"
    );
}

#[tokio::test]
async fn a_text_answer_whole_and_streamed() {
    let server = replying("The capital of France is Paris.");
    let (status, whole) =
        server.post("/v1/messages?beta=true", &body("Capital of France?", 24)).await;
    assert_eq!(status, 200, "{whole}");
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"), "{whole}");
    assert_eq!(
        (&whole["type"], &whole["role"], &whole["model"]),
        (&json!("message"), &json!("assistant"), &json!(MODEL))
    );
    assert_eq!(
        whole["content"],
        json!([{"type": "text", "text": "The capital of France is Paris."}])
    );
    assert_eq!(whole["stop_reason"], "end_turn");
    assert_eq!(whole["stop_sequence"], Value::Null);
    let (input, cached, output) = usage_counts(&whole["usage"]);
    assert_eq!((input, cached), (server.engine.last().prompt_tokens as u64, 0));
    assert!(output > 3, "{whole}");

    let mut streaming = body("Capital of France?", 24);
    streaming["stream"] = json!(true);
    let streamed = read_stream(&post_events(&server, "/v1/messages", &streaming).await);
    assert_eq!(streamed.content, whole["content"].as_array().unwrap().clone());
    assert_eq!(streamed.stop_reason, whole["stop_reason"]);
    assert!(streamed.start["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(streamed.start["usage"]["input_tokens"].as_u64(), Some(input));
    assert_eq!(usage_counts(&streamed.usage), (input, cached, output));
}

#[tokio::test]
async fn max_tokens_ends_with_its_stop_reason() {
    let server = replying("one two three four five six");
    let (_, whole) = server.post("/v1/messages", &body("Count", 2)).await;
    assert_eq!(whole["stop_reason"], "max_tokens", "{whole}");
    assert_eq!(whole["usage"]["output_tokens"], 2);
}

#[tokio::test]
async fn sampling_fields_and_stop_sequences_reach_the_engine() {
    let server = replying("Ok.");
    let mut sampled = body("Hi", 4);
    sampled["temperature"] = json!(0.25);
    sampled["top_p"] = json!(0.5);
    sampled["top_k"] = json!(5);
    sampled["stop_sequences"] = json!(["END"]);
    // Accepted, and used for nothing.
    sampled["metadata"] = json!({"user_id": "u-1"});
    let (status, whole) = server.post("/v1/messages", &sampled).await;
    assert_eq!(status, 200, "{whole}");
    let seen = server.engine.last();
    assert_eq!((seen.temperature, seen.top_p, seen.top_k), (0.25, 0.5, 5));
    assert_eq!(
        (seen.stop_strings, seen.max_tokens, seen.top_logprobs),
        (vec!["END".into()], 4, None)
    );
}

#[tokio::test]
async fn a_stop_sequence_is_reported_by_name() {
    let server = replying("The capital of France is Paris, on the Seine.");
    let mut stopped = body("Capital?", 24);
    stopped["stop_sequences"] = json!(["never-said", "Paris"]);
    for stream in [false, true] {
        stopped["stream"] = json!(stream);
        let (content, stop_reason, stop_sequence) = if stream {
            let s = read_stream(&post_events(&server, "/v1/messages", &stopped).await);
            (s.content, s.stop_reason, s.stop_sequence)
        } else {
            let (status, whole) = server.post("/v1/messages", &stopped).await;
            assert_eq!(status, 200, "{whole}");
            (
                whole["content"].as_array().unwrap().clone(),
                whole["stop_reason"].clone(),
                whole["stop_sequence"].clone(),
            )
        };
        assert_eq!((stop_reason, stop_sequence), (json!("stop_sequence"), json!("Paris")));
        assert_eq!(content, vec![json!({"type": "text", "text": "The capital of France is "})]);
    }
}

/// The thinking block's text and the text block's, of a whole answer.
fn thinking_and_text(message: &Value) -> (Option<String>, String) {
    let content = message["content"].as_array().unwrap();
    let thinking = content.iter().find(|b| b["type"] == "thinking").map(|b| {
        assert!(!b["signature"].as_str().unwrap().is_empty(), "{message}");
        b["thinking"].as_str().unwrap().to_string()
    });
    let text = content
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect();
    if thinking.is_some() {
        assert_eq!(content[0]["type"], "thinking", "thinking comes first: {message}");
    }
    (thinking, text)
}

/// A model that thinks when the prompt leaves thinking on, as Qwen3 does, on a server that
/// thinks unless told not to.
pub fn thinker() -> TestServer {
    server_with(
        |seen| match seen.reasoning {
            ReasoningMode::Tagged { .. } => {
                Reply::text("<think>\nJapan's capital.\n</think>\n\nTokyo.")
            }
            ReasoningMode::Off => Reply::text("Tokyo."),
        },
        |config, _| config.thinking_default = true,
    )
}

#[tokio::test]
async fn thinking_follows_the_request_on_a_thinking_template() {
    let server = thinker();
    let send = |thinking: Option<Value>| {
        let server = server.clone();
        async move {
            let mut request = body("What is the capital of Japan?", 60);
            if let Some(thinking) = thinking {
                request["thinking"] = thinking;
            }
            let (status, message) = server.post("/v1/messages", &request).await;
            assert_eq!(status, 200, "{message}");
            message
        }
    };
    let default = send(None).await;
    assert_eq!(thinking_and_text(&default), (Some("Japan's capital.\n".into()), "Tokyo.".into()));
    let adaptive = send(Some(json!({"type": "adaptive"}))).await;
    assert_eq!(adaptive["content"], default["content"]);
    let disabled = send(Some(json!({"type": "disabled"}))).await;
    assert_eq!(thinking_and_text(&disabled), (None, "Tokyo.".into()));
    assert!(server.engine.last().prompt.ends_with("<think>\n\n</think>\n\n"));
    send(Some(json!({"type": "enabled", "budget_tokens": 3}))).await;
    assert_eq!(server.engine.last().reasoning_budget, Some(3));

    // Streamed: the thinking block is signed and closed before the text block opens.
    let mut streaming = body("What is the capital of Japan?", 60);
    streaming["stream"] = json!(true);
    let streamed = read_stream(&post_events(&server, "/v1/messages", &streaming).await);
    let types: Vec<&str> = streamed.content.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["thinking", "text"]);
    assert_eq!(streamed.content, default["content"].as_array().unwrap().clone());
}

#[tokio::test]
async fn output_config_effort_shares_out_max_tokens() {
    let server = thinker();
    for (effort, budget) in [("low", 25), ("medium", 50), ("high", 75)] {
        let mut request = body("Hi", 100);
        request["output_config"] = json!({"effort": effort});
        let (status, message) = server.post("/v1/messages", &request).await;
        assert_eq!(status, 200, "{message}");
        assert_eq!(server.engine.last().reasoning_budget, Some(budget), "{effort}");
    }
}

#[tokio::test]
async fn errors_come_in_anthropics_shape() {
    let server = replying("Hi.");
    let user = |content: Value| json!({"max_tokens": 8, "messages": [{"role": "user", "content": content}]});
    let cases = [
        (user(json!([{"type": "video", "url": "x"}])), 400, "invalid_request_error", "video"),
        (
            user(json!([{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}])),
            400,
            "invalid_request_error",
            "image",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
            400,
            "invalid_request_error",
            "invalid type",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"name": "get_time", "input_schema": {"type": "object"}}],
                   "tool_choice": {"type": "tool", "name": "get_weather"}}),
            400,
            "invalid_request_error",
            "get_weather",
        ),
        (
            json!({"model": "claude-opus-4", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
            404,
            "not_found_error",
            "claude-opus-4",
        ),
    ];
    for (request, status, kind, needle) in cases {
        let (got, response) = server.post("/v1/messages", &request).await;
        assert_anthropic_error(got, &response, status, kind, needle);
    }
    let (status, response) = server.post("/v1/messages/batches", &json!({})).await;
    assert_anthropic_error(status, &response, 404, "not_found_error", "/v1/messages/batches");
    // Server tools are ignored, not refused.
    let mut request = body("Hi", 2);
    request["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}, {"type": "bash_20250124", "name": "bash"}]);
    let (status, response) = server.post("/v1/messages", &request).await;
    assert_eq!(status, 200, "{response}");
}

#[tokio::test]
async fn the_pipelines_own_checks_name_the_field() {
    let server = replying("Hi.");
    let with = |extra: Value| {
        let mut request = body("hi", 8);
        request.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        request
    };
    let cases = [
        (with(json!({"max_tokens": 0})), "max_tokens must be at least 1"),
        (with(json!({"messages": []})), "messages must not be empty"),
        (with(json!({"temperature": 3.0})), "temperature"),
        (with(json!({"top_k": -2})), "top_k"),
        (with(json!({"stop_sequences": ["a", "b", "c", "d", "e"]})), "stop"),
    ];
    for (request, needle) in cases {
        let (status, response) = server.post("/v1/messages", &request).await;
        assert_anthropic_error(status, &response, 400, "invalid_request_error", needle);
    }
    assert!(server.engine.seen().is_empty(), "no refused request reaches the engine");
}

#[tokio::test]
async fn the_key_may_come_as_x_api_key() {
    let server = with_api_key();
    let request = body("Hi", 2);
    let send = |headers: Vec<(&'static str, String)>, path: &'static str| {
        let (server, request) = (server.clone(), request.clone());
        async move {
            let mut builder = Request::post(path).header(header::CONTENT_TYPE, "application/json");
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            server.send_json(builder.body(Body::from(request.to_string())).unwrap()).await
        }
    };
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let (status, response) = send(vec![], path).await;
        assert_anthropic_error(status, &response, 401, "authentication_error", "x-api-key");
        let (status, response) = send(vec![("x-api-key", "wrong".into())], path).await;
        assert_anthropic_error(status, &response, 401, "authentication_error", "x-api-key");
        let headers =
            vec![("x-api-key", API_KEY.into()), ("anthropic-beta", "whatever-2025".into())];
        let (status, response) = send(headers, path).await;
        assert_eq!(status, 200, "{response}");
        let (status, response) =
            send(vec![("authorization", format!("Bearer {API_KEY}"))], path).await;
        assert_eq!(status, 200, "{response}");
    }
    // The OpenAI routes keep their own error shape.
    let (status, response) = send(vec![], "/v1/chat/completions").await;
    assert_eq!((status, response["error"]["type"].as_str()), (401, Some("authentication_error")));
    assert!(response.get("type").is_none(), "{response}");
}

#[tokio::test]
async fn count_tokens_is_what_the_request_is_charged() {
    let server = replying("Marseille.");
    let mut request = body("Which city is larger, Lyon or Marseille?", 4);
    request["system"] = json!([{"type": "text", "text": "You are a geography teacher."}]);
    request["tools"] = json!([{"name": "lookup", "description": "Look a city up", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let (status, count) = server.post("/v1/messages/count_tokens", &request).await;
    assert_eq!(status, 200, "{count}");
    let (status, message) = server.post("/v1/messages", &request).await;
    assert_eq!(status, 200, "{message}");
    let (input, cached, _) = usage_counts(&message["usage"]);
    assert_eq!(count["input_tokens"].as_u64(), Some(input + cached), "{count} vs {message}");
    let messages = request["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Marseille."}));
    messages.push(json!({"role": "user", "content": "And Paris?"}));
    let (_, longer) = server.post("/v1/messages/count_tokens", &request).await;
    assert!(longer["input_tokens"].as_u64() > count["input_tokens"].as_u64(), "{longer}");
}

/// The `x-anthropic-billing-header:` line Claude Code puts first changes with every request;
/// the prompt the engine gets is the same without it.
#[tokio::test]
async fn claude_codes_billing_line_is_dropped_from_the_prompt() {
    let server = replying("9 am.");
    let request = |billing: &str| {
        let mut request = body("When does the museum open on Sundays?", 4);
        request["system"] = json!([
            {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.3.{billing}; cc_entrypoint=cli; cch={billing};")},
            {"type": "text", "text": "You are the museum's assistant.", "cache_control": {"type": "ephemeral"}},
        ]);
        request
    };
    server.post("/v1/messages", &request("a1f")).await;
    server.post("/v1/messages", &request("9c2")).await;
    let seen = server.engine.seen();
    assert_eq!(seen[0].prompt, seen[1].prompt);
    assert!(!seen[0].prompt.contains("billing"), "{}", seen[0].prompt);
    assert!(seen[0].prompt.starts_with("<|im_start|>system\nYou are the museum's assistant."));
}

#[tokio::test]
async fn the_root_answers_head_and_get() {
    let server = with_api_key();
    for request in [Request::head("/"), Request::get("/")] {
        let response = server.send(request.body(Body::empty()).unwrap()).await;
        assert_eq!(response.status(), 200);
    }
}

const WEATHER_CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

/// A forced call (`any`) whole and streamed, then the result sent back and a text answer.
#[tokio::test]
async fn a_tool_round_trip() {
    let server = server(|seen| {
        if seen.prompt.contains("<tool_response>") {
            Reply::text("It is sunny in Paris.")
        } else {
            Reply::text(WEATHER_CALL)
        }
    });
    let tools = json!([{
        "name": "get_weather",
        "description": "Current weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }]);
    let mut request = json!({
        "model": MODEL,
        "max_tokens": 40,
        "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools,
        "tool_choice": {"type": "any"},
        "thinking": {"type": "disabled"},
    });
    let (status, whole) = server.post("/v1/messages", &request).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["stop_reason"], "tool_use", "{whole}");
    assert!(server.engine.last().constrained, "a forced call is held to the tools' grammar");
    let content = whole["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{whole}");
    let call = &content[0];
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"), "{call}");
    assert_eq!((&call["type"], &call["name"]), (&json!("tool_use"), &json!("get_weather")));
    assert_eq!(call["input"], json!({"city": "Paris"}));

    request["stream"] = json!(true);
    let streamed = read_stream(&post_events(&server, "/v1/messages", &request).await);
    assert_eq!(streamed.stop_reason, "tool_use");
    let without_id = |block: &Value| {
        let mut block = block.clone();
        block.as_object_mut().unwrap().remove("id");
        block
    };
    assert_eq!(streamed.content.iter().map(without_id).collect::<Vec<_>>(), vec![without_id(call)]);

    request["stream"] = json!(false);
    request["tool_choice"] = json!({"type": "auto"});
    let messages = request["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "Sunny, 24 degrees Celsius."}]},
    ]}));
    let (status, answer) = server.post("/v1/messages", &request).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["stop_reason"], "end_turn");
    assert_eq!(answer["content"], json!([{"type": "text", "text": "It is sunny in Paris."}]));
    assert!(server.engine.last().prompt.contains("Sunny, 24 degrees Celsius."));
}
