//! `/v1/chat/completions`: the OpenAI shapes whole and streamed, the same text both ways, stop
//! strings, logprobs, usage, what the engine is asked for (sampling, thinking, grammar), and
//! tool calls whole and streamed.

use serde_json::{json, Value};
use spindle_runner::ReasoningMode;

use crate::common::{
    chat_body, parse_chat_stream, replying, server, server_with, Reply, TestServer, MODEL,
};
use crate::messages::thinker;

fn message(response: &Value) -> &Value {
    &response["choices"][0]["message"]
}

fn content(response: &Value) -> String {
    message(response)["content"].as_str().unwrap().to_string()
}

fn streaming(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body
}

#[tokio::test]
async fn a_whole_response_has_the_openai_shape() {
    let server = replying("Paris is the capital of France.");
    let (status, body) = server.post("/v1/chat/completions", &chat_body("Capital?", 24)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["created"].as_u64().unwrap() > 1_700_000_000);
    let choice = &body["choices"][0];
    assert_eq!((&choice["index"], &choice["message"]["role"]), (&json!(0), &json!("assistant")));
    assert_eq!(content(&body), "Paris is the capital of France.");
    assert!(choice["message"].get("reasoning_content").is_none(), "{body}");
    assert!(choice["logprobs"].is_null());
    assert_eq!(choice["finish_reason"], "stop");
    let usage = &body["usage"];
    let prompt = server.engine.last().prompt_tokens as u64;
    assert_eq!(usage["prompt_tokens"].as_u64(), Some(prompt));
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + completion));
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn the_prompt_is_the_template_rendering_of_the_messages() {
    let server = replying("Hi.");
    let mut body = chat_body("What now?", 4);
    body["messages"] = json!([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "What now?"},
    ]);
    let (_, chat) = server.post("/v1/chat/completions", &body).await;
    let prompt = server.engine.last().prompt;
    assert_eq!(
        prompt,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat now?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "`developer` renders as `system`; thinking is off, so the block comes closed"
    );
    let (_, tokenized) = server.post("/v1/tokenize", &json!({"messages": body["messages"]})).await;
    assert_eq!(chat["usage"]["prompt_tokens"], tokenized["count"]);
}

#[tokio::test]
async fn streaming_gives_the_same_text_and_usage_as_a_whole_response() {
    let server = replying("Rivers run, stones stay; the sea keeps every name.");
    let body = chat_body("A haiku about rivers.", 40);
    let (_, whole) = server.post("/v1/chat/completions", &body).await;
    let streamed =
        parse_chat_stream(&server.post_stream("/v1/chat/completions", &streaming(body)).await);
    assert_eq!(streamed.content, content(&whole));
    assert_eq!(streamed.finish_reason, whole["choices"][0]["finish_reason"]);
    assert_eq!(streamed.usage.unwrap(), whole["usage"]);
    // The usage chunk comes last and has no choices; every chunk shares the response's id.
    let last = streamed.chunks.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    let id = &streamed.chunks[0]["id"];
    assert!(streamed.chunks.iter().all(|c| &c["id"] == id));
    assert!(streamed.chunks.len() > 5, "one chunk per token, not one blob");
}

#[tokio::test]
async fn max_tokens_cuts_the_answer_with_length() {
    let server = replying("one two three four five six seven");
    let (_, whole) = server.post("/v1/chat/completions", &chat_body("Count", 3)).await;
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 3);
    assert_eq!(content(&whole), "one two three");
    // `max_completion_tokens`, the newer name, is the same limit.
    let mut body = chat_body("Count", 3);
    body.as_object_mut().unwrap().remove("max_tokens");
    body["max_completion_tokens"] = json!(2);
    let (_, whole) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn stop_strings_cut_the_output_mid_token_and_are_never_sent() {
    let server = replying("The capital of France is Paris.");
    for stops in [json!("pital"), json!(["#never#", "pital"])] {
        let mut body = chat_body("Capital?", 24);
        body["stop"] = stops;
        let (_, whole) = server.post("/v1/chat/completions", &body).await;
        assert_eq!(content(&whole), "The ca");
        assert_eq!(whole["choices"][0]["finish_reason"], "stop");
        let streamed =
            parse_chat_stream(&server.post_stream("/v1/chat/completions", &streaming(body)).await);
        assert_eq!(streamed.content, "The ca");
        assert!(streamed.chunks.iter().all(|c| !c.to_string().contains("pital")));
    }
}

#[tokio::test]
async fn logprobs_come_in_the_openai_shape_whole_and_streamed() {
    let server = replying("Yes, indeed.");
    let mut body = chat_body("Sure?", 8);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (_, whole) = server.post("/v1/chat/completions", &body).await;
    let entries = whole["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(entries.len() as u64, whole["usage"]["completion_tokens"].as_u64().unwrap());
    let text: String = entries.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(text, "Yes, indeed.");
    for entry in &entries {
        assert_eq!(entry["logprob"], -0.25);
        assert_eq!(entry["top_logprobs"].as_array().unwrap().len(), 3);
        let bytes: Vec<u8> =
            entry["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), entry["token"].as_str().unwrap());
    }
    let streamed =
        parse_chat_stream(&server.post_stream("/v1/chat/completions", &streaming(body)).await);
    let streamed_entries: Vec<Value> = streamed
        .chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed_entries, entries);
}

#[tokio::test]
async fn sampling_fields_reach_the_engine_and_openai_defaults_fill_the_rest() {
    let server = replying("Ok.");
    server.post("/v1/chat/completions", &chat_body("Hi", 4)).await;
    let plain = server.engine.last();
    assert_eq!((plain.temperature, plain.seed, plain.top_logprobs), (1.0, None, None));
    let mut body = chat_body("Hi", 4);
    body["temperature"] = json!(0.3);
    body["seed"] = json!(-1);
    server.post("/v1/chat/completions", &body).await;
    let seeded = server.engine.last();
    assert_eq!((seeded.temperature, seeded.seed), (0.3, Some(u64::MAX)));
    assert_eq!(seeded.context, 2048);
}

#[tokio::test]
async fn reasoning_comes_apart_from_content_whole_and_streamed() {
    let server = thinker();
    let body = chat_body("Capital of Japan?", 60);
    let (_, whole) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(message(&whole)["reasoning_content"], "\nJapan's capital.\n");
    assert_eq!(content(&whole), "Tokyo.");
    assert!(whole["usage"]["completion_tokens_details"]["reasoning_tokens"].as_u64().unwrap() > 0);
    let streamed =
        parse_chat_stream(&server.post_stream("/v1/chat/completions", &streaming(body)).await);
    assert_eq!(streamed.reasoning, "\nJapan's capital.\n");
    assert_eq!(streamed.content, "Tokyo.");
    assert!(!streamed.chunks.iter().any(|c| c.to_string().contains("think>")));
}

#[tokio::test]
async fn enable_thinking_false_renders_the_closed_block_and_gives_content_only() {
    let server = thinker();
    let mut body = chat_body("Capital of Japan?", 60);
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (_, whole) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(content(&whole), "Tokyo.");
    assert!(message(&whole).get("reasoning_content").is_none(), "{whole}");
    let seen = server.engine.last();
    assert_eq!(seen.reasoning, ReasoningMode::Off);
    assert!(seen.prompt.ends_with("<think>\n\n</think>\n\n"), "{}", seen.prompt);
}

#[tokio::test]
async fn no_thinking_turns_it_off_unless_a_request_turns_it_on() {
    let server = server_with(
        |seen| match seen.reasoning {
            ReasoningMode::Tagged { .. } => Reply::text("<think>hm</think>Yes."),
            ReasoningMode::Off => Reply::text("Yes."),
        },
        |config, _| config.thinking_default = false,
    );
    let (_, off) = server.post("/v1/chat/completions", &chat_body("Sure?", 20)).await;
    assert!(message(&off).get("reasoning_content").is_none(), "{off}");
    let mut body = chat_body("Sure?", 20);
    body["chat_template_kwargs"] = json!({"enable_thinking": true});
    let (_, on) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(message(&on)["reasoning_content"], "hm");
}

#[tokio::test]
async fn the_thinking_budget_reaches_the_engine_and_too_small_a_max_tokens_is_a_400() {
    let server = thinker();
    let mut body = chat_body("Capital?", 60);
    body["thinking_budget"] = json!(5);
    server.post("/v1/chat/completions", &body).await;
    assert_eq!(server.engine.last().reasoning_budget, Some(5));
    let (status, refused) = server.post("/v1/chat/completions", &chat_body("Capital?", 2)).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "max_tokens");
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    body["max_tokens"] = json!(1);
    let (status, _) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "thinking off needs no room to close a block");
}

fn person_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false,
    }}})
}

#[tokio::test]
async fn response_format_constrains_the_answer_and_a_bad_schema_is_a_400() {
    let server = replying("{\"name\": \"Ada\", \"age\": 36}");
    let mut body = chat_body("Who?", 40);
    body["response_format"] = person_format();
    let (status, whole) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert!(server.engine.last().constrained);
    assert_eq!(serde_json::from_str::<Value>(&content(&whole)).unwrap()["name"], "Ada");
    body["response_format"] = json!({"type": "json_object"});
    server.post("/v1/chat/completions", &body).await;
    assert!(server.engine.last().constrained);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}});
    let (status, refused) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "response_format", "{refused}");
    server.post("/v1/chat/completions", &chat_body("Free text", 4)).await;
    assert!(!server.engine.last().constrained);
}

#[tokio::test]
async fn guided_json_shapes_answers_unless_the_request_asks_for_text() {
    let schema =
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
    let server = server_with(
        |_| Reply::text("{\"a\": \"b\"}"),
        |config, _| config.guided_json = Some(schema),
    );
    server.post("/v1/chat/completions", &chat_body("Hi", 20)).await;
    assert!(server.engine.last().constrained);
    let mut body = chat_body("Hi", 20);
    body["response_format"] = json!({"type": "text"});
    server.post("/v1/chat/completions", &body).await;
    assert!(!server.engine.last().constrained);
}

pub fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
    }}])
}

/// A model that calls `get_weather` for Paris (and for Lyon too with `twice`), and answers in
/// text once a tool's result is in the prompt.
pub fn caller(twice: bool) -> TestServer {
    server(move |seen| {
        if seen.prompt.contains("<tool_response>") {
            return Reply::text("Sunny in Paris.");
        }
        let call = |city: &str| {
            format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\", \"days\": 2}}}}\n</tool_call>")
        };
        let calls =
            if twice { format!("{}\n{}", call("Paris"), call("Lyon")) } else { call("Paris") };
        Reply::Text(calls)
    })
}

fn tool_body(stream: bool) -> Value {
    let mut body = chat_body("Weather in Paris?", 80);
    body["tools"] = weather_tools();
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    if stream {
        body = streaming(body);
    }
    body
}

/// Tool-call pieces of a stream, folded the way OpenAI clients fold them: the id, type and name
/// once, in the first piece of each index, then argument text.
fn streamed_calls(chunks: &[Value]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for chunk in chunks {
        for piece in chunk["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = piece["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                assert!(piece["id"].is_string() && piece["type"] == "function", "{piece}");
                calls.push(json!({"id": piece["id"], "type": "function", "function": {"name": piece["function"]["name"], "arguments": ""}}));
            } else {
                assert!(
                    piece.get("id").is_none() && piece["function"].get("name").is_none(),
                    "{piece}"
                );
            }
            let arguments = format!(
                "{}{}",
                calls[index]["function"]["arguments"].as_str().unwrap(),
                piece["function"]["arguments"].as_str().unwrap_or("")
            );
            calls[index]["function"]["arguments"] = json!(arguments);
        }
    }
    calls
}

#[tokio::test]
async fn tool_calls_come_back_whole_and_streamed_alike() {
    for twice in [false, true] {
        let server = caller(twice);
        let (status, whole) = server.post("/v1/chat/completions", &tool_body(false)).await;
        assert_eq!(status, 200, "{whole}");
        assert_eq!(whole["choices"][0]["finish_reason"], "tool_calls");
        assert!(message(&whole)["content"].is_null(), "{whole}");
        let calls = message(&whole)["tool_calls"].as_array().unwrap().clone();
        assert_eq!(calls.len(), 1 + usize::from(twice), "{whole}");
        for call in &calls {
            assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
            assert_eq!(call["function"]["name"], "get_weather");
            let arguments: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(arguments["days"], 2);
        }
        let streamed =
            parse_chat_stream(&server.post_stream("/v1/chat/completions", &tool_body(true)).await);
        assert_eq!(streamed.finish_reason, "tool_calls");
        assert_eq!(streamed.content, "");
        let functions =
            |calls: &[Value]| calls.iter().map(|c| c["function"].clone()).collect::<Vec<_>>();
        assert_eq!(functions(&streamed_calls(&streamed.chunks)), functions(&calls));
    }
}

#[tokio::test]
async fn tool_choice_decides_the_grammar_and_what_is_offered() {
    let server = caller(false);
    let mut body = tool_body(false);
    server.post("/v1/chat/completions", &body).await;
    let auto = server.engine.last();
    assert!(auto.prompt.contains("get_weather"), "the template lists the tools");
    body["tool_choice"] = json!("required");
    server.post("/v1/chat/completions", &body).await;
    assert!(server.engine.last().constrained, "a required call is held to the grammar");
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    server.post("/v1/chat/completions", &body).await;
    assert!(server.engine.last().constrained);
    body["tool_choice"] = json!({"type": "function", "function": {"name": "no_such_tool"}});
    let (status, refused) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"]["param"].as_str().unwrap().starts_with("tool_choice"), "{refused}");
}

#[tokio::test]
async fn a_tool_round_trip_ends_in_a_text_answer() {
    let server = caller(false);
    let (_, first) = server.post("/v1/chat/completions", &tool_body(false)).await;
    let call = message(&first)["tool_calls"][0].clone();
    let mut body = tool_body(false);
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "24 C, sunny"}));
    let (status, answer) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(content(&answer), "Sunny in Paris.");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let prompt = server.engine.last().prompt;
    assert!(prompt.contains("<tool_response>\n24 C, sunny\n</tool_response>"), "{prompt}");
    assert!(prompt.contains("\"city\": \"Paris\""), "the call is rendered back: {prompt}");
}

#[tokio::test]
async fn the_speculative_switch_reaches_the_engine_from_every_protocol() {
    let server = replying("Hi.");
    for (value, want) in [(json!(true), Some(true)), (json!(false), Some(false))] {
        let user = json!([{"role": "user", "content": "Hello"}]);
        let bodies = [
            ("/v1/chat/completions", json!({"messages": user, "max_tokens": 4})),
            ("/v1/completions", json!({"model": MODEL, "prompt": "Hello", "max_tokens": 4})),
            ("/v1/messages", json!({"messages": user, "max_tokens": 4})),
            ("/v1/responses", json!({"input": "Hello", "max_output_tokens": 16})),
        ];
        for (path, mut body) in bodies {
            body["speculative"] = value.clone();
            let (status, answer) = server.post(path, &body).await;
            assert_eq!(status, 200, "{path}: {answer}");
            assert_eq!(server.engine.last().speculative, want, "{path}, {value}");
        }
    }
    server.post("/v1/chat/completions", &chat_body("Hello", 4)).await;
    assert_eq!(server.engine.last().speculative, None, "silent: the server's default");
    let mut body = chat_body("Hello", 4);
    body["speculative"] = json!("yes");
    let (status, error) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{error}");
}
