//! The Responses API (`/v1/responses`): input items read as the chat messages they stand for,
//! the typed event stream and its whole twin, stored conversations continued by
//! `previous_response_id`, tools (flat, namespaced, hosted ones ignored), structured output,
//! and errors naming the field.

use axum::body::Body;
use axum::http::Request;
use serde_json::{json, Value};
use spindle_runner::ReasoningMode;

use crate::common::{replying, server, server_with, Reply, TestServer};
use crate::messages::{post_events, thinker};

/// A created response, checked to be one.
async fn create(server: &TestServer, body: &Value) -> Value {
    let (status, response) = server.post("/v1/responses", body).await;
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

/// The prompt the chat endpoint renders for `messages`.
async fn chat_prompt(server: &TestServer, messages: Value) -> String {
    let body = json!({"messages": messages, "max_tokens": 4});
    let (status, answer) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    server.engine.last().prompt
}

async fn stream_events(server: &TestServer, body: &Value) -> Vec<(String, Value)> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    post_events(server, "/v1/responses", &body).await
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
async fn a_string_input_is_one_user_message() {
    let server = replying("Paris.");
    let question = "What is the capital of France?";
    let response = create(&server, &json!({"input": question, "max_output_tokens": 32})).await;
    let prompt = server.engine.last();
    assert_eq!(
        prompt.prompt,
        chat_prompt(&server, json!([{"role": "user", "content": question}])).await
    );
    assert_eq!(output_text(&response), "Paris.");
    assert_eq!(response["usage"]["input_tokens"], prompt.prompt_tokens);
    let message = &response["output"][0];
    assert!(
        message["id"].as_str().unwrap().starts_with("msg_") && message["status"] == "completed"
    );
    assert_eq!(response["status"], "completed");
    assert_eq!(response["incomplete_details"], Value::Null);
}

#[tokio::test]
async fn sampling_fields_and_the_output_limit_reach_the_engine() {
    let server = replying("Ok.");
    let body = json!({"input": "Hi", "max_output_tokens": 6, "temperature": 0.25, "top_p": 0.5,
                      "top_k": 7, "seed": 3, "stop": ["END"]});
    create(&server, &body).await;
    let seen = server.engine.last();
    assert_eq!((seen.temperature, seen.top_p, seen.top_k, seen.seed), (0.25, 0.5, 7, Some(3)));
    assert_eq!((seen.stop_strings, seen.max_tokens), (vec!["END".into()], 6));
}

#[tokio::test]
async fn instructions_and_system_roles_lead_as_one_system_message() {
    let server = replying("In Italy.");
    let body = json!({
        "instructions": "You are a terse geography assistant.",
        "input": [
            {"role": "developer", "content": "Answer in one sentence."},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Never use lists."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Where is Rome?"}]},
        ],
        "max_output_tokens": 20,
    });
    let response = create(&server, &body).await;
    let prompt = server.engine.last().prompt;
    let system =
        "You are a terse geography assistant.\n\nAnswer in one sentence.\n\nNever use lists.";
    let expected = chat_prompt(&server, json!([{"role": "system", "content": system}, {"role": "user", "content": "Where is Rome?"}])).await;
    assert_eq!(prompt, expected);
    assert_eq!(response["instructions"], body["instructions"]);
}

#[tokio::test]
async fn a_stream_sends_reasoning_then_text_as_typed_events_and_matches_the_whole_response() {
    let server = thinker();
    let body = json!({"input": "What is the capital of Japan?", "max_output_tokens": 50});
    let whole = create(&server, &body).await;
    let (kinds, last) = check_stream(&stream_events(&server, &body).await);
    assert_eq!(
        kinds,
        strings(&[
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
            "completed",
        ])
    );
    let without_ids = |r: &Value| {
        let mut items = r["output"].as_array().unwrap().clone();
        items.iter_mut().for_each(|item| item["id"] = Value::Null);
        items
    };
    assert_eq!(without_ids(&last), without_ids(&whole));
    assert_eq!(last["usage"], whole["usage"]);
    let reasoning = &whole["output"][0];
    assert!(
        reasoning["type"] == "reasoning" && reasoning["id"].as_str().unwrap().starts_with("rs_")
    );
    assert_eq!(reasoning["summary"], json!([]));
    assert_eq!(
        reasoning["content"][0],
        json!({"type": "reasoning_text", "text": "\nJapan's capital.\n"})
    );
    assert!(whole["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn reasoning_effort_sets_the_budget_and_none_turns_thinking_off() {
    let server = thinker();
    let body = json!({"input": "Capital of Japan?", "reasoning": {"effort": "none"}, "max_output_tokens": 24});
    let response = create(&server, &body).await;
    let kinds: Vec<&Value> =
        response["output"].as_array().unwrap().iter().map(|item| &item["type"]).collect();
    assert_eq!(kinds, [&json!("message")], "{response}");
    assert_eq!(response["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(response["reasoning"]["effort"], "none");
    assert_eq!(server.engine.last().reasoning, ReasoningMode::Off);
    let body = json!({"input": "Capital of Japan?", "reasoning": {"effort": "low"}, "max_output_tokens": 100});
    create(&server, &body).await;
    assert_eq!(server.engine.last().reasoning_budget, Some(25));
}

#[tokio::test]
async fn a_quiet_stream_repeats_in_progress_while_it_waits() {
    let gate = crate::common::Gate::default();
    let held = gate.clone();
    let server = server_with(
        move |_| Reply::Held { text: "Done.".into(), gate: held.clone() },
        |config, _| config.keep_alive = std::time::Duration::from_millis(1),
    );
    let body = json!({"input": "Hi", "max_output_tokens": 4, "stream": true, "store": false});
    let response = server.send(crate::common::post_json("/v1/responses", &body)).await;
    let mut stream = response.into_body().into_data_stream();
    let mut text = String::new();
    // Three beats before the engine answers: the stream repeats `in_progress` while it waits.
    while text.matches("event: response.in_progress").count() < 3 {
        text.push_str(&crate::common::next_chunk(&mut stream).await.unwrap());
    }
    gate.open();
    while let Some(chunk) = crate::common::next_chunk(&mut stream).await {
        text.push_str(&chunk);
    }
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let field = |name: &str| {
                e.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim_start().to_owned()
            };
            (field("event:"), serde_json::from_str(&field("data:")).unwrap())
        })
        .collect();
    let (kinds, last) = check_stream(&events);
    assert_eq!(kinds[0], "response.created");
    assert_eq!(last["status"], "completed");
}

#[tokio::test]
async fn the_output_limit_leaves_an_incomplete_response() {
    let server = replying("Once upon a time there was a dragon.");
    let body = json!({"input": "A story.", "max_output_tokens": 3});
    let response = create(&server, &body).await;
    assert_eq!(response["status"], "incomplete", "{response}");
    assert_eq!(response["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(response["usage"]["output_tokens"], 3);
    assert_eq!(response["output"][0]["status"], "incomplete", "{response}");
    let (kinds, last) = check_stream(&stream_events(&server, &body).await);
    assert_eq!(last["status"], "incomplete");
    assert_eq!(kinds.last().unwrap(), "response.incomplete");
}

#[tokio::test]
async fn previous_response_id_continues_the_stored_conversation() {
    let server = server(|seen| {
        Reply::Text(if seen.prompt.contains("my name") {
            "Ada.".into()
        } else {
            "Nice to meet you.".into()
        })
    });
    let first_input = "My name is Ada and I like tea.";
    let first = create(&server, &json!({"input": first_input, "max_output_tokens": 12})).await;
    assert_eq!(first["store"], true);
    let body = json!({"previous_response_id": first["id"], "input": "What is my name?", "max_output_tokens": 12});
    let second = create(&server, &body).await;
    assert_eq!(second["previous_response_id"], first["id"]);
    assert_eq!(output_text(&second), "Ada.");
    let prompt = server.engine.last().prompt;
    let messages = json!([
        {"role": "user", "content": first_input},
        {"role": "assistant", "content": "Nice to meet you."},
        {"role": "user", "content": "What is my name?"},
    ]);
    assert_eq!(prompt, chat_prompt(&server, messages).await);

    let path = format!("/v1/responses/{}", first["id"].as_str().unwrap());
    assert_eq!(server.get(&path).await, (200, first.clone()));
    let delete = Request::delete(&path).body(Body::empty()).unwrap();
    let (status, deleted) = server.send_json(delete).await;
    assert_eq!(
        (status, &deleted),
        (200, &json!({"object": "response.deleted", "id": first["id"], "deleted": true}))
    );
    assert_eq!(server.get(&path).await.0, 404);
}

#[tokio::test]
async fn unknown_and_unstored_ids_are_404s() {
    let server = replying("Hi.");
    let (status, error) = server.get("/v1/responses/resp_nope").await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["type"], "not_found_error");
    let (status, error) = server
        .post("/v1/responses", &json!({"previous_response_id": "resp_nope", "input": "Hi"}))
        .await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["code"], "previous_response_not_found");
    assert_eq!(error["error"]["param"], "previous_response_id");
    let unstored =
        create(&server, &json!({"input": "Hi", "max_output_tokens": 4, "store": false})).await;
    assert_eq!(unstored["store"], false);
    let id = unstored["id"].as_str().unwrap();
    assert_eq!(server.get(&format!("/v1/responses/{id}")).await.0, 404);
    let (status, _) =
        server.post("/v1/responses", &json!({"previous_response_id": id, "input": "Hi"})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn hosted_and_freeform_tools_are_ignored_and_echoed() {
    let server = replying("Paris.");
    let tools = json!([
        {"type": "web_search"},
        {"type": "image_generation"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "local_shell"},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1"},
        {"type": "tool_search"},
    ]);
    let body =
        json!({"input": "What is the capital of France?", "tools": tools, "max_output_tokens": 24});
    let response = create(&server, &body).await;
    assert_eq!(response["tools"], tools);
    let prompt = server.engine.last().prompt;
    assert_eq!(
        prompt,
        chat_prompt(
            &server,
            json!([{"role": "user", "content": "What is the capital of France?"}])
        )
        .await
    );
}

#[tokio::test]
async fn bad_requests_are_400s_naming_the_field() {
    let server = replying("Hi.");
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
        let (status, error) = server.post("/v1/responses", &body).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["param"], param, "{body}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }
    assert!(server.engine.seen().is_empty());
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

fn calling(call: &'static str) -> TestServer {
    server(move |seen| {
        if seen.prompt.contains("<tool_response>") {
            Reply::text("Sunny, 21 degrees.")
        } else {
            Reply::text(call)
        }
    })
}

#[tokio::test]
async fn a_tool_round_trip_streamed_and_whole_makes_the_same_call_then_answers() {
    let server = calling("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    let question = json!({"role": "user", "content": "What's the weather in Paris?"});
    let body = json!({
        "input": [question],
        "tools": [weather_tool(), {"type": "web_search"}],
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "none"},
        "max_output_tokens": 40,
    });
    let whole = create(&server, &body).await;
    assert!(server.engine.last().constrained);
    let whole_calls = calls(&whole);
    assert_eq!(whole_calls.len(), 1, "{whole}");
    assert_eq!(whole_calls[0]["name"], "get_weather");
    assert!(whole_calls[0].get("namespace").is_none(), "{whole}");
    let (kinds, last) = check_stream(&stream_events(&server, &body).await);
    let call_events = strings(&[
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.done",
    ]);
    assert!(kinds.windows(3).any(|w| w == call_events), "{kinds:?}");
    let fields = |c: &Value| (c["name"].clone(), c["arguments"].clone());
    assert_eq!(
        calls(&last).iter().map(fields).collect::<Vec<_>>(),
        whole_calls.iter().map(fields).collect::<Vec<_>>()
    );

    let call = &whole_calls[0];
    let body = json!({
        "input": [
            question,
            {"type": "function_call", "call_id": call["call_id"], "name": call["name"], "arguments": call["arguments"]},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "{\"sky\": \"sunny\", \"celsius\": 21}"},
        ],
        "tools": [weather_tool()],
        "reasoning": {"effort": "none"},
        "max_output_tokens": 40,
    });
    let answer = create(&server, &body).await;
    assert!(calls(&answer).is_empty(), "{answer}");
    assert_eq!(output_text(&answer), "Sunny, 21 degrees.");
    assert!(server.engine.last().prompt.contains("\"celsius\": 21"));
}

#[tokio::test]
async fn a_namespaced_tool_call_comes_back_under_its_namespace() {
    let server = calling("<tool_call>\n{\"name\": \"crm__get_customer\", \"arguments\": {\"email\": \"ada@example.com\"}}\n</tool_call>");
    let body = json!({
        "input": "Find the customer ada@example.com.",
        "tools": [crm_namespace()],
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "none"},
        "max_output_tokens": 40,
    });
    let response = create(&server, &body).await;
    assert!(
        server.engine.last().prompt.contains("crm__get_customer"),
        "offered under <namespace>__<name>"
    );
    let calls = calls(&response);
    assert_eq!(calls.len(), 1, "{response}");
    assert_eq!(
        (&calls[0]["name"], &calls[0]["namespace"]),
        (&json!("get_customer"), &json!("crm")),
        "{response}"
    );
    let replay = json!({
        "input": [
            {"role": "user", "content": "Find the customer ada@example.com."},
            calls[0],
            {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "{\"name\": \"Ada\"}"},
        ],
        "tools": [crm_namespace()],
        "tool_choice": "none",
        "max_output_tokens": 8,
    });
    create(&server, &replay).await;
    // Replayed with its namespace, the call reads back as the model wrote it.
    assert!(server.engine.last().prompt.contains("\"name\": \"crm__get_customer\""));
}

#[tokio::test]
async fn a_json_schema_text_format_constrains_the_answer() {
    let server = replying("{\"city\": \"Lagos\", \"country\": \"Nigeria\"}");
    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": false,
    });
    let body = json!({
        "input": "Name a large city and its country, as JSON.",
        "text": {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": true}},
        "max_output_tokens": 40,
    });
    let response = create(&server, &body).await;
    assert!(server.engine.last().constrained);
    assert_eq!(response["status"], "completed", "{response}");
    assert_eq!(serde_json::from_str::<Value>(&output_text(&response)).unwrap()["city"], "Lagos");
    assert_eq!(response["text"]["format"]["name"], "place");
}
