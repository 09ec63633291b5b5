//! Tool calls read out of model outputs written the way Qwen3.5 / Qwen3-Coder, Qwen2.5
//! (Hermes) and Llama 3 write them, well-formed and broken.
//!
//! Every case checks the whole-message parse against exact expectations, then streams the
//! same text cut at every char boundary (and one char at a time) and requires the same
//! message, with each call started once before its fragments and the fragments forming one
//! JSON object.

use serde_json::{json, Value};
use spindle_chat::{
    parse_message, ParsedMessage, ToolCallFormat, ToolCallParser, ToolEvent, ToolSchema,
};

use ToolCallFormat::{Hermes, Llama3Json, QwenXml};

fn tools() -> Vec<ToolSchema> {
    let tool = |name: &str, properties: Value| ToolSchema {
        name: name.into(),
        parameters: json!({"type": "object", "properties": properties}),
    };
    vec![
        tool(
            "get_weather",
            json!({
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "detailed": {"type": ["boolean", "null"]},
            }),
        ),
        tool(
            "write_file",
            json!({
                "path": {"type": "string"},
                "content": {"type": "string"},
                "options": {"type": "object"},
                "mode": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            }),
        ),
        tool(
            "search",
            json!({
                "query": {"type": "string"},
                "filters": {"type": "object"},
                "limit": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}},
            }),
        ),
        ToolSchema { name: "get_time".into(), parameters: Value::Null },
    ]
}

/// Parses `text` whole and checks the exact content and calls, then checks every streamed
/// cut of it against the whole parse.
fn check(format: ToolCallFormat, text: &str, content: &str, calls: &[(&str, Value)]) {
    let tools = tools();
    let whole = parse_message(format, &tools, text);
    assert_eq!(whole.content, content, "{format:?} content of {text:?}");
    let parsed: Vec<(&str, Value)> = whole
        .calls
        .iter()
        .map(|call| {
            let arguments = serde_json::from_str(&call.arguments).unwrap_or_else(|e| {
                panic!("{format:?}: arguments {:?} of {text:?}: {e}", call.arguments)
            });
            (call.name.as_str(), arguments)
        })
        .collect();
    assert_eq!(parsed, calls, "{format:?} calls of {text:?}");

    let cuts: Vec<usize> = text.char_indices().map(|(at, _)| at).chain([text.len()]).collect();
    for &cut in &cuts {
        let (head, tail) = text.split_at(cut);
        assert_eq!(
            stream(format, &tools, &[head, tail]),
            whole,
            "{format:?} cut at {cut} of {text:?}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(stream(format, &tools, &pieces), whole, "{format:?} char by char of {text:?}");
}

/// Streams `pieces` through a parser, checks the events are well-formed, and collects them.
fn stream(format: ToolCallFormat, tools: &[ToolSchema], pieces: &[&str]) -> ParsedMessage {
    let mut parser = ToolCallParser::new(format, tools);
    let mut events: Vec<ToolEvent> = pieces.iter().flat_map(|piece| parser.push(piece)).collect();
    events.extend(parser.finish());

    let mut arguments: Vec<String> = Vec::new();
    for event in &events {
        match event {
            ToolEvent::Content(_) => {}
            ToolEvent::CallStart { index, .. } => {
                assert_eq!(
                    *index,
                    arguments.len(),
                    "{pieces:?}: call {index} started out of order: {events:?}"
                );
                arguments.push(String::new());
            }
            ToolEvent::Arguments { index, fragment } => match arguments.get_mut(*index) {
                Some(text) => text.push_str(fragment),
                None => {
                    panic!("{pieces:?}: fragment of call {index} before it started: {events:?}")
                }
            },
        }
    }
    for text in &arguments {
        let value: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("{pieces:?}: arguments {text:?}: {e}"));
        assert!(value.is_object(), "{pieces:?}: arguments {text:?} are not an object");
    }
    ParsedMessage::collect(events)
}

// --- Qwen3.5 / Qwen3-Coder XML ---

#[test]
fn qwen_xml_text_then_two_parallel_calls() {
    let text = "I'll check the weather in both cities.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n東京\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n<parameter=detailed>\nTrue\n</parameter>\n</function>\n</tool_call>";
    check(
        QwenXml,
        text,
        "I'll check the weather in both cities.",
        &[
            ("get_weather", json!({"city": "Paris", "days": 3})),
            ("get_weather", json!({"city": "東京", "unit": "celsius", "detailed": true})),
        ],
    );
}

#[test]
fn qwen_xml_code_value_with_angle_brackets_newlines_and_nested_json() {
    let text = "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n<parameter=content>\nfn main() {\n    if 1 < 2 { println!(\"<ok> </parameter\"); }\n}\n\n</parameter>\n<parameter=options>\n{\"overwrite\": true, \"backup\": {\"keep\": [1, 2]}}\n</parameter>\n<parameter=mode>\nnull\n</parameter>\n</function>\n</tool_call>";
    check(
        QwenXml,
        text,
        "",
        &[(
            "write_file",
            json!({
                "path": "src/main.rs",
                "content": "fn main() {\n    if 1 < 2 { println!(\"<ok> </parameter\"); }\n}\n",
                "options": {"overwrite": true, "backup": {"keep": [1, 2]}},
                "mode": null,
            }),
        )],
    );
}

#[test]
fn qwen_xml_bare_function_with_text_after() {
    let text = "Searching now.\n<function=search>\n<parameter=query>\nrust \"async\" traits\n</parameter>\n<parameter=limit>\n2.5\n</parameter>\n<parameter=tags>\n[\"lang\", \"rust\"]\n</parameter>\n</function>\n\nI'll report back.";
    check(
        QwenXml,
        text,
        "Searching now.\n\nI'll report back.",
        &[(
            "search",
            json!({"query": "rust \"async\" traits", "limit": 2.5, "tags": ["lang", "rust"]}),
        )],
    );
}

#[test]
fn qwen_xml_json_where_a_string_is_declared_stays_a_string() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n{\"a\":1}\n</parameter>\n<parameter=days>\nthree\n</parameter>\n<parameter=note>\n42\n</parameter>\n</function>\n</tool_call>";
    check(
        QwenXml,
        text,
        "",
        &[("get_weather", json!({"city": "{\"a\":1}", "days": "three", "note": "42"}))],
    );
}

#[test]
fn qwen_xml_duplicate_parameter_keeps_the_first() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=city>\nLyon\n</parameter>\n<parameter=days>\n1\n</parameter>\n</function>\n</tool_call>";
    check(QwenXml, text, "", &[("get_weather", json!({"city": "Paris", "days": 1}))]);
}

#[test]
fn qwen_xml_missing_closing_tags_are_tolerated() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2\n</function>\n</tool_call>";
    check(QwenXml, text, "", &[("get_weather", json!({"city": "Paris", "days": 2}))]);
}

#[test]
fn qwen_xml_unterminated_value_closes_the_call() {
    let text = "Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\nline one\nline <two>";
    check(
        QwenXml,
        text,
        "Writing it.",
        &[("write_file", json!({"path": "a.txt", "content": "line one\nline <two>"}))],
    );
}

#[test]
fn qwen_xml_call_without_parameters_and_unknown_tool() {
    let text = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n<tool_call>\n<function=lookup>\n<parameter=id>\n7\n</parameter>\n</function>\n</tool_call>";
    check(QwenXml, text, "", &[("get_time", json!({})), ("lookup", json!({"id": "7"}))]);
}

#[test]
fn qwen_xml_tag_that_never_becomes_a_call_is_content() {
    let text =
        "Models wrap calls in <tool_call> tags and open each with <function=, then a name.\nDone.";
    check(QwenXml, text, text, &[]);
    let text = "Calling.\n<tool_call>\n<func";
    check(QwenXml, text, "Calling.\n<tool_call>\n<func", &[]);
}

// --- Hermes / Qwen2.5 ---

#[test]
fn hermes_text_then_two_calls() {
    let text = "Let me look both up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"café \\\"best\\\" <near> 🦀\", \"filters\": {\"open_now\": true, \"price\": [1, 2]}}}\n</tool_call>";
    check(
        Hermes,
        text,
        "Let me look both up.",
        &[
            ("get_weather", json!({"city": "Paris", "days": 3})),
            (
                "search",
                json!({"query": "café \"best\" <near> 🦀", "filters": {"open_now": true, "price": [1, 2]}}),
            ),
        ],
    );
}

#[test]
fn hermes_arguments_as_a_json_string_and_quoted_numbers() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": \\\"2\\\"}\"}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"parameters\": {\"query\": \"42\", \"limit\": \"0.5\", \"tags\": \"[\\\"a\\\"]\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>";
    check(
        Hermes,
        text,
        "",
        &[
            ("get_weather", json!({"city": "Paris", "days": 2})),
            ("search", json!({"query": "42", "limit": 0.5, "tags": ["a"]})),
            ("get_time", json!({})),
        ],
    );
}

#[test]
fn hermes_broken_json_is_content_and_later_calls_still_count() {
    let broken = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n</tool_call>";
    let text = format!("Trying.\n{broken}\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>\nDone.");
    check(Hermes, &text, &format!("Trying.\n{broken}\nDone."), &[("get_time", json!({}))]);
    let nameless = "<tool_call>\n{\"function\": \"get_time\"}\n</tool_call>";
    check(Hermes, nameless, nameless, &[]);
}

#[test]
fn hermes_unterminated_block() {
    let text =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_";
    check(Hermes, text, "", &[("get_weather", json!({"city": "Oslo"}))]);
    let text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argum";
    check(Hermes, text, text, &[]);
}

// --- Llama 3 ---

#[test]
fn llama3_python_tag_call() {
    let text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco, CA\", \"days\": \"5\", \"detailed\": null}}";
    check(
        Llama3Json,
        text,
        "",
        &[("get_weather", json!({"city": "San Francisco, CA", "days": 5, "detailed": null}))],
    );
}

#[test]
fn llama3_two_calls_without_tag() {
    let text = "\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\"}}; {\"name\": \"search\", \"arguments\": {\"query\": \"a < b\", \"filters\": {\"x\": [1]}}}\n";
    check(
        Llama3Json,
        text,
        "",
        &[
            ("get_weather", json!({"city": "Zürich"})),
            ("search", json!({"query": "a < b", "filters": {"x": [1]}})),
        ],
    );
}

#[test]
fn llama3_prose_and_json_that_is_no_call_are_content() {
    let text = "The weather in Paris is sunny, {\"name\": \"get_weather\"} aside.\n";
    check(Llama3Json, text, text, &[]);
    let text = "{\"answer\": 42}";
    check(Llama3Json, text, text, &[]);
    let text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": ";
    check(Llama3Json, text, text, &[]);
}

// --- Round trips through the templates the models were trained with ---

/// The answer part of the last assistant turn `template_file` renders for `calls` after
/// `answer`, and the format detected from the template.
fn rendered_answer(
    template_file: &str,
    answer: &str,
    calls: &[(&str, Value)],
) -> (ToolCallFormat, String) {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(template_file);
    let source =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let format = ToolCallFormat::detect(&source)
        .unwrap_or_else(|| panic!("{template_file}: no format detected"));
    let template = spindle_chat::ChatTemplate::new(&source, None, Some("<|im_end|>")).unwrap();
    let tool_calls: Vec<Value> =
        calls.iter().map(|(name, arguments)| json!({"type": "function", "function": {"name": name, "arguments": arguments}})).collect();
    let messages = [
        json!({"role": "user", "content": "Weather in Paris, and search for a < b?"}),
        json!({"role": "assistant", "content": answer, "tool_calls": tool_calls}),
    ];
    let extra = serde_json::Map::new();
    let input = spindle_chat::TemplateInput {
        messages: &messages,
        tools: None,
        add_generation_prompt: false,
        extra: &extra,
    };
    let prompt = template.render(&input).unwrap();
    let turn = prompt.rsplit("<|im_start|>assistant\n").next().unwrap();
    let turn = turn.split("<|im_end|>").next().unwrap();
    // Reasoning is split off before tool calls are parsed.
    let turn = turn.split_once("</think>\n\n").map_or(turn, |(_, after)| after);
    (format, turn.to_string())
}

#[test]
fn calls_rendered_by_model_templates_parse_back() {
    let calls = [
        ("get_weather", json!({"city": "Paris", "days": 3, "detailed": true})),
        ("search", json!({"query": "a < b\nand </p>", "filters": {"x": [1, "y"]}, "limit": 2.5})),
    ];
    for (template_file, expected_format) in [
        ("qwen3_5/qwen3_5_chat_template.jinja", QwenXml),
        ("templates/qwen2.5-coder-0.5b.jinja", Hermes),
    ] {
        let (format, answer) = rendered_answer(template_file, "Checking both.", &calls);
        assert_eq!(format, expected_format, "{template_file}");
        assert!(
            answer.starts_with("Checking both.\n") && answer.contains("<tool_call>"),
            "{template_file}: {answer:?}"
        );
        check(format, &answer, "Checking both.", &calls);
    }
}
