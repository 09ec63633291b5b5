//! The Responses API's wire types: a Codex-shaped request reads, its input items become the
//! server's items (or a 400 naming the item), and output items and stream events serialize to
//! OpenAI's shapes.

use serde_json::{json, Value};
use spindle_api::{
    InputItem, ItemStatus, OutputItem, OutputPart, ReasoningPart, ResponseEvent, ResponsesRequest,
    Role, StreamEvent,
};

fn request(body: Value) -> ResponsesRequest {
    serde_json::from_value(body).unwrap()
}

#[test]
fn a_codex_request_reads_with_its_extras_ignored() {
    let body = json!({
        "model": "qwen", "instructions": "You are Codex.", "input": [], "stream": true, "store": false,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}, "strict": false},
                  {"type": "web_search"}],
        "tool_choice": "auto", "parallel_tool_calls": false,
        "reasoning": {"effort": "medium", "summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "abc", "text": {"verbosity": "low"}, "client_metadata": {"x": "y"},
        "service_tier": "auto", "truncation": "disabled",
    });
    let request = request(body);
    request.validate().unwrap();
    assert!(!request.stores() && request.stream);
    assert_eq!(request.tools.len(), 2);
    assert_eq!(request.reasoning.unwrap().effort.as_deref(), Some("medium"));
    assert!(ResponsesRequest::default().stores(), "OpenAI stores unless told not to");
}

#[test]
fn input_items_become_the_servers_items() {
    let items = request(json!({"input": [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
         "content": [{"type": "reasoning_text", "text": "long"}], "encrypted_content": null},
        {"type": "reasoning", "summary": [], "content": null, "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_customer", "namespace": "crm", "arguments": "{}"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "Ada"}]},
    ]}))
    .input_items()
    .unwrap();
    let message = |role: &str, content: &str| InputItem::Message {
        role: role.into(),
        content: content.into(),
    };
    assert_eq!(
        items,
        vec![
            message("developer", "Be brief."),
            message("user", "a\nb"),
            InputItem::Reasoning { text: "long".into() },
            message("assistant", "Calling."),
            InputItem::FunctionCall {
                call_id: "call_1".into(),
                name: "get_customer".into(),
                namespace: Some("crm".into()),
                arguments: "{}".into(),
            },
            InputItem::FunctionCallOutput { call_id: "call_1".into(), output: "Ada".into() },
        ]
    );
    assert_eq!(request(json!({"input": "Hi"})).input_items().unwrap(), vec![message("user", "Hi")]);
    let summary_only = json!({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}]});
    assert_eq!(
        request(summary_only).input_items().unwrap(),
        vec![InputItem::Reasoning { text: "s".into() }]
    );
}

#[test]
fn a_bad_item_is_a_400_naming_it() {
    let cases = [
        (json!([{"type": "bogus"}]), "input[0].type"),
        (json!([{"content": "no role"}]), "input[0]"),
        (
            json!([{"role": "user", "content": "ok"}, {"role": "tool", "content": "x"}]),
            "input[1].role",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]),
            "input[0].content[0].type",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_text"}]}]),
            "input[0].content[0].text",
        ),
        (json!([{"type": "function_call", "name": "f", "arguments": "{}"}]), "input[0]"),
        (
            json!([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]),
            "input[0].output[0].type",
        ),
    ];
    for (input, param) in cases {
        let error = request(json!({"input": input})).input_items().unwrap_err();
        assert_eq!((error.status, error.param.as_deref()), (400, Some(param)), "{input}: {error}");
    }
    let error = request(json!({"input": "x", "max_output_tokens": 0})).validate().unwrap_err();
    assert_eq!(error.param.as_deref(), Some("max_output_tokens"));
}

#[test]
fn output_items_and_events_serialize_to_openais_shapes() {
    let call = OutputItem::FunctionCall {
        id: "fc_1".into(),
        call_id: "call_1".into(),
        name: "shell".into(),
        namespace: None,
        arguments: "{\"cmd\":\"ls\"}".into(),
        status: ItemStatus::Completed,
    };
    let event = StreamEvent {
        sequence_number: 7,
        event: ResponseEvent::OutputItemDone { output_index: 2, item: call.clone() },
    };
    assert_eq!(
        serde_json::to_value(&event).unwrap(),
        json!({"sequence_number": 7, "type": "response.output_item.done", "output_index": 2, "item": {
            "type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell",
            "arguments": "{\"cmd\":\"ls\"}", "status": "completed"}})
    );
    let message = OutputItem::Message {
        id: "msg_1".into(),
        role: Role::Assistant,
        status: ItemStatus::Incomplete,
        content: vec![OutputPart::OutputText { text: "Hi".into(), annotations: vec![] }],
    };
    assert_eq!(
        serde_json::to_value(&message).unwrap(),
        json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "incomplete",
               "content": [{"type": "output_text", "text": "Hi", "annotations": []}]})
    );
    let reasoning = OutputItem::Reasoning {
        id: "rs_1".into(),
        summary: vec![],
        content: vec![ReasoningPart::ReasoningText { text: "hmm".into() }],
        status: ItemStatus::Completed,
    };
    // Replayed as the next request's input, the output reads back as what it said.
    let replayed: Vec<InputItem> =
        [reasoning, message, call].iter().filter_map(OutputItem::to_input).collect();
    assert_eq!(
        replayed,
        vec![
            InputItem::Reasoning { text: "hmm".into() },
            InputItem::Message { role: "assistant".into(), content: "Hi".into() },
            InputItem::FunctionCall {
                call_id: "call_1".into(),
                name: "shell".into(),
                namespace: None,
                arguments: "{\"cmd\":\"ls\"}".into()
            },
        ]
    );
}
