//! Anthropic's Messages API on real models: whole and streamed answers carry the same blocks,
//! streams follow Anthropic's event grammar, thinking follows the request's switch and budget,
//! errors come in Anthropic's shape, the key may come as `x-api-key`, count_tokens matches what
//! a request is charged, Claude Code's per-request billing line does not defeat the prefix cache,
//! and a tool round trip works on Qwen2.5.

use crate::common;

use common::{client, post, server, Setup, API_KEY};
use serde_json::{json, Value};

const QUESTION: &str = "What is the capital of France? Answer in one sentence.";

fn body(user: &str, max_tokens: u32) -> Value {
    json!({
        "model": "smollm2-135m",
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": user}],
    })
}

/// The `(event, data)` pairs of a streamed response.
async fn post_events(base: &str, path: &str, body: &Value) -> Vec<(String, Value)> {
    let response = client().post(format!("{base}{path}")).json(body).send().await.unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    let text = response.text().await.unwrap();
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty())
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
    let base = server(Setup::Default);
    let (status, whole) = post(&base, "/v1/messages?beta=true", &body(QUESTION, 24)).await;
    assert_eq!(status, 200, "{whole}");
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"), "{whole}");
    assert_eq!(
        (&whole["type"], &whole["role"], &whole["model"]),
        (&json!("message"), &json!("assistant"), &json!("smollm2-135m"))
    );
    let content = whole["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{whole}");
    assert_eq!(content[0]["type"], "text");
    assert!(content[0]["text"].as_str().unwrap().contains("Paris"), "{whole}");
    assert!(whole["stop_reason"] == "end_turn" || whole["stop_reason"] == "max_tokens", "{whole}");
    assert_eq!(whole["stop_sequence"], Value::Null);
    let (input, cached, output) = usage_counts(&whole["usage"]);
    assert!(input + cached > 10 && output > 0 && output <= 24, "{whole}");

    let mut streaming = body(QUESTION, 24);
    streaming["stream"] = json!(true);
    let streamed = read_stream(&post_events(&base, "/v1/messages", &streaming).await);
    assert_eq!(streamed.content, whole["content"].as_array().unwrap().clone());
    assert_eq!(streamed.stop_reason, whole["stop_reason"]);
    assert!(streamed.start["id"].as_str().unwrap().starts_with("msg_"));
    // Claude Code reads input_tokens from message_start; the prompt is the same one.
    assert_eq!(streamed.start["usage"]["input_tokens"].as_u64(), Some(input + cached));
    let (s_input, s_cached, s_output) = usage_counts(&streamed.usage);
    assert_eq!((s_input + s_cached, s_output), (input + cached, output));
}

#[tokio::test]
async fn a_stop_sequence_is_reported_by_name() {
    let base = server(Setup::Default);
    let (_, free) = post(&base, "/v1/messages", &body(QUESTION, 24)).await;
    let text = free["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{free}");
    let mut stopped = body(QUESTION, 24);
    stopped["stop_sequences"] = json!(["never-said", "Paris"]);
    for stream in [false, true] {
        stopped["stream"] = json!(stream);
        let (content, stop_reason, stop_sequence) = if stream {
            let s = read_stream(&post_events(&base, "/v1/messages", &stopped).await);
            (s.content, s.stop_reason, s.stop_sequence)
        } else {
            let (status, whole) = post(&base, "/v1/messages", &stopped).await;
            assert_eq!(status, 200, "{whole}");
            (
                whole["content"].as_array().unwrap().clone(),
                whole["stop_reason"].clone(),
                whole["stop_sequence"].clone(),
            )
        };
        assert_eq!(
            (stop_reason, stop_sequence),
            (json!("stop_sequence"), json!("Paris")),
            "stream {stream}"
        );
        let before = text.split("Paris").next().unwrap().trim_start();
        assert_eq!(
            content.first().map_or("", |b| b["text"].as_str().unwrap()),
            before,
            "stream {stream}"
        );
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

#[tokio::test]
async fn thinking_follows_the_request_on_a_thinking_template() {
    let base = server(Setup::Thinking);
    let question = "What is the capital of Japan?";
    let send = |thinking: Option<Value>| {
        let base = base.clone();
        async move {
            let mut request = body(question, 60);
            if let Some(thinking) = thinking {
                request["thinking"] = thinking;
            }
            let (status, message) = post(&base, "/v1/messages", &request).await;
            assert_eq!(status, 200, "{message}");
            message
        }
    };
    // Absent: the server's default, which is on here.
    let default = send(None).await;
    let (default_thinking, default_text) = thinking_and_text(&default);
    let default_thinking = default_thinking.expect("the server thinks by default");
    assert!(!default_text.is_empty());
    let (adaptive, _) = thinking_and_text(&send(Some(json!({"type": "adaptive"}))).await);
    assert_eq!(adaptive.as_deref(), Some(default_thinking.as_str()));

    let disabled = send(Some(json!({"type": "disabled"}))).await;
    let (none, text) = thinking_and_text(&disabled);
    assert_eq!(none, None, "{disabled}");
    assert!(!text.is_empty(), "{disabled}");

    // A budget of 3 tokens: the same reasoning the chat endpoint gives with thinking_budget 3.
    let budgeted = send(Some(json!({"type": "enabled", "budget_tokens": 3}))).await;
    let (thinking, text) = thinking_and_text(&budgeted);
    let thinking = thinking.expect("thinking is on");
    let mut chat = body(question, 60);
    chat["thinking_budget"] = json!(3);
    let (_, reference) = post(&base, "/v1/chat/completions", &chat).await;
    let message = &reference["choices"][0]["message"];
    assert_eq!(
        thinking,
        message["reasoning_content"].as_str().unwrap().trim_start(),
        "{budgeted}\n{reference}"
    );
    assert_eq!(text, message["content"].as_str().unwrap().trim_start());
    assert!(thinking.len() < default_thinking.len(), "the budget did not bind: {budgeted}");

    // Streamed: the thinking block is signed and closed before the text block opens.
    let mut streaming = body(question, 60);
    streaming["stream"] = json!(true);
    let streamed = read_stream(&post_events(&base, "/v1/messages", &streaming).await);
    let types: Vec<&str> = streamed.content.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["thinking", "text"]);
    assert_eq!(
        streamed.content,
        default["content"].as_array().unwrap().clone(),
        "signatures included"
    );
}

#[tokio::test]
async fn errors_come_in_anthropics_shape() {
    let base = server(Setup::Default);
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
        let (got, response) = post(&base, "/v1/messages", &request).await;
        assert_anthropic_error(got, &response, status, kind, needle);
    }
    let (status, response) = post(&base, "/v1/messages/batches", &json!({})).await;
    assert_anthropic_error(status, &response, 404, "not_found_error", "/v1/messages/batches");
    // Server tools are ignored, not refused.
    let mut request = body("Hi", 2);
    request["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}, {"type": "bash_20250124", "name": "bash"}]);
    let (status, response) = post(&base, "/v1/messages", &request).await;
    assert_eq!(status, 200, "{response}");
}

#[tokio::test]
async fn the_key_may_come_as_x_api_key() {
    let base = server(Setup::ApiKey);
    let request = body("Hi", 2);
    let send = |headers: Vec<(&'static str, String)>, path: &'static str| {
        let (base, request) = (base.clone(), request.clone());
        async move {
            let mut builder = client().post(format!("{base}{path}")).json(&request);
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            let response = builder.send().await.unwrap();
            let status = response.status().as_u16();
            (status, serde_json::from_str::<Value>(&response.text().await.unwrap()).unwrap())
        }
    };
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let (status, response) = send(vec![], path).await;
        assert_anthropic_error(status, &response, 401, "authentication_error", "x-api-key");
        let (status, response) = send(vec![("x-api-key", "wrong".into())], path).await;
        assert_anthropic_error(status, &response, 401, "authentication_error", "x-api-key");
        let (status, response) = send(
            vec![("x-api-key", API_KEY.into()), ("anthropic-beta", "whatever-2025".into())],
            path,
        )
        .await;
        assert_eq!(status, 200, "{response}");
        let (status, response) =
            send(vec![("authorization", format!("Bearer {API_KEY}"))], path).await;
        assert_eq!(status, 200, "{response}");
    }
    // The OpenAI routes keep their own error shape.
    let (status, response) = send(vec![], "/v1/chat/completions").await;
    assert_eq!(
        (status, response["error"]["type"].as_str()),
        (401, Some("authentication_error")),
        "{response}"
    );
    assert!(response.get("type").is_none(), "{response}");
}

#[tokio::test]
async fn count_tokens_is_what_the_request_is_charged() {
    let base = server(Setup::Default);
    let mut request = body("Which city is larger, Lyon or Marseille?", 4);
    request["system"] = json!([{"type": "text", "text": "You are a geography teacher."}]);
    request["tools"] = json!([{"name": "lookup", "description": "Look a city up", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let (status, count) = post(&base, "/v1/messages/count_tokens", &request).await;
    assert_eq!(status, 200, "{count}");
    let (status, message) = post(&base, "/v1/messages", &request).await;
    assert_eq!(status, 200, "{message}");
    let (input, cached, _) = usage_counts(&message["usage"]);
    assert_eq!(count["input_tokens"].as_u64(), Some(input + cached), "{count} vs {message}");
    // A longer conversation counts more.
    request["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "Marseille."}));
    request["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "And Paris?"}));
    let (_, longer) = post(&base, "/v1/messages/count_tokens", &request).await;
    assert!(longer["input_tokens"].as_u64() > count["input_tokens"].as_u64(), "{longer}");
}

#[tokio::test]
async fn claude_codes_billing_line_does_not_defeat_the_prefix_cache() {
    let base = server(Setup::Default);
    let mut system =
        String::from("You are the assistant of the Musée des Confluences in Lyon. Rules:\n");
    for i in 1..=30 {
        system.push_str(&format!(
            "{i}. Answer visitors' question number {i} about exhibits, tickets and opening hours briefly.\n"
        ));
    }
    let request = |billing: &str| {
        let mut request = body("When does the museum open on Sundays?", 4);
        request["system"] = json!([
            {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.3.{billing}; cc_entrypoint=cli; cch={billing};")},
            {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}},
        ]);
        request
    };
    let rendered = format!("<|im_start|>system\n{system}<|im_end|>\n");
    let (_, tokens) =
        post(&base, "/v1/tokenize", &json!({"prompt": rendered, "add_special_tokens": false}))
            .await;
    let system_tokens = tokens["count"].as_u64().unwrap();
    let (_, first) = post(&base, "/v1/messages", &request("a1f")).await;
    let (_, first_cached, _) = usage_counts(&first["usage"]);
    // Other tests' prompts on this server share at most the opening words.
    assert!(first_cached < 16, "the first request should read its system prompt: {first}");
    let (_, second) = post(&base, "/v1/messages", &request("9c2")).await;
    let (_, cached, _) = usage_counts(&second["usage"]);
    assert!(
        cached >= system_tokens,
        "{cached} cached tokens do not cover the {system_tokens}-token system prompt: {second}"
    );
}

#[tokio::test]
async fn the_root_answers_head_and_get() {
    let base = server(Setup::ApiKey);
    for method in [reqwest::Method::HEAD, reqwest::Method::GET] {
        let response = client().request(method.clone(), format!("{base}/")).send().await.unwrap();
        assert_eq!(response.status(), 200, "{method}");
    }
}

/// Qwen2.5 with one tool: a forced call (`any`), then the result sent back, then a text answer;
/// the streamed call is the whole one.
#[tokio::test]
async fn a_tool_round_trip_on_qwen() {
    let base = server(Setup::Qwen);
    let tools = json!([{
        "name": "get_weather",
        "description": "Current weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }]);
    let mut request = json!({
        "model": "qwen2.5-coder-0.5b",
        "max_tokens": 40,
        "temperature": 0,
        "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools,
        "tool_choice": {"type": "any"},
    });
    let (status, whole) = post(&base, "/v1/messages", &request).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["stop_reason"], "tool_use", "{whole}");
    let content = whole["content"].as_array().unwrap();
    let call = content
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use: {whole}"));
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"), "{call}");
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["city"].as_str().unwrap().contains("Paris"), "{call}");

    request["stream"] = json!(true);
    let streamed = read_stream(&post_events(&base, "/v1/messages", &request).await);
    assert_eq!(streamed.stop_reason, "tool_use");
    let without_ids = |blocks: &[Value]| -> Vec<Value> {
        blocks
            .iter()
            .map(|b| {
                let mut b = b.clone();
                b.as_object_mut().unwrap().remove("id");
                b
            })
            .collect()
    };
    assert_eq!(without_ids(&streamed.content), without_ids(content));

    request["stream"] = json!(false);
    // `none`, as the chat round trip does: Qwen2.5-0.5B would otherwise call again.
    request["tool_choice"] = json!({"type": "none"});
    request["max_tokens"] = json!(30);
    let messages = request["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "Sunny, 24 degrees Celsius."}]},
    ]}));
    let (status, answer) = post(&base, "/v1/messages", &request).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["stop_reason"] == "end_turn" || answer["stop_reason"] == "max_tokens",
        "{answer}"
    );
    let text = answer["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text: {answer}"));
    assert!(!text.trim().is_empty() && !text.contains("<tool_call>"), "{answer}");
    assert_eq!(answer["content"].as_array().unwrap().len(), 1, "{answer}");
}
