//! Fuzzing request bodies (issue #20): valid Chat Completions, Completions, Responses,
//! Messages and tokenize bodies (tools, response_format, logprobs, every sampling field),
//! mutated as JSON (values of the wrong type, extreme numbers, deep nesting, missing and added
//! fields, long and odd strings) and as bytes (cut, flipped, spliced), then taken through what
//! each handler does before it renders the prompt: `parse_json`, `validate`, and each protocol's
//! conversion to the pipeline's generation request. Every body must be accepted or refused with a
//! 400 that says why; none may panic or hang.
//!
//! `SPINDLE_FUZZ_CASES=100000` runs a long campaign; the default is CI's fixed subset.

use serde_json::{json, Value};
use spindle_api::anthropic::MessagesRequest;
use spindle_api::{
    ApiError, ChatCompletionRequest, CompletionRequest, ResponsesRequest, TokenizeRequest,
};
use spindle_fuzz::{mutate_bytes, mutate_json, Rng};

use crate::error::parse_json;

const CI_CASES: u64 = 3_000;

/// The endpoints whose bodies are fuzzed.
#[derive(Debug, Clone, Copy)]
enum Endpoint {
    Chat,
    Completions,
    Responses,
    Messages,
    Tokenize,
}

/// Valid bodies, each using as many of its endpoint's fields as it can.
fn corpus() -> Vec<(Endpoint, Value)> {
    let weather = json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"]
    });
    vec![
        (
            Endpoint::Chat,
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                        "type": "function", "function": {"name": "get_weather",
                        "arguments": "{\"city\": \"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
                ],
                "tools": [{"type": "function", "function": {"name": "get_weather",
                    "description": "Weather by city", "parameters": weather}}],
                "tool_choice": "auto",
                "parallel_tool_calls": true,
                "temperature": 0.7,
                "top_p": 0.9,
                "top_k": 40,
                "min_p": 0.05,
                "max_tokens": 64,
                "seed": 42,
                "stop": ["\n\n"],
                "presence_penalty": 0.5,
                "frequency_penalty": 0.5,
                "repetition_penalty": 1.1,
                "logprobs": true,
                "top_logprobs": 5,
                "stream": true,
                "stream_options": {"include_usage": true},
                "chat_template_kwargs": {"enable_thinking": false}
            }),
        ),
        (
            Endpoint::Chat,
            json!({
                "messages": [{"role": "user", "content": "List three colours."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "colours",
                    "strict": true, "schema": {"type": "array", "items": {"type": "string"}}}},
                "max_completion_tokens": 32,
                "n": 1
            }),
        ),
        (
            Endpoint::Completions,
            json!({"model": "m", "prompt": "Once upon", "max_tokens": 16, "temperature": 0.0,
                "logprobs": 3, "echo": false, "stop": "\n", "seed": 1, "top_p": 1.0}),
        ),
        (Endpoint::Completions, json!({"prompt": [1, 2, 3], "stream": true})),
        (
            Endpoint::Responses,
            json!({
                "model": "m",
                "instructions": "Be brief.",
                "input": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"type": "function_call", "call_id": "c1", "name": "get_weather",
                        "arguments": "{\"city\": \"Paris\"}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
                ],
                "tools": [{"type": "function", "name": "get_weather", "parameters": weather}],
                "tool_choice": "auto",
                "max_output_tokens": 64,
                "temperature": 0.5,
                "reasoning": {"effort": "low"},
                "store": false
            }),
        ),
        (
            Endpoint::Responses,
            json!({"input": "Hello", "text": {"format": {"type": "json_schema", "name": "x",
                "schema": {"type": "object", "properties": {"a": {"type": "number"}}}}}}),
        ),
        (
            Endpoint::Messages,
            json!({
                "model": "m",
                "max_tokens": 64,
                "system": "Be brief.",
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "get_weather",
                            "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                        "content": "sunny"}]}
                ],
                "tools": [{"name": "get_weather", "description": "Weather by city",
                    "input_schema": weather}],
                "tool_choice": {"type": "auto"},
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "temperature": 0.5,
                "top_k": 5,
                "stop_sequences": ["END"],
                "stream": true
            }),
        ),
        (Endpoint::Tokenize, json!({"model": "m", "prompt": "Hello", "add_special_tokens": true})),
        (Endpoint::Tokenize, json!({"messages": [{"role": "user", "content": "Hi"}]})),
    ]
}

/// What each handler does with a body before it renders the prompt.
fn handle(endpoint: Endpoint, body: &[u8]) -> Result<(), ApiError> {
    let parsed = |error: crate::error::HttpError| error.0;
    match endpoint {
        Endpoint::Chat => {
            let request: ChatCompletionRequest = parse_json(body).map_err(parsed)?;
            request.validate()?;
            crate::chat::request::generation_request(&request)?.validate()
        }
        Endpoint::Completions => parse_json::<CompletionRequest>(body).map_err(parsed)?.validate(),
        Endpoint::Tokenize => parse_json::<TokenizeRequest>(body).map_err(parsed)?.validate(),
        Endpoint::Messages => {
            let request: MessagesRequest = parse_json(body).map_err(parsed)?;
            request.validate()?;
            crate::messages::request::generation_request(&request)?.validate()
        }
        Endpoint::Responses => {
            let request: ResponsesRequest = parse_json(body).map_err(parsed)?;
            request.validate()?;
            let items = request.input_items()?;
            crate::responses::input::generation_request(&request, &items)?.0.validate()
        }
    }
}

/// Every key of the corpus's bodies, for the mutations that add fields.
fn all_keys(corpus: &[(Endpoint, Value)]) -> Vec<String> {
    fn collect(value: &Value, keys: &mut Vec<String>) {
        match value {
            Value::Object(map) => map.iter().for_each(|(k, v)| {
                keys.push(k.clone());
                collect(v, keys);
            }),
            Value::Array(items) => items.iter().for_each(|v| collect(v, keys)),
            _ => {}
        }
    }
    let mut keys = Vec::new();
    corpus.iter().for_each(|(_, body)| collect(body, &mut keys));
    keys.sort();
    keys.dedup();
    keys
}

struct Case {
    endpoint: Endpoint,
    body: Vec<u8>,
}

/// The body as text in a failure report (bytes that are not UTF-8 shown as U+FFFD).
impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {:?}", self.endpoint, String::from_utf8_lossy(&self.body))
    }
}

fn generate(rng: &mut Rng, corpus: &[(Endpoint, Value)], keys: &[&str]) -> Case {
    let (endpoint, body) = rng.pick(corpus);
    let mut body = body.clone();
    mutate_json(rng, &mut body, keys);
    let mut bytes = serde_json::to_vec(&body).unwrap();
    if rng.one_in(4) {
        mutate_bytes(rng, &mut bytes);
    }
    Case { endpoint: *endpoint, body: bytes }
}

#[test]
fn the_corpus_is_valid() {
    for (endpoint, body) in corpus() {
        let bytes = serde_json::to_vec(&body).unwrap();
        if let Err(error) = handle(endpoint, &bytes) {
            panic!("{endpoint:?} {body}: {}", error.message);
        }
    }
}

#[test]
fn mutated_request_bodies_are_accepted_or_refused_with_a_400() {
    let corpus = corpus();
    let keys = all_keys(&corpus);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut refused = 0u64;
    let cases = spindle_fuzz::run(
        "request bodies",
        CI_CASES,
        |rng| generate(rng, &corpus, &keys),
        |case| {
            if let Err(error) = handle(case.endpoint, &case.body) {
                refused += 1;
                assert_eq!(error.status, 400, "{}", error.message);
                assert!(!error.message.is_empty());
            }
        },
    );
    // Most mutations break a rule; a generator whose bodies all pass would test nothing.
    if cases >= 1_000 {
        assert!(refused > cases / 4, "only {refused} of {cases} bodies were refused");
    }
}
