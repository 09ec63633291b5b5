//! Responses serialize to OpenAI's JSON shapes, nulls included, and read back from real
//! OpenAI payloads (as the benchmark client does).

use serde::Serialize;
use serde_json::{json, Value};
use spindle_api::{
    ApiError, AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatDelta, ChoiceLogprobs, Completion, CompletionChoice, CompletionChunk, CompletionLogprobs,
    DetokenizeResponse, ErrorResponse, FinishReason, FunctionCall, FunctionCallDelta,
    LegacyTopLogprobs, ModelCard, ModelList, Role, TokenLogprob, TokenizeResponse, ToolCall,
    ToolCallDelta, ToolType, TopLogprob, Usage,
};

/// Serializes through text, as the server sends it, so `f32`s compare as the client reads them.
fn wire<T: Serialize>(value: &T) -> Value {
    serde_json::from_str(&serde_json::to_string(value).unwrap()).unwrap()
}

fn weather_call() -> ToolCall {
    ToolCall {
        id: "call_abc123".into(),
        kind: ToolType::Function,
        function: FunctionCall {
            name: "get_current_weather".into(),
            arguments: r#"{"location": "Boston, MA"}"#.into(),
        },
    }
}

#[test]
fn chat_completion_with_tool_calls() {
    let mut usage = Usage::new(82, 17);
    usage.prompt_tokens_details.cached_tokens = 64;
    let completion = ChatCompletion {
        id: "chatcmpl-abc123".into(),
        created: 1699896916,
        model: "gpt-4o-mini".into(),
        system_fingerprint: Some("fp_44709d6fcb".into()),
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                content: None,
                reasoning_content: None,
                tool_calls: vec![weather_call()],
            },
            logprobs: None,
            finish_reason: FinishReason::ToolCalls,
        }],
        usage,
    };
    assert_eq!(
        wire(&completion),
        json!({
            "id": "chatcmpl-abc123",
            "object": "chat.completion",
            "created": 1699896916,
            "model": "gpt-4o-mini",
            "system_fingerprint": "fp_44709d6fcb",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": null,
                    "tool_calls": [{
                        "id": "call_abc123",
                        "type": "function",
                        "function": {"name": "get_current_weather", "arguments": "{\"location\": \"Boston, MA\"}"}
                    }]
                },
                "logprobs": null,
                "finish_reason": "tool_calls"
            }],
            "usage": {
                "prompt_tokens": 82,
                "completion_tokens": 17,
                "total_tokens": 99,
                "prompt_tokens_details": {"cached_tokens": 64},
                "completion_tokens_details": {"reasoning_tokens": 0}
            }
        })
    );
}

#[test]
fn chat_completion_with_reasoning_and_logprobs() {
    let hello =
        TopLogprob { token: "Hello".into(), logprob: -0.31725305, bytes: b"Hello".to_vec() };
    let hi = TopLogprob { token: "Hi".into(), logprob: -1.3190403, bytes: b"Hi".to_vec() };
    let mut usage = Usage::new(9, 12);
    usage.completion_tokens_details.reasoning_tokens = 10;
    let completion = ChatCompletion {
        id: "chatcmpl-1".into(),
        created: 1,
        model: "qwen3".into(),
        system_fingerprint: None,
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                content: Some("Hello".into()),
                reasoning_content: Some("The user greets me.".into()),
                tool_calls: vec![],
            },
            logprobs: Some(ChoiceLogprobs {
                content: vec![TokenLogprob {
                    token: hello.token.clone(),
                    logprob: hello.logprob,
                    bytes: hello.bytes.clone(),
                    top_logprobs: vec![hello, hi],
                }],
            }),
            finish_reason: FinishReason::Stop,
        }],
        usage,
    };
    let written = wire(&completion);
    assert_eq!(written["system_fingerprint"], Value::Null);
    assert_eq!(
        written["choices"][0],
        json!({
            "index": 0,
            "message": {"role": "assistant", "content": "Hello", "reasoning_content": "The user greets me."},
            "logprobs": {"content": [{
                "token": "Hello",
                "logprob": -0.31725305,
                "bytes": [72, 101, 108, 108, 111],
                "top_logprobs": [
                    {"token": "Hello", "logprob": -0.31725305, "bytes": [72, 101, 108, 108, 111]},
                    {"token": "Hi", "logprob": -1.3190403, "bytes": [72, 105]}
                ]
            }]},
            "finish_reason": "stop"
        })
    );
    assert_eq!(written["usage"]["completion_tokens_details"], json!({"reasoning_tokens": 10}));
}

fn chunk(choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
    ChatCompletionChunk {
        id: "chatcmpl-123".into(),
        created: 1694268190,
        model: "gpt-4o-mini".into(),
        system_fingerprint: Some("fp_44709d6fcb".into()),
        choices,
        usage,
        prompt_progress: None,
    }
}

fn choice(delta: ChatDelta, finish_reason: Option<FinishReason>) -> ChatChunkChoice {
    ChatChunkChoice { index: 0, delta, logprobs: None, finish_reason }
}

#[test]
fn streamed_chat_chunks() {
    let envelope = json!({
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
    });
    let with = |choices: Value| {
        let mut expected = envelope.clone();
        expected["choices"] = choices;
        expected
    };

    let first = choice(
        ChatDelta {
            role: Some(Role::Assistant),
            content: Some(String::new()),
            ..Default::default()
        },
        None,
    );
    assert_eq!(
        wire(&chunk(vec![first], None)),
        with(json!([{
            "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null
        }]))
    );

    let text = choice(ChatDelta { content: Some("Hello".into()), ..Default::default() }, None);
    assert_eq!(
        wire(&chunk(vec![text], None)),
        with(
            json!([{"index": 0, "delta": {"content": "Hello"}, "logprobs": null, "finish_reason": null}])
        )
    );

    let thinking =
        choice(ChatDelta { reasoning_content: Some("Hmm".into()), ..Default::default() }, None);
    assert_eq!(
        wire(&chunk(vec![thinking], None))["choices"][0]["delta"],
        json!({"reasoning_content": "Hmm"})
    );

    let last = choice(ChatDelta::default(), Some(FinishReason::Stop));
    assert_eq!(
        wire(&chunk(vec![last], None)),
        with(json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}]))
    );

    let mut usage_chunk = with(json!([]));
    usage_chunk["usage"] = json!({
        "prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21,
        "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}
    });
    assert_eq!(wire(&chunk(vec![], Some(Usage::new(9, 12)))), usage_chunk);
}

#[test]
fn streamed_tool_call_pieces() {
    let opening = ToolCallDelta {
        index: 0,
        id: Some("call_DdmO9pD3xa9XTPNJ32zg2hcA".into()),
        kind: Some(ToolType::Function),
        function: FunctionCallDelta { name: Some("get_weather".into()), arguments: String::new() },
    };
    let piece = ToolCallDelta {
        index: 0,
        id: None,
        kind: None,
        function: FunctionCallDelta { name: None, arguments: "{\"location\":".into() },
    };
    let delta =
        ChatDelta { role: Some(Role::Assistant), tool_calls: vec![opening], ..Default::default() };
    assert_eq!(
        wire(&chunk(vec![choice(delta, None)], None))["choices"][0]["delta"],
        json!({"role": "assistant", "tool_calls": [{
            "index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}
        }]})
    );
    let delta = ChatDelta { tool_calls: vec![piece], ..Default::default() };
    assert_eq!(
        wire(&chunk(vec![choice(delta, None)], None))["choices"][0]["delta"],
        json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"location\":"}}]})
    );
    let end = choice(ChatDelta::default(), Some(FinishReason::ToolCalls));
    assert_eq!(wire(&chunk(vec![end], None))["choices"][0]["finish_reason"], "tool_calls");
}

/// OpenAI's own payloads carry fields Spindle never sends (`refusal`, `annotations`,
/// `service_tier`, audio token counts); a client must still read them.
#[test]
fn reads_openai_responses() {
    let completion: ChatCompletion = serde_json::from_value(json!({
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion",
        "created": 1741569952,
        "model": "gpt-4.1-2025-04-14",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant", "content": "Hello! How can I assist you today?",
                "refusal": null, "annotations": []
            },
            "logprobs": null,
            "finish_reason": "stop"
        }],
        "usage": {
            "prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
        },
        "service_tier": "default",
        "system_fingerprint": null
    }))
    .unwrap();
    assert_eq!(
        completion.choices[0].message.content.as_deref(),
        Some("Hello! How can I assist you today?")
    );
    assert_eq!(completion.choices[0].finish_reason, FinishReason::Stop);
    assert_eq!(completion.usage.total_tokens, 29);

    let chunk: ChatCompletionChunk = serde_json::from_value(json!({
        "id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
        "model": "gpt-4o-mini", "system_fingerprint": "fp_44709d6fcb",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
        ]}, "logprobs": null, "finish_reason": null}],
        "usage": null
    }))
    .unwrap();
    assert_eq!(chunk.choices[0].delta.tool_calls[0].function.name.as_deref(), Some("get_weather"));
    assert_eq!(chunk.usage, None);

    // vLLM sends null details.
    let usage: Usage = serde_json::from_value(json!({
        "prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6, "prompt_tokens_details": null
    }))
    .unwrap();
    assert_eq!(usage, Usage::new(5, 1));
}

#[test]
fn legacy_completion_with_echo_and_logprobs() {
    let logprobs = CompletionLogprobs {
        tokens: vec!["Say".into(), " this".into()],
        token_logprobs: vec![None, Some(-0.5)],
        top_logprobs: vec![
            None,
            Some(LegacyTopLogprobs(vec![(" this".into(), -0.5), (" that".into(), -1.25)])),
        ],
        text_offset: vec![0, 3],
    };
    let completion = Completion {
        id: "cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7".into(),
        created: 1589478378,
        model: "gpt-3.5-turbo-instruct".into(),
        system_fingerprint: Some("fp_44709d6fcb".into()),
        choices: vec![CompletionChoice {
            text: "Say this".into(),
            index: 0,
            logprobs: Some(logprobs),
            finish_reason: Some(FinishReason::Length),
        }],
        usage: Usage::new(1, 1),
    };
    let written = wire(&completion);
    assert_eq!(written["object"], "text_completion");
    assert_eq!(written["system_fingerprint"], "fp_44709d6fcb");
    assert_eq!(
        written["choices"],
        json!([{
            "text": "Say this",
            "index": 0,
            "logprobs": {
                "tokens": ["Say", " this"],
                "token_logprobs": [null, -0.5],
                "top_logprobs": [null, {" this": -0.5, " that": -1.25}],
                "text_offset": [0, 3]
            },
            "finish_reason": "length"
        }])
    );
    let read: Completion = serde_json::from_value(written).unwrap();
    assert_eq!(read, completion);
}

#[test]
fn legacy_top_logprobs_keep_order_and_the_first_of_repeated_texts() {
    let repeated = LegacyTopLogprobs(vec![
        ("\u{fffd}".into(), -0.1),
        ("\u{fffd}".into(), -0.2),
        ("a".into(), -0.3),
    ]);
    assert_eq!(serde_json::to_string(&repeated).unwrap(), r#"{"�":-0.1,"a":-0.3}"#);
    let read: LegacyTopLogprobs = serde_json::from_str(r#"{"z":-0.25,"a":-0.5}"#).unwrap();
    assert_eq!(read.0, [("z".to_owned(), -0.25), ("a".to_owned(), -0.5)]);
}

#[test]
fn streamed_legacy_chunk() {
    let chunk = CompletionChunk {
        id: "cmpl-1".into(),
        created: 1,
        model: "smollm2".into(),
        system_fingerprint: None,
        choices: vec![CompletionChoice {
            text: " upon".into(),
            index: 0,
            logprobs: None,
            finish_reason: None,
        }],
        usage: None,
    };
    assert_eq!(
        wire(&chunk),
        json!({
            "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "smollm2",
            "system_fingerprint": null,
            "choices": [{"text": " upon", "index": 0, "logprobs": null, "finish_reason": null}]
        })
    );
}

#[test]
fn model_list_tokenize_and_detokenize() {
    let models = ModelList {
        data: vec![ModelCard {
            id: "smollm2".into(),
            created: 1700000000,
            owned_by: "spindle".into(),
            max_model_len: Some(8192),
            sampling_defaults: None,
            status: None,
        }],
    };
    assert_eq!(
        wire(&models),
        json!({"object": "list", "data": [{"id": "smollm2", "object": "model",
            "created": 1700000000, "owned_by": "spindle", "max_model_len": 8192}]})
    );
    // Other servers' listings leave the context out.
    let card: ModelCard = serde_json::from_value(
        json!({"id": "m", "object": "model", "created": 1, "owned_by": "someone"}),
    )
    .unwrap();
    assert_eq!(card.max_model_len, None);
    let tokens = TokenizeResponse { tokens: vec![9707, 11], count: 2, max_model_len: 8192 };
    assert_eq!(wire(&tokens), json!({"tokens": [9707, 11], "count": 2, "max_model_len": 8192}));
    assert_eq!(wire(&DetokenizeResponse { prompt: "Hello,".into() }), json!({"prompt": "Hello,"}));
}

#[test]
fn error_bodies() {
    const TOO_LONG: &str =
        "This model's maximum context length is 4097 tokens. However, your messages resulted in 4135 tokens.";
    let error = ApiError::context_length_exceeded(TOO_LONG);
    assert_eq!(error.status, 400);
    assert_eq!(
        wire(&error.to_response_body()),
        json!({"error": {
            "message": TOO_LONG,
            "type": "invalid_request_error",
            "param": null,
            "code": "context_length_exceeded"
        }})
    );

    let bad =
        ApiError::bad_request("temperature must be between 0 and 2, got 3", Some("temperature"));
    assert_eq!(
        wire(&bad.to_response_body()),
        json!({"error": {"message": "temperature must be between 0 and 2, got 3",
            "type": "invalid_request_error", "param": "temperature", "code": null}})
    );

    let cases = [
        (ApiError::not_found("The model `gpt-5` does not exist"), 404, "not_found_error"),
        (ApiError::unauthorized("Incorrect API key provided"), 401, "authentication_error"),
        (ApiError::too_large("request body is over 32 MiB"), 413, "invalid_request_error"),
        (ApiError::rate_limited("the queue is full"), 429, "rate_limit_error"),
        (ApiError::internal("the engine stopped"), 500, "server_error"),
    ];
    for (error, status, kind) in cases {
        assert_eq!(error.status, status);
        let body = error.to_response_body();
        assert_eq!(body.error.kind, kind);
        assert_eq!((body.error.param, body.error.code), (None, None));
    }

    // An error whose type is not one of Spindle's still reads.
    let other: ErrorResponse = serde_json::from_value(json!({"error": {
        "message": "bad", "type": "BadRequestError", "param": null, "code": null
    }}))
    .unwrap();
    assert_eq!(other.error.kind, "BadRequestError");
}
