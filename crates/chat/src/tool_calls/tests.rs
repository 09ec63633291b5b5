//! Format naming and detection, event folding, and a fuzz of all formats for panics and
//! streaming consistency. Recorded model outputs are in `tests/chat/tool_calls.rs`.

use serde_json::{json, Value};

use super::*;

#[test]
fn names_round_trip_and_aliases_resolve() {
    for format in ToolCallFormat::ALL {
        assert_eq!(ToolCallFormat::from_name(format.name()), Some(format));
    }
    assert_eq!(ToolCallFormat::NAMES, ToolCallFormat::ALL.map(ToolCallFormat::name));
    assert_eq!(ToolCallFormat::from_name("qwen3_coder"), Some(ToolCallFormat::QwenXml));
    assert_eq!(ToolCallFormat::from_name("xml"), Some(ToolCallFormat::QwenXml));
    assert_eq!(ToolCallFormat::from_name("qwen2.5"), Some(ToolCallFormat::Hermes));
    assert_eq!(ToolCallFormat::from_name("llama3"), Some(ToolCallFormat::Llama3Json));
    assert_eq!(ToolCallFormat::from_name("Hermes"), None);
    assert_eq!(ToolCallFormat::from_name(""), None);
}

#[test]
fn detects_format_from_template_markers() {
    let qwen35 = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + name + '>\\n' }}";
    assert_eq!(ToolCallFormat::detect(qwen35), Some(ToolCallFormat::QwenXml));
    let qwen25 = "{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}";
    assert_eq!(ToolCallFormat::detect(qwen25), Some(ToolCallFormat::Hermes));
    let llama31 = "{%- if builtin_tools is defined %}{{- '<|python_tag|>' }}";
    assert_eq!(ToolCallFormat::detect(llama31), Some(ToolCallFormat::Llama3Json));
    let llama32 = "{{- '<|start_header_id|>ipython<|end_header_id|>' }}{\"name\": function name, \"parameters\": ...}";
    assert_eq!(ToolCallFormat::detect(llama32), Some(ToolCallFormat::Llama3Json));
    assert_eq!(ToolCallFormat::detect("{{ '<|im_start|>' + message['content'] }}"), None);
    // `<function=` alone (no parameters) is not the XML format.
    assert_eq!(ToolCallFormat::detect("<function=x>"), None);
}

#[test]
fn collect_folds_fragments_by_call() {
    let message = ParsedMessage::collect([
        ToolEvent::Content("a".into()),
        ToolEvent::CallStart { index: 0, name: "f".into() },
        ToolEvent::Arguments { index: 0, fragment: "{\"x\": 1".into() },
        ToolEvent::CallStart { index: 1, name: "g".into() },
        ToolEvent::Arguments { index: 1, fragment: "{}".into() },
        ToolEvent::Arguments { index: 0, fragment: "}".into() },
        ToolEvent::Content("b".into()),
        ToolEvent::Arguments { index: 7, fragment: "ignored".into() },
    ]);
    assert_eq!(message.content, "ab");
    let calls = [("f", "{\"x\": 1}"), ("g", "{}")]
        .map(|(name, arguments)| ParsedCall { name: name.into(), arguments: arguments.into() });
    assert_eq!(message.calls, calls);
}

#[test]
fn parser_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ToolCallParser>();
}

/// A small deterministic generator (xorshift), so a failing case can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Each format's call, cut into the pieces the generator drops or keeps.
const SKELETONS: [&[&str]; 3] = [
    &[
        "<tool_call>",
        "\n",
        "<function=get_weather>",
        "\n",
        "<parameter=days>",
        "\n3\n",
        "</parameter>",
        "\n",
        "<parameter=city>",
        "{\"a\": 1}",
        "</parameter>",
        "</function>",
        "\n",
        "</tool_call>",
    ],
    &[
        "<tool_call>",
        "\n",
        "{\"name\": \"get_weather\", ",
        "\"arguments\": ",
        "{\"days\": \"3\", \"city\": \"x\"}",
        "}",
        "\n",
        "</tool_call>",
    ],
    &[
        "<|python_tag|>",
        "{\"name\": \"get_weather\", ",
        "\"parameters\": ",
        "{\"days\": 3}",
        "}",
        ";",
        " ",
    ],
];

/// Loose pieces of every format's syntax, plus text that looks like values or JSON.
const PIECES: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<|python_tag|>",
    "<tool",
    "</para",
    "<func",
    "get_weather",
    "city",
    "days",
    ">",
    "<",
    "\n",
    " ",
    ";",
    "{",
    "}",
    "\"",
    ":",
    ",",
    "3",
    "null",
    "true",
    "[1, {\"a\": 2}]",
    "é",
    "日本",
    "🦀",
    "Paris",
];

/// Calls with pieces left out at random: of one format only, or of any between loose pieces.
fn random_text(rng: &mut Rng) -> String {
    let mut text = String::new();
    let one_format = (rng.below(3) == 0).then(|| SKELETONS[rng.below(SKELETONS.len())]);
    for _ in 0..rng.below(5) {
        if one_format.is_some() || rng.below(2) == 0 {
            let skeleton = one_format.unwrap_or_else(|| SKELETONS[rng.below(SKELETONS.len())]);
            skeleton.iter().filter(|_| rng.below(16) != 0).for_each(|piece| text.push_str(piece));
        } else {
            (0..1 + rng.below(4)).for_each(|_| text.push_str(PIECES[rng.below(PIECES.len())]));
        }
    }
    text
}

/// `text` cut at random char boundaries.
fn random_pieces<'a>(rng: &mut Rng, text: &'a str) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (at, _) in text.char_indices().skip(1) {
        if rng.below(3) == 0 {
            pieces.push(&text[start..at]);
            start = at;
        }
    }
    pieces.push(&text[start..]);
    pieces
}

fn stream(format: ToolCallFormat, tools: &[ToolSchema], pieces: &[&str]) -> Vec<ToolEvent> {
    let mut parser = ToolCallParser::new(format, tools);
    let mut events: Vec<ToolEvent> = pieces.iter().flat_map(|piece| parser.push(piece)).collect();
    events.extend(parser.finish());
    events
}

/// Each call starts once, in index order, before its fragments, which form one JSON object.
fn assert_well_formed(events: &[ToolEvent], context: &str) {
    let mut arguments: Vec<String> = Vec::new();
    for event in events {
        match event {
            ToolEvent::Content(_) => {}
            ToolEvent::CallStart { index, .. } => {
                assert_eq!(
                    *index,
                    arguments.len(),
                    "{context}: call started out of order in {events:?}"
                );
                arguments.push(String::new());
            }
            ToolEvent::Arguments { index, fragment } => match arguments.get_mut(*index) {
                Some(call) => call.push_str(fragment),
                None => panic!("{context}: fragment before its call in {events:?}"),
            },
        }
    }
    for text in arguments {
        let parsed: Result<Value, _> = serde_json::from_str(&text);
        assert!(
            matches!(parsed, Ok(Value::Object(_))),
            "{context}: arguments {text:?} are not one JSON object"
        );
    }
}

#[test]
fn random_text_never_breaks_a_format() {
    let tools = [ToolSchema {
        name: "get_weather".into(),
        parameters: json!({"properties": {"days": {"type": "integer"}, "city": {"type": ["object", "string"]}}}),
    }];
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut calls_seen = [0usize; 3];
    for round in 0..3000 {
        let text = random_text(&mut rng);
        for format in ToolCallFormat::ALL {
            let context = format!("round {round}, {format:?}, {text:?}");
            let whole = parse_message(format, &tools, &text);
            calls_seen[format as usize] += whole.calls.len();
            let chunked = stream(format, &tools, &random_pieces(&mut rng, &text));
            assert_well_formed(&chunked, &context);
            assert_eq!(ParsedMessage::collect(chunked), whole, "{context}: chunked differs");
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let by_char =
                stream(format, &tools, &chars.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(ParsedMessage::collect(by_char), whole, "{context}: char by char differs");
        }
    }
    // The generator must reach the call paths of every format, not only their error paths.
    assert!(calls_seen.iter().all(|&calls| calls > 100), "too few calls generated: {calls_seen:?}");
}
