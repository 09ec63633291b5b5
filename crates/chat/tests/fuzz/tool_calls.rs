//! Fuzzing the tool-call parsers (issue #20): real-looking model outputs of every format,
//! mutated (markers spliced in, spans cut or repeated, bytes damaged), parsed by every format
//! with tool schemas that are themselves sometimes damaged. No input may panic or hang; every
//! call found must carry arguments that are one JSON object; and the text streamed in random
//! pieces must give the same message as the whole text.
//!
//! `SPINDLE_FUZZ_CASES=100000` runs a long campaign; the default is CI's fixed subset.

use serde_json::{json, Value};
use spindle_chat::{
    parse_message, ParsedMessage, ToolCallFormat, ToolCallParser, ToolEvent, ToolSchema,
};
use spindle_fuzz::{mutate_json, mutate_text, Rng};

const CI_CASES: u64 = 5_000;

/// Outputs written the way Qwen3.5 / Qwen3-Coder, Qwen2.5 (Hermes) and Llama 3 write them.
const CORPUS: &[&str] = &[
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
     <parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "Let me check.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.rs\n\
     </parameter>\n<parameter=content>\nfn main() {\n    if 1 < 2 { println!(\"<ok>\"); }\n}\n\
     </parameter>\n<parameter=options>\n{\"append\": true, \"mode\": [1, 2]}\n</parameter>\n\
     </function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n\
     </tool_call>",
    "Sure.\n<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"rust\\\"}\"}\n\
     </tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"parameters\": {}}\n</tool_call>",
    "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco, CA\", \
     \"days\": \"5\", \"detailed\": null}}",
    "{\"name\": \"search\", \"parameters\": {\"query\": \"日本 🦀\", \"tags\": [\"a\", \"b\"], \
     \"limit\": 1e3}}; {\"name\": \"get_time\", \"parameters\": {}}",
    "The weather in Paris is sunny, 21°C. No tool needed.",
];

/// Markers and punctuation of every format, spliced into the corpus to make near-misses.
const DICTIONARY: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "<function=get_weather>",
    "</function>",
    "<parameter=",
    "<parameter=days>",
    "</parameter>",
    "<|python_tag|>",
    "{\"name\": \"get_time\", \"arguments\": {}}",
    "{\"name\": ",
    "\"arguments\": ",
    "\"parameters\": ",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    "\\u00e9",
    "\\ud800",
    ":",
    ",",
    ";",
    "\n",
    "null",
    "-1e999",
    "18446744073709551616",
    "🦀",
];

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
                "limit": {"type": "number"},
                "tags": {"type": "array", "items": {"type": "string"}},
            }),
        ),
        ToolSchema { name: "get_time".into(), parameters: Value::Null },
    ]
}

/// Schema keywords a damaged schema may gain.
const SCHEMA_KEYS: &[&str] = &[
    "type",
    "properties",
    "items",
    "anyOf",
    "oneOf",
    "allOf",
    "enum",
    "$ref",
    "const",
    "city",
    "days",
];

/// One case: the text, where a stream cuts it, and the tools offered.
#[derive(Debug)]
struct Case {
    text: String,
    cuts: Vec<usize>,
    tools: Vec<ToolSchema>,
}

fn generate(rng: &mut Rng) -> Case {
    let original = *rng.pick(CORPUS);
    let text = mutate_text(rng, original, DICTIONARY);
    let boundaries: Vec<usize> = text.char_indices().map(|(at, _)| at).skip(1).collect();
    let every = 1 + rng.below(8);
    let cuts = boundaries.into_iter().filter(|_| rng.one_in(every)).collect();
    let mut tools = tools();
    if rng.one_in(2) {
        let tool = rng.below(tools.len());
        mutate_json(rng, &mut tools[tool].parameters, SCHEMA_KEYS);
    }
    Case { text, cuts, tools }
}

/// Each call starts once, in index order, before its fragments, which form one JSON object.
fn assert_well_formed(events: &[ToolEvent]) {
    let mut arguments: Vec<String> = Vec::new();
    for event in events {
        match event {
            ToolEvent::Content(_) => {}
            ToolEvent::CallStart { index, .. } => {
                assert_eq!(*index, arguments.len(), "call started out of order");
                arguments.push(String::new());
            }
            ToolEvent::Arguments { index, fragment } => {
                arguments.get_mut(*index).expect("a fragment before its call").push_str(fragment)
            }
        }
    }
    for text in arguments {
        let parsed = serde_json::from_str::<Value>(&text);
        assert!(matches!(parsed, Ok(Value::Object(_))), "arguments {text:?} are not an object");
    }
}

/// Checks every format on `case`; adds the calls each found to `calls_found`.
fn check(case: &Case, calls_found: &mut [usize; 3]) {
    for (format, found) in ToolCallFormat::ALL.into_iter().zip(calls_found) {
        let whole = parse_message(format, &case.tools, &case.text);
        *found += whole.calls.len();
        let mut parser = ToolCallParser::new(format, &case.tools);
        let mut events = Vec::new();
        let mut start = 0;
        for &cut in case.cuts.iter().chain([&case.text.len()]) {
            events.extend(parser.push(&case.text[start..cut]));
            start = cut;
        }
        events.extend(parser.finish());
        assert_well_formed(&events);
        assert_eq!(ParsedMessage::collect(events), whole, "{format:?}: streamed differs");
    }
}

#[test]
fn mutated_model_outputs_parse_to_well_formed_calls_in_every_format() {
    let mut calls_found = [0; 3];
    let cases =
        spindle_fuzz::run("tool calls", CI_CASES, generate, |case| check(case, &mut calls_found));
    // The mutations must leave calls to parse in every format, not only the error paths.
    if cases >= 1_000 {
        assert!(calls_found.iter().all(|&n| n as u64 > cases / 50), "calls found: {calls_found:?}");
    }
}
