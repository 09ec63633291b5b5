//! The Responses API (`/v1/responses`) on real models: input items read as the chat messages
//! they stand for, the typed event stream and its whole twin, stored conversations continued by
//! `previous_response_id`, tools (flat, namespaced, hosted ones ignored) and structured output
//! on Qwen2.5, errors naming the field, and the official `openai` Python client unchanged.

use crate::common;

use common::{client, post, python_with, run_python_script, server, Setup};
use serde_json::{json, Value};

const QWEN: &str = "qwen2.5-coder-0.5b";

async fn get(base: &str, path: &str) -> (u16, Value) {
    let response = client().get(format!("{base}{path}")).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn delete(base: &str, path: &str) -> (u16, Value) {
    let response = client().delete(format!("{base}{path}")).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// A created response, checked to be one.
async fn create(base: &str, body: &Value) -> Value {
    let (status, response) = post(base, "/v1/responses", body).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["object"], "response", "{response}");
    assert!(response["id"].as_str().is_some_and(|id| id.starts_with("resp_")), "{response}");
    let usage = &response["usage"];
    assert_eq!(
        usage["total_tokens"],
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );
    response
}

/// The text of the response's message items.
fn output_text(response: &Value) -> String {
    let items = response["output"].as_array().unwrap();
    let messages = items.iter().filter(|item| item["type"] == "message");
    messages
        .flat_map(|m| {
            assert_eq!(m["role"], "assistant");
            m["content"].as_array().unwrap().iter().map(|part| {
                assert_eq!(part["type"], "output_text");
                assert_eq!(part["annotations"], json!([]));
                part["text"].as_str().unwrap().to_string()
            })
        })
        .collect()
}

/// Content and prompt tokens of the chat completion for `messages`, for comparison.
async fn chat(base: &str, messages: Value, max_tokens: u32) -> (String, u64) {
    let body = json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0});
    let (status, answer) = post(base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    (
        answer["choices"][0]["message"]["content"].as_str().unwrap().to_string(),
        answer["usage"]["prompt_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn a_string_input_is_one_user_message() {
    let base = server(Setup::Default);
    let question = "What is the capital of France? Answer in one sentence.";
    let response =
        create(&base, &json!({"input": question, "max_output_tokens": 32, "temperature": 0})).await;
    let (text, prompt_tokens) =
        chat(&base, json!([{"role": "user", "content": question}]), 32).await;
    assert_eq!(output_text(&response), text);
    assert!(text.contains("Paris"), "{response}");
    assert_eq!(response["usage"]["input_tokens"], prompt_tokens);
    assert!(response["usage"]["output_tokens"].as_u64().unwrap() < 32, "{response}");
    let message = &response["output"][0];
    assert!(
        message["id"].as_str().unwrap().starts_with("msg_") && message["status"] == "completed",
        "{response}"
    );
    assert_eq!(response["status"], "completed");
    assert_eq!(response["incomplete_details"], Value::Null);
}

#[tokio::test]
async fn instructions_and_system_roles_lead_as_one_system_message() {
    let base = server(Setup::Default);
    let body = json!({
        "instructions": "You are a terse geography assistant.",
        "input": [
            {"role": "developer", "content": "Answer in one sentence."},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Never use lists."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Where is Rome?"}]},
        ],
        "max_output_tokens": 20,
        "temperature": 0,
    });
    let response = create(&base, &body).await;
    let system =
        "You are a terse geography assistant.\n\nAnswer in one sentence.\n\nNever use lists.";
    let (text, prompt_tokens) =
        chat(&base, json!([{"role": "system", "content": system}, {"role": "user", "content": "Where is Rome?"}]), 20)
            .await;
    assert_eq!(output_text(&response), text);
    assert_eq!(response["usage"]["input_tokens"], prompt_tokens);
    assert_eq!(response["instructions"], body["instructions"]);
}

/// The frames of an SSE body as (event name, data JSON).
async fn stream_events(base: &str, body: &Value) -> Vec<(String, Value)> {
    let response = client().post(format!("{base}/v1/responses")).json(body).send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    text.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .map(|frame| {
            let field = |name: &str| {
                frame.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim_start().to_string())
            };
            let data: Value = serde_json::from_str(&field("data:").unwrap()).unwrap();
            (field("event:").unwrap_or_default(), data)
        })
        .collect()
}

/// Checks the framing every stream shares: names match types, numbers count up from 0, items
/// never interleave and each closes with the item the completed response holds. Returns the
/// event types with runs of deltas folded into one, and the final response.
fn check_stream(events: &[(String, Value)]) -> (Vec<String>, Value) {
    let mut kinds: Vec<String> = Vec::new();
    let mut done_items = Vec::new();
    let mut open: Option<(u64, String)> = None;
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(name, data["type"].as_str().unwrap(), "{data}");
        assert_eq!(data["sequence_number"], i as u64, "{data}");
        if kinds.last() != Some(name) || !name.ends_with(".delta") {
            kinds.push(name.clone());
        }
        match name.as_str() {
            "response.output_item.added" => {
                assert!(open.is_none(), "items interleave: {data}");
                assert_eq!(data["output_index"], done_items.len() as u64);
                assert_eq!(data["item"]["status"], "in_progress");
                open = Some((
                    done_items.len() as u64,
                    data["item"]["id"].as_str().unwrap().to_string(),
                ));
            }
            "response.output_item.done" => {
                let (index, id) = open.take().expect("done without added");
                assert_eq!(
                    (data["output_index"].as_u64().unwrap(), data["item"]["id"].as_str().unwrap()),
                    (index, id.as_str())
                );
                done_items.push(data["item"].clone());
            }
            "response.created" | "response.in_progress" => {
                assert_eq!(data["response"]["status"], "in_progress")
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                assert_eq!(i, events.len() - 1)
            }
            _ => {
                let (index, id) = open.as_ref().expect("an item event outside an item");
                assert_eq!(
                    (&data["output_index"].as_u64().unwrap(), data["item_id"].as_str().unwrap()),
                    (index, id.as_str())
                );
            }
        }
    }
    let last = events.last().unwrap().1["response"].clone();
    assert_eq!(
        last["output"],
        Value::Array(done_items),
        "the final response holds other items than the stream closed"
    );
    (kinds, last)
}

fn strings(kinds: &[&str]) -> Vec<String> {
    kinds.iter().map(|k| format!("response.{k}")).collect()
}

#[tokio::test]
async fn a_stream_sends_reasoning_then_text_as_typed_events_and_matches_the_whole_response() {
    let base = server(Setup::Thinking);
    let mut body = json!({"input": "What is the capital of Japan?", "max_output_tokens": 50, "temperature": 0});
    let whole = create(&base, &body).await;
    body["stream"] = json!(true);
    let (kinds, last) = check_stream(&stream_events(&base, &body).await);
    let end = format!(
        "response.{}",
        if last["status"] == "completed" { "completed" } else { "incomplete" }
    );
    let mut golden = strings(&[
        "created",
        "in_progress",
        "output_item.added",
        "reasoning_text.delta",
        "reasoning_text.done",
        "output_item.done",
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
    ]);
    golden.push(end);
    assert_eq!(kinds, golden);
    // Same items as the whole response, but for the ids that name each response.
    let without_ids = |r: &Value| {
        let mut items = r["output"].as_array().unwrap().clone();
        items.iter_mut().for_each(|item| item["id"] = Value::Null);
        items
    };
    assert_eq!(without_ids(&last), without_ids(&whole));
    // The repeat reads its prompt from the cache; everything else counts the same.
    let counts = |r: &Value| {
        [
            &r["usage"]["input_tokens"],
            &r["usage"]["output_tokens"],
            &r["usage"]["output_tokens_details"],
        ]
        .map(Value::clone)
    };
    assert_eq!(counts(&last), counts(&whole));
    let reasoning = &whole["output"][0];
    assert!(
        reasoning["type"] == "reasoning" && reasoning["id"].as_str().unwrap().starts_with("rs_"),
        "{whole}"
    );
    assert_eq!(reasoning["summary"], json!([]));
    assert_eq!(reasoning["content"][0]["type"], "reasoning_text");
    assert!(
        whole["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() > 0,
        "{whole}"
    );
}

#[tokio::test]
async fn reasoning_effort_none_turns_thinking_off() {
    let base = server(Setup::Thinking);
    let body = json!({"input": "What is the capital of Japan?", "reasoning": {"effort": "none"}, "max_output_tokens": 24, "temperature": 0});
    let response = create(&base, &body).await;
    let kinds: Vec<&Value> =
        response["output"].as_array().unwrap().iter().map(|item| &item["type"]).collect();
    assert_eq!(kinds, [&json!("message")], "{response}");
    assert_eq!(response["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(response["reasoning"]["effort"], "none");
}

#[tokio::test]
async fn a_quiet_stream_repeats_in_progress_while_the_prompt_is_read() {
    let base = server(Setup::KeepAlive);
    // About 1,700 tokens: seconds of prefill on 2 cores, many keep-alive intervals.
    let long: String = (0..110)
        .map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog. "))
        .collect();
    let body = json!({"input": long, "max_output_tokens": 4, "temperature": 0, "stream": true, "store": false});
    let events = stream_events(&base, &body).await;
    let (kinds, last) = check_stream(&events);
    let first_item = kinds.iter().position(|k| k == "response.output_item.added").unwrap();
    let beats = kinds[..first_item].iter().filter(|k| *k == "response.in_progress").count();
    assert!(beats > 2, "{kinds:?}");
    assert_eq!(kinds[0], "response.created");
    assert_eq!(last["status"], "incomplete");
}

#[tokio::test]
async fn the_output_limit_leaves_an_incomplete_response() {
    let base = server(Setup::Default);
    let body = json!({"input": "Write a long story about a dragon.", "max_output_tokens": 3, "temperature": 0});
    let response = create(&base, &body).await;
    assert_eq!(response["status"], "incomplete", "{response}");
    assert_eq!(response["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(response["usage"]["output_tokens"], 3);
    assert_eq!(response["output"][0]["status"], "incomplete", "{response}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, last) = check_stream(&stream_events(&base, &streamed).await);
    assert_eq!(last["status"], "incomplete");
}

#[tokio::test]
async fn previous_response_id_continues_the_stored_conversation() {
    let base = server(Setup::Default);
    let first_input = "My name is Ada and I like tea.";
    let first =
        create(&base, &json!({"input": first_input, "max_output_tokens": 12, "temperature": 0}))
            .await;
    assert_eq!(first["store"], true);
    let body = json!({"previous_response_id": first["id"], "input": "What is my name?", "max_output_tokens": 12, "temperature": 0});
    let second = create(&base, &body).await;
    assert_eq!(second["previous_response_id"], first["id"]);
    // The second prompt is the first exchange plus the new question, its start read from cache.
    let messages = json!([
        {"role": "user", "content": first_input},
        {"role": "assistant", "content": output_text(&first)},
        {"role": "user", "content": "What is my name?"},
    ]);
    let (text, prompt_tokens) = chat(&base, messages, 12).await;
    assert_eq!(second["usage"]["input_tokens"], prompt_tokens);
    assert_eq!(output_text(&second), text);
    let first_total = first["usage"]["input_tokens"].as_u64().unwrap()
        + first["usage"]["output_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > first_total, "{second}");
    assert!(
        second["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0,
        "{second}"
    );

    let path = format!("/v1/responses/{}", first["id"].as_str().unwrap());
    assert_eq!(get(&base, &path).await, (200, first.clone()));
    let (status, deleted) = delete(&base, &path).await;
    assert_eq!(
        (status, &deleted),
        (200, &json!({"object": "response.deleted", "id": first["id"], "deleted": true}))
    );
    assert_eq!(get(&base, &path).await.0, 404);
}

#[tokio::test]
async fn unknown_and_unstored_ids_are_404s() {
    let base = server(Setup::Default);
    let (status, error) = get(&base, "/v1/responses/resp_nope").await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["type"], "not_found_error");
    let (status, error) =
        post(&base, "/v1/responses", &json!({"previous_response_id": "resp_nope", "input": "Hi"}))
            .await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["code"], "previous_response_not_found");
    assert_eq!(error["error"]["param"], "previous_response_id");

    let unstored =
        create(&base, &json!({"input": "Hi", "max_output_tokens": 4, "store": false})).await;
    assert_eq!(unstored["store"], false);
    let id = unstored["id"].as_str().unwrap();
    assert_eq!(get(&base, &format!("/v1/responses/{id}")).await.0, 404);
    let (status, _) =
        post(&base, "/v1/responses", &json!({"previous_response_id": id, "input": "Hi"})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn hosted_and_freeform_tools_are_ignored_and_echoed() {
    let base = server(Setup::Default);
    let tools = json!([
        {"type": "web_search"},
        {"type": "image_generation"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "local_shell"},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1"},
        {"type": "tool_search"},
    ]);
    let body = json!({"input": "What is the capital of France?", "tools": tools, "max_output_tokens": 24, "temperature": 0});
    let response = create(&base, &body).await;
    assert_eq!(response["tools"], tools);
    let (text, prompt_tokens) =
        chat(&base, json!([{"role": "user", "content": "What is the capital of France?"}]), 24)
            .await;
    assert_eq!(
        (output_text(&response), response["usage"]["input_tokens"].as_u64().unwrap()),
        (text, prompt_tokens)
    );
}

#[tokio::test]
async fn bad_requests_are_400s_naming_the_field() {
    let base = server(Setup::Default);
    let user = json!({"role": "user", "content": "Hi"});
    let cases = [
        (json!({"input": [{"type": "bogus"}]}), "input[0].type"),
        (
            json!({"input": [user, {"role": "user", "content": [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "data:,"}]}]}),
            "input[1].content[1].type",
        ),
        (json!({"input": [{"role": "tool", "content": "x"}]}), "input[0].role"),
        (json!({"input": [{"type": "function_call_output", "output": "x"}]}), "input[0]"),
        (json!({"input": [], "instructions": null}), "input"),
        (json!({"input": [user], "max_output_tokens": 0}), "max_output_tokens"),
        (json!({"input": [user], "text": {"format": {"type": "xml"}}}), "text.format.type"),
        (
            json!({"input": [user], "text": {"format": {"type": "json_schema", "name": "x"}}}),
            "text.format.schema",
        ),
        (json!({"input": [user], "reasoning": {"effort": "extreme"}}), "reasoning.effort"),
        (
            json!({"input": [user], "tools": [{"type": "function", "description": "no name"}]}),
            "tools[0].name",
        ),
        (
            json!({"input": [user], "tool_choice": {"type": "function", "name": "nope"}}),
            "tool_choice",
        ),
    ];
    for (body, param) in cases {
        let (status, error) = post(&base, "/v1/responses", &body).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["param"], param, "{body}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }
    let response =
        client().post(format!("{base}/v1/responses")).body("{not json").send().await.unwrap();
    assert_eq!(response.status(), 400);
}

fn weather_tool() -> Value {
    json!({
        "type": "function",
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": true,
    })
}

fn crm_namespace() -> Value {
    json!({
        "type": "namespace",
        "name": "crm",
        "description": "Customer records",
        "tools": [{
            "type": "function",
            "name": "get_customer",
            "description": "Look up a customer by email",
            "parameters": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]},
        }],
    })
}

/// The function calls of a response, checked: a call id to answer, a JSON object of arguments.
fn calls(response: &Value) -> Vec<Value> {
    let calls: Vec<Value> = response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .cloned()
        .collect();
    for call in &calls {
        assert!(
            call["call_id"].as_str().is_some_and(|id| id.starts_with("call_") && id.len() > 5),
            "{call}"
        );
        assert!(
            call["id"].as_str().unwrap().starts_with("fc_") && call["status"] == "completed",
            "{call}"
        );
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert!(arguments.is_object(), "{call}");
    }
    calls
}

#[tokio::test]
async fn a_tool_round_trip_streamed_and_whole_makes_the_same_call_then_answers() {
    let base = server(Setup::Qwen);
    let question = json!({"role": "user", "content": "What's the weather in Paris?"});
    let mut body = json!({
        "model": QWEN,
        "input": [question],
        "tools": [weather_tool(), {"type": "web_search"}],
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "max_output_tokens": 40,
        "temperature": 0,
    });
    let whole = create(&base, &body).await;
    let whole_calls = calls(&whole);
    assert_eq!(whole_calls.len(), 1, "{whole}");
    assert_eq!(whole_calls[0]["name"], "get_weather");
    assert!(whole_calls[0].get("namespace").is_none(), "{whole}");
    body["stream"] = json!(true);
    let events = stream_events(&base, &body).await;
    let (kinds, last) = check_stream(&events);
    assert!(
        kinds.windows(3).any(|w| w
            == strings(&[
                "output_item.added",
                "function_call_arguments.delta",
                "function_call_arguments.done"
            ])),
        "{kinds:?}"
    );
    let fields = |c: &Value| (c["name"].clone(), c["arguments"].clone());
    assert_eq!(
        calls(&last).iter().map(fields).collect::<Vec<_>>(),
        whole_calls.iter().map(fields).collect::<Vec<_>>()
    );

    let call = &whole_calls[0];
    let body = json!({
        "model": QWEN,
        "input": [
            question,
            {"type": "function_call", "call_id": call["call_id"], "name": call["name"], "arguments": call["arguments"]},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "{\"sky\": \"sunny\", \"celsius\": 21}"},
        ],
        "tools": [weather_tool()],
        "max_output_tokens": 40,
        "temperature": 0,
    });
    let answer = create(&base, &body).await;
    assert!(calls(&answer).is_empty(), "{answer}");
    let text = output_text(&answer);
    assert!(!text.trim().is_empty() && !text.contains("<tool_call>"), "{answer}");
}

#[tokio::test]
async fn a_namespaced_tool_call_comes_back_under_its_namespace() {
    let base = server(Setup::Qwen);
    let body = json!({
        "model": QWEN,
        "input": "Find the customer ada@example.com.",
        "tools": [crm_namespace()],
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "max_output_tokens": 40,
        "temperature": 0,
    });
    let response = create(&base, &body).await;
    let calls = calls(&response);
    assert_eq!(calls.len(), 1, "{response}");
    assert_eq!(
        (&calls[0]["name"], &calls[0]["namespace"]),
        (&json!("get_customer"), &json!("crm")),
        "{response}"
    );
    // Replayed with its namespace, the call reads back as the model wrote it.
    let replay = json!({
        "model": QWEN,
        "input": [
            {"role": "user", "content": "Find the customer ada@example.com."},
            calls[0],
            {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "{\"name\": \"Ada\"}"},
        ],
        "tools": [crm_namespace()],
        "tool_choice": "none",
        "max_output_tokens": 1,
    });
    create(&base, &replay).await;
}

#[tokio::test]
async fn a_json_schema_text_format_shapes_the_answer() {
    let base = server(Setup::Qwen);
    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"],
        "additionalProperties": false,
    });
    let body = json!({
        "model": QWEN,
        "input": "Name a large city and its country, as JSON.",
        "text": {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": true}},
        "max_output_tokens": 40,
        "temperature": 0,
    });
    let response = create(&base, &body).await;
    assert_eq!(response["status"], "completed", "{response}");
    let text = output_text(&response);
    let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let object = answer.as_object().unwrap();
    assert_eq!(object.len(), 2, "{text}");
    assert!(object["city"].is_string() && object["country"].is_string(), "{text}");
    assert_eq!(response["text"]["format"]["name"], "place");
}

#[test]
fn the_official_openai_python_client_reads_responses_unchanged() {
    let python = python_with("from openai.resources import responses", "openai>=1.66");
    let base = server(Setup::Default);
    run_python_script(&python, "openai_responses.py", &[base]);
}
