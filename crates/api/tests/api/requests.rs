//! Request bodies as real clients send them: what deserializes, to what, and what must not.

use serde_json::{json, Value};
use spindle_api::{
    ChatCompletionRequest, CompletionRequest, DetokenizeRequest, MessageContent, Prompt,
    StopSequences, TokenizeRequest, ToolType, DEFAULT_COMPLETION_MAX_TOKENS,
};

/// An OpenAI chat request with a developer prompt, text parts, a replayed tool call and its
/// result, one tool, and fields Spindle does not know (`store`, `metadata`, `service_tier`).
const CHAT_WITH_TOOLS: &str = r#"{
  "model": "gpt-4o",
  "messages": [
    {"role": "developer", "content": "You are a helpful assistant."},
    {"role": "user", "content": [
      {"type": "text", "text": "What's the weather like"},
      {"type": "text", "text": "in Boston today?"}
    ]},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "call_abc123", "type": "function",
       "function": {"name": "get_current_weather", "arguments": "{\"location\": \"Boston, MA\"}"}}
    ]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": "{\"temperature\": 22, \"unit\": \"celsius\"}"}
  ],
  "tools": [
    {"type": "function", "function": {
      "name": "get_current_weather",
      "description": "Get the current weather in a given location",
      "parameters": {
        "type": "object",
        "properties": {
          "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
        },
        "required": ["location"]
      },
      "strict": false
    }}
  ],
  "tool_choice": "auto",
  "parallel_tool_calls": true,
  "stream": true,
  "stream_options": {"include_usage": true},
  "max_completion_tokens": 256,
  "temperature": 0.7,
  "top_p": 1.0,
  "stop": ["\n\n", "Observation:"],
  "seed": -42,
  "logprobs": true,
  "top_logprobs": 2,
  "chat_template_kwargs": {"enable_thinking": false},
  "store": false,
  "metadata": {"session": "abc"},
  "service_tier": "auto"
}"#;

#[test]
fn chat_request_with_tools_and_content_parts() {
    let request: ChatCompletionRequest = serde_json::from_str(CHAT_WITH_TOOLS).unwrap();
    request.validate().unwrap();

    assert_eq!(request.model.as_deref(), Some("gpt-4o"));
    assert_eq!(request.messages.len(), 4);
    let user = &request.messages[1];
    assert_eq!(user.role, "user");
    assert_eq!(user.content.as_ref().unwrap().text(), "What's the weather like\nin Boston today?");
    let assistant = &request.messages[2];
    assert_eq!(assistant.content, None);
    assert_eq!(assistant.tool_calls[0].id, "call_abc123");
    assert_eq!(assistant.tool_calls[0].function.arguments, r#"{"location": "Boston, MA"}"#);
    assert_eq!(request.messages[3].tool_call_id.as_deref(), Some("call_abc123"));

    let tool = &request.tools[0];
    assert_eq!(tool.kind, ToolType::Function);
    assert_eq!(tool.function.name, "get_current_weather");
    assert_eq!(tool.function.parameters.as_ref().unwrap()["required"], json!(["location"]));
    assert_eq!(tool.function.strict, Some(false));
    assert_eq!(request.tool_choice, Some(json!("auto")));

    assert!(request.stream);
    assert!(request.stream_options.unwrap().include_usage);
    assert_eq!(request.max_output_tokens(), Some(256));
    assert_eq!(request.sampling.temperature, Some(0.7));
    assert_eq!(request.sampling.seed, Some(-42));
    assert_eq!(request.sampling.stop.clone().unwrap().into_vec(), ["\n\n", "Observation:"]);
    assert!(request.logprobs);
    assert_eq!(request.top_logprobs, Some(2));
    assert_eq!(request.chat_template_kwargs["enable_thinking"], json!(false));
}

#[test]
fn chat_request_serializes_back_to_what_was_sent_minus_unknown_fields() {
    let request: ChatCompletionRequest = serde_json::from_str(CHAT_WITH_TOOLS).unwrap();
    let mut expected: Value = serde_json::from_str(CHAT_WITH_TOOLS).unwrap();
    for unknown in ["store", "metadata", "service_tier"] {
        expected.as_object_mut().unwrap().remove(unknown);
    }
    let written: Value = serde_json::from_str(&serde_json::to_string(&request).unwrap()).unwrap();
    assert_eq!(written, expected);
}

#[test]
fn minimal_chat_request_gets_defaults() {
    let request: ChatCompletionRequest =
        serde_json::from_str(r#"{"messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
    assert_eq!(request.model, None);
    assert!(!request.stream);
    assert!(!request.logprobs);
    assert!(request.tools.is_empty());
    assert!(request.chat_template_kwargs.is_empty());
    assert_eq!(request.max_output_tokens(), None);
    assert_eq!(request.messages[0].content, Some(MessageContent::Text("Hi".into())));
}

#[test]
fn nulls_read_as_defaults() {
    let request: ChatCompletionRequest = serde_json::from_value(json!({
        "messages": [{"role": "assistant", "content": null, "tool_calls": null}],
        "stream": null, "logprobs": null, "tools": null, "chat_template_kwargs": null,
        "temperature": null, "stop": null, "tool_choice": null,
    }))
    .unwrap();
    assert!(!request.stream && !request.logprobs && request.tools.is_empty());
    assert_eq!(request.sampling.temperature, None);
    assert_eq!(request.sampling.stop, None);
    assert_eq!(request.tool_choice, None);
}

#[test]
fn deprecated_max_tokens_is_used_when_max_completion_tokens_is_absent() {
    let request: ChatCompletionRequest =
        serde_json::from_value(json!({"messages": [], "max_tokens": 7})).unwrap();
    assert_eq!(request.max_output_tokens(), Some(7));
    let request: ChatCompletionRequest = serde_json::from_value(
        json!({"messages": [], "max_tokens": 7, "max_completion_tokens": 9}),
    )
    .unwrap();
    assert_eq!(request.max_output_tokens(), Some(9));
}

#[test]
fn stop_accepts_a_string_or_an_array() {
    let one: StopSequences = serde_json::from_value(json!("END")).unwrap();
    assert_eq!(one.into_vec(), ["END"]);
    let many: StopSequences = serde_json::from_value(json!(["a", "b"])).unwrap();
    assert_eq!(many.into_vec(), ["a", "b"]);
}

#[test]
fn seed_takes_the_full_signed_64_bit_range() {
    for seed in [i64::MIN, -1, 0, i64::MAX] {
        let request: ChatCompletionRequest =
            serde_json::from_value(json!({"messages": [], "seed": seed})).unwrap();
        assert_eq!(request.sampling.seed, Some(seed));
    }
}

/// What a client may send in another shape than OpenAI's when its meaning is unambiguous:
/// tool-call arguments as a JSON object, and fields Spindle does not know on a message.
#[test]
fn arguments_as_an_object_and_unknown_message_fields_are_accepted() {
    let request: ChatCompletionRequest = serde_json::from_value(json!({
        "messages": [
            {"role": "user", "content": "Weather?", "cache_control": {"type": "ephemeral"}},
            {"role": "assistant", "content": null, "refusal": null, "annotations": [],
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "f", "arguments": {"city": "Paris", "days": 2}}}]},
        ],
    }))
    .unwrap();
    request.validate().unwrap();
    let arguments = &request.messages[1].tool_calls[0].function.arguments;
    assert_eq!(arguments, r#"{"city":"Paris","days":2}"#);
    // It is sent on as the string OpenAI's shape has.
    let written = serde_json::to_value(&request).unwrap();
    assert_eq!(written["messages"][1]["tool_calls"][0]["function"]["arguments"], json!(arguments));
}

#[test]
fn tool_call_type_may_be_left_out_in_history() {
    let request: ChatCompletionRequest = serde_json::from_value(json!({"messages": [{
        "role": "assistant",
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
    }]}))
    .unwrap();
    assert_eq!(request.messages[0].tool_calls[0].kind, ToolType::Function);
}

#[test]
fn completion_request_prompt_forms() {
    let text: CompletionRequest = serde_json::from_value(json!({"prompt": "Once upon"})).unwrap();
    assert_eq!(text.prompt, Prompt::Text("Once upon".into()));
    assert_eq!(text.prompt.as_text(), Some("Once upon"));

    let one: CompletionRequest = serde_json::from_value(json!({"prompt": ["Once upon"]})).unwrap();
    assert_eq!(one.prompt.as_text(), Some("Once upon"));

    let ids: CompletionRequest = serde_json::from_value(json!({"prompt": [1, 2, 3]})).unwrap();
    assert_eq!(ids.prompt, Prompt::TokenIds(vec![1, 2, 3]));
    assert_eq!(ids.prompt.as_text(), None);
}

#[test]
fn completion_request_fields_and_max_tokens_default() {
    let request: CompletionRequest = serde_json::from_value(json!({
        "model": "gpt-3.5-turbo-instruct",
        "prompt": "Say this is a test",
        "temperature": 0,
        "logprobs": 5,
        "echo": true,
        "stop": "\n",
        "best_of": 1,
    }))
    .unwrap();
    request.validate().unwrap();
    assert_eq!(request.max_tokens, Some(DEFAULT_COMPLETION_MAX_TOKENS));
    assert_eq!(request.sampling.temperature, Some(0.0));
    assert_eq!(request.logprobs, Some(5));
    assert!(request.echo);
    assert_eq!(request.sampling.stop, Some(StopSequences::One("\n".into())));

    // An explicit null lifts the limit, and survives a round trip.
    let unlimited: CompletionRequest =
        serde_json::from_value(json!({"prompt": "x", "max_tokens": null})).unwrap();
    assert_eq!(unlimited.max_tokens, None);
    let again: CompletionRequest =
        serde_json::from_str(&serde_json::to_string(&unlimited).unwrap()).unwrap();
    assert_eq!(again, unlimited);
    assert_eq!(CompletionRequest::default().max_tokens, Some(DEFAULT_COMPLETION_MAX_TOKENS));
}

#[test]
fn tokenize_and_detokenize_requests() {
    let by_prompt: TokenizeRequest = serde_json::from_value(
        json!({"model": "m", "prompt": "Hello", "add_special_tokens": false}),
    )
    .unwrap();
    assert_eq!(by_prompt.prompt.as_deref(), Some("Hello"));
    assert_eq!(by_prompt.add_special_tokens, Some(false));
    let by_messages: TokenizeRequest =
        serde_json::from_value(json!({"messages": [{"role": "user", "content": "Hello"}]}))
            .unwrap();
    assert_eq!(by_messages.messages.unwrap().len(), 1);

    let detokenize: DetokenizeRequest =
        serde_json::from_value(json!({"tokens": [9707, 0]})).unwrap();
    assert_eq!(detokenize.tokens, [9707, 0]);
}

/// Parses from text, as the server does, rather than from a `Value`.
fn parses<T: serde::de::DeserializeOwned>(body: &Value) -> bool {
    serde_json::from_str::<T>(&body.to_string()).is_ok()
}

/// Each body has one field of the wrong JSON type (or lacks a required one); none may
/// deserialize.
#[test]
fn wrong_json_types_fail_to_deserialize() {
    let user = json!([{"role": "user", "content": "Hi"}]);
    let chat_bodies = [
        json!({"messages": "Hi"}),
        json!({}),
        json!({"messages": user, "stream": "true"}),
        json!({"messages": user, "temperature": "0.5"}),
        json!({"messages": user, "max_tokens": -1}),
        json!({"messages": user, "max_tokens": 1.5}),
        json!({"messages": user, "top_k": 1.5}),
        json!({"messages": user, "seed": "42"}),
        json!({"messages": user, "seed": 1.5}),
        json!({"messages": user, "n": "1"}),
        json!({"messages": user, "stop": 5}),
        json!({"messages": user, "stop": [1, 2]}),
        json!({"messages": user, "logprobs": 5}),
        json!({"messages": user, "top_logprobs": -1}),
        json!({"messages": user, "stream_options": {"include_usage": "yes"}}),
        json!({"messages": user, "chat_template_kwargs": ["enable_thinking"]}),
        json!({"messages": user, "thinking_budget": -5}),
        json!({"messages": [{"role": 1, "content": "Hi"}]}),
        json!({"messages": [{"content": "Hi"}]}),
        json!({"messages": [{"role": "user", "content": 5}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
        json!({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        json!({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": 5}}]}]}),
        json!({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ["x"]}}]}]}),
        json!({"messages": user, "tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
        json!({"messages": user, "tools": [{"type": "function", "function": {"description": "no name"}}]}),
        json!({"messages": user, "tools": {"type": "function"}}),
    ];
    for body in chat_bodies {
        assert!(!parses::<ChatCompletionRequest>(&body), "accepted {body}");
    }

    let completion_bodies = [
        json!({"prompt": 5}),
        json!({"prompt": [[1, 2]]}),
        json!({"prompt": [-1]}),
        json!({"prompt": "x", "logprobs": true}),
        json!({"prompt": "x", "echo": 1}),
        json!({"prompt": "x", "max_tokens": "16"}),
    ];
    for body in completion_bodies {
        assert!(!parses::<CompletionRequest>(&body), "accepted {body}");
    }

    assert!(!parses::<TokenizeRequest>(&json!({"prompt": ["Hello"]})));
    assert!(!parses::<DetokenizeRequest>(&json!({"tokens": ["Hello"]})));
    assert!(!parses::<DetokenizeRequest>(&json!({})));
}

#[test]
fn untagged_errors_say_what_was_expected() {
    let error = serde_json::from_value::<ChatCompletionRequest>(
        json!({"messages": [{"role": "user", "content": 5}]}),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("a string or an array of content parts"), "{error}");
}
