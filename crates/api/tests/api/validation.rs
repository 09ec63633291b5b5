//! Each `validate` rule: the edge values pass, the values just past them fail, and the error
//! is a 400 naming the field.

use serde_json::{json, Value};
use spindle_api::{ApiError, ChatCompletionRequest, CompletionRequest, ErrorKind, TokenizeRequest};

fn chat(extra: Value) -> Result<(), ApiError> {
    let mut body = json!({"messages": [{"role": "user", "content": "Hi"}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    serde_json::from_value::<ChatCompletionRequest>(body).unwrap().validate()
}

fn completion(extra: Value) -> Result<(), ApiError> {
    let mut body = json!({"prompt": "Once upon"});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    serde_json::from_value::<CompletionRequest>(body).unwrap().validate()
}

fn tokenize(body: Value) -> Result<(), ApiError> {
    serde_json::from_value::<TokenizeRequest>(body).unwrap().validate()
}

/// Asserts a 400 invalid-request error naming `param`, and returns its message.
#[track_caller]
fn rejected(result: Result<(), ApiError>, param: &str) -> String {
    let error = result.expect_err("should be rejected");
    assert_eq!(error.status, 400);
    assert_eq!(error.kind, ErrorKind::InvalidRequest);
    assert_eq!(error.param.as_deref(), Some(param), "{}", error.message);
    error.message
}

#[test]
fn messages_must_not_be_empty() {
    rejected(chat(json!({"messages": []})), "messages");
}

#[test]
fn every_openai_role_is_accepted() {
    for role in ["system", "developer", "user", "assistant", "tool"] {
        chat(json!({"messages": [{"role": role, "content": "x"}]})).unwrap();
    }
}

#[test]
fn unknown_role_names_the_role_and_the_index() {
    let messages = json!([{"role": "user", "content": "Hi"}, {"role": "robot", "content": "beep"}]);
    let message = rejected(chat(json!({"messages": messages})), "messages[1].role");
    assert!(message.contains("`robot`") && message.contains("messages[1]"), "{message}");
    // Roles are case-sensitive, as in OpenAI.
    rejected(chat(json!({"messages": [{"role": "User", "content": "Hi"}]})), "messages[0].role");
}

#[test]
fn only_text_content_parts_are_accepted() {
    let parts = json!([
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]);
    let message = rejected(
        chat(json!({"messages": [{"role": "user", "content": parts}]})),
        "messages[0].content[1].type",
    );
    assert!(message.contains("image_url"), "{message}");

    let no_text = json!([{"type": "text"}]);
    rejected(
        chat(json!({"messages": [{"role": "user", "content": no_text}]})),
        "messages[0].content[0].text",
    );
}

#[test]
fn stop_allows_four_sequences() {
    chat(json!({"stop": "one"})).unwrap();
    chat(json!({"stop": ["a", "b", "c", "d"]})).unwrap();
    rejected(chat(json!({"stop": ["a", "b", "c", "d", "e"]})), "stop");
    rejected(completion(json!({"stop": ["a", "b", "c", "d", "e"]})), "stop");
}

#[test]
fn top_logprobs_is_at_most_20_and_needs_logprobs() {
    chat(json!({"logprobs": true, "top_logprobs": 0})).unwrap();
    chat(json!({"logprobs": true, "top_logprobs": 20})).unwrap();
    rejected(chat(json!({"logprobs": true, "top_logprobs": 21})), "top_logprobs");
    rejected(chat(json!({"top_logprobs": 2})), "top_logprobs");
    rejected(chat(json!({"logprobs": false, "top_logprobs": 2})), "top_logprobs");
}

#[test]
fn n_must_be_one() {
    chat(json!({"n": 1})).unwrap();
    rejected(chat(json!({"n": 0})), "n");
    rejected(chat(json!({"n": 2})), "n");
    rejected(completion(json!({"n": 2})), "n");
}

#[test]
fn token_limits_are_at_least_one() {
    chat(json!({"max_tokens": 1, "max_completion_tokens": 1})).unwrap();
    rejected(chat(json!({"max_tokens": 0})), "max_tokens");
    rejected(chat(json!({"max_completion_tokens": 0})), "max_completion_tokens");
    completion(json!({"max_tokens": 1})).unwrap();
    rejected(completion(json!({"max_tokens": 0})), "max_tokens");
}

#[test]
fn temperature_is_between_0_and_2() {
    chat(json!({"temperature": 0.0})).unwrap();
    chat(json!({"temperature": 2.0})).unwrap();
    rejected(chat(json!({"temperature": -0.01})), "temperature");
    let message = rejected(chat(json!({"temperature": 2.01})), "temperature");
    assert_eq!(message, "temperature must be between 0 and 2, got 2.01");
}

#[test]
fn top_p_is_in_zero_exclusive_to_one() {
    chat(json!({"top_p": 1.0})).unwrap();
    chat(json!({"top_p": 1e-6})).unwrap();
    rejected(chat(json!({"top_p": 0.0})), "top_p");
    rejected(chat(json!({"top_p": 1.01})), "top_p");
}

#[test]
fn top_k_is_at_least_minus_one() {
    chat(json!({"top_k": -1})).unwrap();
    chat(json!({"top_k": 0})).unwrap();
    chat(json!({"top_k": 40})).unwrap();
    rejected(chat(json!({"top_k": -2})), "top_k");
}

#[test]
fn min_p_is_between_0_and_1() {
    chat(json!({"min_p": 0.0})).unwrap();
    chat(json!({"min_p": 1.0})).unwrap();
    rejected(chat(json!({"min_p": -0.01})), "min_p");
    rejected(chat(json!({"min_p": 1.01})), "min_p");
}

#[test]
fn repetition_penalty_is_positive() {
    chat(json!({"repetition_penalty": 1e-6})).unwrap();
    chat(json!({"repetition_penalty": 1.3})).unwrap();
    rejected(chat(json!({"repetition_penalty": 0.0})), "repetition_penalty");
}

#[test]
fn presence_and_frequency_penalties_are_between_minus_2_and_2() {
    for param in ["presence_penalty", "frequency_penalty"] {
        chat(json!({param: -2.0})).unwrap();
        chat(json!({param: 2.0})).unwrap();
        rejected(chat(json!({param: -2.01})), param);
        rejected(chat(json!({param: 2.01})), param);
    }
}

#[test]
fn stream_options_need_stream() {
    chat(json!({"stream": true, "stream_options": {"include_usage": true}})).unwrap();
    rejected(chat(json!({"stream_options": {"include_usage": true}})), "stream_options");
    completion(json!({"stream": true, "stream_options": {"include_usage": true}})).unwrap();
    rejected(completion(json!({"stream": false, "stream_options": {}})), "stream_options");
}

#[test]
fn completion_prompt_array_holds_exactly_one_string() {
    completion(json!({"prompt": ["one"]})).unwrap();
    completion(json!({"prompt": [1, 2, 3]})).unwrap();
    rejected(completion(json!({"prompt": []})), "prompt");
    rejected(completion(json!({"prompt": ["one", "two"]})), "prompt");
}

#[test]
fn completion_logprobs_is_at_most_20() {
    completion(json!({"logprobs": 0})).unwrap();
    completion(json!({"logprobs": 20})).unwrap();
    rejected(completion(json!({"logprobs": 21})), "logprobs");
}

#[test]
fn completion_checks_sampling_ranges() {
    completion(json!({"temperature": 2.0, "top_p": 1.0})).unwrap();
    rejected(completion(json!({"temperature": 2.01})), "temperature");
    rejected(completion(json!({"top_p": 0.0})), "top_p");
}

#[test]
fn tokenize_takes_prompt_or_messages_but_not_both() {
    tokenize(json!({"prompt": "Hello"})).unwrap();
    tokenize(json!({"messages": [{"role": "user", "content": "Hello"}]})).unwrap();
    rejected(tokenize(json!({})), "prompt");
    rejected(tokenize(json!({"prompt": "Hello", "messages": []})), "messages");
    rejected(tokenize(json!({"messages": []})), "messages");
    rejected(
        tokenize(json!({"messages": [{"role": "bot", "content": "Hello"}]})),
        "messages[0].role",
    );
}
