//! Tool calling and structured output on real models (Qwen2.5-Coder-0.5B with Hermes tool calls;
//! SmolLM2 for template rendering and `--guided-json`): what the grammar enforces must hold on
//! every run, streamed or not.

use crate::common;

use common::{chat_body, parse_chat_stream, post, post_stream, server, start_with, Setup};
use futures_util::future::join_all;
use serde_json::{json, Value};

const MODEL: &str = common::TINY;

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "remote": {"type": "boolean"}
        },
        "required": ["name", "age", "languages", "remote"],
        "additionalProperties": false
    })
}

/// An integer as JSON Schema counts them: `-0` and `1.0` are integers (serde reads them as
/// floats).
fn is_integer(value: &Value) -> bool {
    value.as_f64().is_some_and(|v| v.fract() == 0.0)
}

/// Checks a parsed answer against [`person_schema`].
fn assert_person(value: &Value, text: &str) {
    let object = value.as_object().unwrap_or_else(|| panic!("not an object: {text}"));
    assert_eq!(object.len(), 4, "{text}");
    assert!(object["name"].is_string(), "{text}");
    assert!(is_integer(&object["age"]), "{text}");
    assert!((0.0..=150.0).contains(&object["age"].as_f64().unwrap()), "{text}");
    let languages = object["languages"].as_array().unwrap_or_else(|| panic!("{text}"));
    assert!(languages.len() <= 3 && languages.iter().all(Value::is_string), "{text}");
    assert!(object["remote"].is_boolean(), "{text}");
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "description": "forecast days"},
                    "unit": {"anyOf": [{"enum": ["celsius", "fahrenheit"]}, {"type": "null"}]}
                },
                "required": ["city", "days"]
            },
            "strict": true
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "Current time in a timezone",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}
        }}
    ])
}

fn assert_call_valid(call: &Value) {
    let name = call["function"]["name"].as_str().unwrap();
    let text = call["function"]["arguments"].as_str().unwrap();
    let args: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    match name {
        "get_weather" => {
            assert!(args["city"].is_string(), "{text}");
            assert!(is_integer(&args["days"]), "{text}");
            assert!(
                args.get("unit").is_none_or(|u| u.is_null() || u == "celsius" || u == "fahrenheit"),
                "{text}"
            );
        }
        "get_time" => assert!(args["timezone"].is_string(), "{text}"),
        other => panic!("unknown tool {other}"),
    }
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
    assert_eq!(call["type"], "function");
}

#[tokio::test]
async fn strict_json_schema_answers_always_parse_and_validate() {
    let base = server(Setup::Wide);
    // As many as the server runs at once: one wave.
    let runs = (0..16).map(|seed| {
        let base = base.clone();
        async move {
            let body = json!({
                "model": MODEL,
                "messages": [{"role": "user", "content": "Describe a software developer as JSON."}],
                "max_tokens": 160,
                "temperature": 0.9,
                "seed": seed,
                "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": person_schema()}},
            });
            post(&base, "/v1/chat/completions", &body).await
        }
    });
    let answers = join_all(runs).await;
    for (seed, (status, answer)) in answers.iter().enumerate() {
        assert_eq!(*status, 200, "seed {seed}: {answer}");
        let choice = &answer["choices"][0];
        let text = choice["message"]["content"].as_str().unwrap();
        assert_eq!(choice["finish_reason"], "stop", "seed {seed} ran out of tokens: {text}");
        let value: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        assert_person(&value, text);
    }
}

#[tokio::test]
async fn json_object_answers_are_objects() {
    let base = server(Setup::Wide);
    let answers = join_all((0..3).map(|seed| {
        let body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "Give me a recipe."}],
            "max_tokens": 200, "temperature": 0.7, "seed": seed,
            "response_format": {"type": "json_object"},
        });
        let base = base.clone();
        async move { post(&base, "/v1/chat/completions", &body).await }
    }))
    .await;
    for (status, answer) in answers {
        assert_eq!(status, 200, "{answer}");
        let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
        if answer["choices"][0]["finish_reason"] == "stop" {
            assert!(serde_json::from_str::<Value>(text)
                .unwrap_or_else(|e| panic!("{e}: {text}"))
                .is_object());
        } else {
            assert!(text.starts_with('{'), "{text}");
        }
    }
}

/// A request whose model may stop after its first call only when `parallel`.
fn tool_request(tool_choice: Value, seed: u64, stream: bool, parallel: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "What's the weather in Paris for the next 3 days, and what time is it in Tokyo?"}],
        "tools": weather_tools(),
        "tool_choice": tool_choice,
        "max_tokens": 120,
        "temperature": 0.8,
        "seed": seed,
        "stream": stream,
        "parallel_tool_calls": parallel,
    })
}

#[tokio::test]
async fn required_and_named_tool_choice_always_give_valid_calls() {
    let base = server(Setup::Wide);
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let requests = (0..6)
        .map(|seed| tool_request(json!("required"), seed, false, seed < 2))
        .chain((0..4).map(|seed| tool_request(named.clone(), seed, false, true)));
    let answers = join_all(requests.map(|body| {
        let base = base.clone();
        async move { (body.clone(), post(&base, "/v1/chat/completions", &body).await) }
    }))
    .await;
    for (body, (status, answer)) in answers {
        assert_eq!(status, 200, "{answer}");
        let (message, finish) =
            (&answer["choices"][0]["message"], &answer["choices"][0]["finish_reason"]);
        // Parallel calls end when the model stops calling, which a small model at temperature
        // 0.8 may put off past max_tokens; every call it finished must still be valid.
        let open_ended = body["tool_choice"] == "required" && body["parallel_tool_calls"] == true;
        assert!(finish == "tool_calls" || (open_ended && finish == "length"), "{answer}");
        let calls = message["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "{answer}");
        let choice = &body["tool_choice"];
        calls.iter().for_each(assert_call_valid);
        if choice.is_object() {
            assert_eq!(calls.len(), 1, "{answer}");
            assert_eq!(calls[0]["function"]["name"], "get_time", "{answer}");
        }
    }
}

/// Tool-call pieces of a stream, folded the way OpenAI clients fold them.
fn streamed_calls(chunks: &[Value]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for chunk in chunks {
        for piece in chunk["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = piece["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                assert!(
                    piece["id"].is_string()
                        && piece["type"] == "function"
                        && piece["function"]["name"].is_string(),
                    "{piece}"
                );
                calls.push(json!({"id": piece["id"], "type": "function", "function": {"name": piece["function"]["name"], "arguments": ""}}));
            } else {
                assert!(
                    piece.get("id").is_none() && piece["function"].get("name").is_none(),
                    "name sent twice: {piece}"
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
async fn streamed_calls_reassemble_to_the_same_valid_calls() {
    let base = server(Setup::Wide);
    // Each seed streamed and whole, all at once.
    let runs = (0..3).map(|seed| {
        let base = base.clone();
        async move {
            let streamed_body = tool_request(json!("required"), seed, true, false);
            let whole_body = tool_request(json!("required"), seed, false, false);
            futures_util::join!(
                post_stream(&base, "/v1/chat/completions", &streamed_body),
                post(&base, "/v1/chat/completions", &whole_body),
            )
        }
    });
    for (data, (_, whole)) in join_all(runs).await {
        let streamed = parse_chat_stream(&data);
        assert_eq!(streamed.finish_reason, "tool_calls");
        let calls = streamed_calls(&streamed.chunks);
        assert!(!calls.is_empty());
        calls.iter().for_each(assert_call_valid);
        // Ids name each response's own calls; everything else must match.
        let without_ids =
            |calls: &[Value]| calls.iter().map(|c| c["function"].clone()).collect::<Vec<_>>();
        let whole_calls = whole["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(
            without_ids(whole_calls),
            without_ids(&calls),
            "streamed and whole calls differ"
        );
        assert!(whole_calls
            .iter()
            .chain(&calls)
            .all(|c| c["id"].as_str().is_some_and(|id| id.starts_with("call_"))));
    }
}

#[tokio::test]
async fn a_tool_round_trip_ends_in_a_text_answer() {
    let base = server(Setup::Wide);
    let (_, first) = post(
        &base,
        "/v1/chat/completions",
        &tool_request(
            json!({"type": "function", "function": {"name": "get_weather"}}),
            1,
            false,
            true,
        ),
    )
    .await;
    let call = first["choices"][0]["message"]["tool_calls"][0].clone();
    assert_call_valid(&call);
    let body = json!({
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "What's the weather in Paris for the next 3 days?"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "{\"forecast\": [\"sunny\", \"rain\", \"sunny\"], \"celsius\": 21}"},
        ],
        "tools": weather_tools(),
        "tool_choice": "none",
        "max_tokens": 60,
        "temperature": 0,
    });
    let (status, answer) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let message = &answer["choices"][0]["message"];
    assert!(
        message.get("tool_calls").is_none_or(|c| c.as_array().is_some_and(Vec::is_empty)),
        "{answer}"
    );
    assert!(
        message["content"]
            .as_str()
            .is_some_and(|c| !c.trim().is_empty() && !c.contains("<tool_call>")),
        "{answer}"
    );
}

#[tokio::test]
async fn bad_tool_and_format_requests_are_400s_naming_the_field() {
    let base = server(Setup::Wide);
    let cases = [
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": weather_tools(), "tool_choice": "sometimes"}), "tool_choice"),
        (json!({"response_format": {"type": "yaml"}}), "response_format"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "decimal"}}}}),
            "response_format",
        ),
    ];
    for (extra, param) in cases {
        let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, answer) = post(&base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{body} → {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
}

#[tokio::test]
async fn a_null_content_beside_tool_calls_renders_as_empty_text() {
    // A template that prints `content` as is: OpenAI clients send `null` on messages that only
    // call tools, and templates that test or concatenate it must see a string.
    let base = server(Setup::Thinking);
    let messages = json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]);
    let (status, tokens) = post(&base, "/v1/tokenize", &json!({"messages": messages})).await;
    assert_eq!(status, 200, "{tokens}");
    let (status, text) = post(&base, "/v1/detokenize", &json!({"tokens": tokens["tokens"]})).await;
    assert_eq!(status, 200, "{text}");
    let prompt = text["prompt"].as_str().unwrap();
    assert!(prompt.contains("<|im_start|>assistant\n<|im_end|>"), "{prompt}");
}

/// History replayed with the arguments as a JSON object (and fields OpenAI does not define on
/// messages) renders the prompt that OpenAI's own shape, arguments as a string, renders.
#[tokio::test]
async fn arguments_given_as_an_object_render_as_the_string_form_does() {
    let base = server(Setup::Wide);
    // A system message of its own keeps the template's default preamble out of the prefix
    // cache, which another test here measures.
    let history = |arguments: Value| {
        json!({"messages": [
            {"role": "system", "content": "Answer weather questions briefly."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": null, "refusal": null, "tool_calls": [{"id": "c1",
             "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny", "cache_control": {}},
        ], "tools": weather_tools()})
    };
    let (status, as_string) =
        post(&base, "/v1/tokenize", &history(json!("{\"city\": \"Paris\", \"days\": 1}"))).await;
    assert_eq!(status, 200, "{as_string}");
    let (status, as_object) =
        post(&base, "/v1/tokenize", &history(json!({"city": "Paris", "days": 1}))).await;
    assert_eq!(status, 200, "{as_object}");
    assert_eq!(as_object["tokens"], as_string["tokens"]);
    let mut chat = history(json!({"city": "Paris", "days": 1}));
    chat["max_tokens"] = json!(4);
    let (status, answer) = post(&base, "/v1/chat/completions", &chat).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn guided_json_shapes_answers_unless_the_request_asks_for_text() {
    let base = server(Setup::GuidedJson);
    let (status, answer) =
        post(&base, "/v1/chat/completions", &chat_body("What is the capital of France?", 60)).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert!(
        value["answer"].is_string()
            && value["sure"].is_boolean()
            && value.as_object().unwrap().len() == 2,
        "{value}"
    );
    // A request's own response_format wins: text stays free.
    let mut body = chat_body("What is the capital of France?", 60);
    body["response_format"] = json!({"type": "text"});
    let (status, answer) = post(&base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(text).is_err(), "{answer}");
}

#[tokio::test]
async fn calls_without_a_system_message_share_the_templates_tools_preamble() {
    // A server of its own: the other tests' calls share the template's preamble too, and would
    // fill this one's prefix cache in whatever order they ran.
    let base = start_with(Setup::Wide, |_| {});
    // Qwen2.5's template writes a system turn of its own around the tools: with this third tool
    // it is well past one 256-token prefill chunk and short of two.
    let mut tools = weather_tools();
    let notes =
        "Plans a trip: takes the cities in visiting order and returns trains, times and prices. "
            .repeat(6);
    tools.as_array_mut().unwrap().push(json!({"type": "function", "function": {
        "name": "plan_trip", "description": notes,
        "parameters": {"type": "object", "properties": {"cities": {"type": "array", "items": {"type": "string"}}}, "required": ["cities"]}}}));
    let call = |user: &str| json!({"model": MODEL, "messages": [{"role": "user", "content": user}], "tools": tools, "max_tokens": 1});
    let cached = |answer: &Value| {
        answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    let (_, first) =
        post(&base, "/v1/chat/completions", &call("Plan a trip from Lyon to Turin.")).await;
    assert_eq!(cached(&first), 0, "{first}");
    let mut resumed = Vec::new();
    // Each user turn parts from the others at its first word.
    for user in ["Weather in Oslo, please?", "Time in Lima, please?"] {
        let (status, answer) = post(&base, "/v1/chat/completions", &call(user)).await;
        assert_eq!(status, 200, "{answer}");
        resumed.push(cached(&answer));
    }
    // Both resume where the user turn begins: past the first chunk (256), at one position.
    assert!(resumed[0] > 256 && resumed[0] < 512 && resumed[0] == resumed[1], "{resumed:?}");
}
