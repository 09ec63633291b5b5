//! The grammars Spindle enforces, as llguidance grammars: a JSON document that follows a
//! schema (`response_format`), and tool calls in the model's own syntax whose arguments follow
//! each tool's parameter schema (`tool_choice` required or named, `strict` tools).

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::{json, Value};
use spindle_chat::ToolCallFormat;

/// JSON the way models write it: `{"a": 1, "b": [2, 3]}`. Fixed separators and no free
/// whitespace, so a model can't wander off into endless newlines inside a document.
fn json_style() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

fn styled(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_style);
    }
    schema
}

/// One JSON document following `schema`.
pub fn json_schema(schema: &Value) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(styled(schema))
}

/// Any JSON object (`response_format: {"type": "json_object"}`).
pub fn json_object() -> TopLevelGrammar {
    json_schema(&json!({"type": "object"}))
}

/// A tool as the grammar sees it: its arguments follow `parameters` when the tool is strict
/// (or named by `tool_choice`), else they are any JSON object.
#[derive(Debug, Clone)]
pub struct ToolRule {
    pub name: String,
    pub parameters: Option<Value>,
}

/// How calls are required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    /// Text, or calls: once a call starts it must be well formed.
    Optional,
    /// At least one call and nothing else (`tool_choice: "required"` or a named function).
    Required,
}

/// Tool calls in `format`'s syntax for `tools`; `parallel` allows more than one.
pub fn tool_calls(
    format: ToolCallFormat,
    tools: &[ToolRule],
    mode: CallMode,
    parallel: bool,
) -> TopLevelGrammar {
    let rules = match format {
        ToolCallFormat::Hermes => hermes_rules(tools),
        ToolCallFormat::QwenXml => xml_rules(tools),
        ToolCallFormat::Llama3Json => llama3_rules(tools),
    };
    let start = match (mode, format) {
        (CallMode::Required, ToolCallFormat::Llama3Json) if parallel => {
            "start: call (\"; \" call)*\n".to_string()
        }
        (CallMode::Required, _) if parallel => "start: call+\n".to_string(),
        (CallMode::Required, _) => "start: call\n".to_string(),
        // A Llama 3 message is either one call or text that doesn't start like one.
        (CallMode::Optional, ToolCallFormat::Llama3Json) => {
            "start: call | PLAIN\nPLAIN: /([^{](.|\\n)*)?/\n".to_string()
        }
        // Free text until `<tool_call>` appears (lazy: `head` ends at the first one), then a
        // call that must be well formed; then text, or more calls.
        (CallMode::Optional, _) => format!(
            "start: {} TEXT\nhead[lazy]: TEXT \"<tool_call>\"\nTEXT: /(.|\\n)*/\n",
            if parallel { "(head call_rest)*" } else { "(head call_rest)?" }
        ),
    };
    TopLevelGrammar::from_grammar(GrammarWithLexer::from_lark(format!("{start}{rules}")))
}

/// Either tool calls or one JSON document following `schema` (`response_format` beside tools
/// the model may call). Calls start with `<tool_call>` (or, in Llama 3's syntax, are objects
/// with a name), a document with `{`: the first tokens settle which.
pub fn tool_calls_or_json(
    format: ToolCallFormat,
    tools: &[ToolRule],
    parallel: bool,
    schema: &Value,
) -> TopLevelGrammar {
    let rules = match format {
        ToolCallFormat::Hermes => hermes_rules(tools),
        ToolCallFormat::QwenXml => xml_rules(tools),
        ToolCallFormat::Llama3Json => llama3_rules(tools),
    };
    let calls = if parallel { "call+" } else { "call" };
    let start = format!("start: {calls} | document\ndocument: %json {}\n", styled(schema));
    TopLevelGrammar::from_grammar(GrammarWithLexer::from_lark(format!("{start}{rules}")))
}

/// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Hermes, Qwen2.5).
fn hermes_rules(tools: &[ToolRule]) -> String {
    let body = call_object(tools, "arguments");
    format!("call: \"<tool_call>\" call_rest\ncall_rest: \"\\n\" %json {body} \"\\n</tool_call>\" \"\\n\"?\n")
}

/// `{"name": ..., "parameters": {...}}` (Llama 3).
fn llama3_rules(tools: &[ToolRule]) -> String {
    format!("call: %json {}\n", call_object(tools, "parameters"))
}

/// The schema of a call object: one of the tools by name, with its arguments under `key`.
fn call_object(tools: &[ToolRule], key: &str) -> Value {
    let variants: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut arguments = arguments_schema(t);
            // The tool's `#/$defs/...` references now resolve against the call object.
            rebase_refs(&mut arguments, &format!("/anyOf/{i}/properties/{key}"));
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, key: arguments},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    styled(&json!({"anyOf": variants}))
}

/// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>`
/// (Qwen3-Coder, Qwen3.5). Parameters come in the schema's order, required ones always;
/// a string value is any text up to its closing tag, other types follow their schema as JSON.
fn xml_rules(tools: &[ToolRule]) -> String {
    let mut rules = String::from(
        "call: \"<tool_call>\" call_rest\ncall_rest: \"\\n\" function \"</tool_call>\" \"\\n\"?\n",
    );
    let functions: Vec<String> = (0..tools.len()).map(|i| format!("function_{i}")).collect();
    rules += &format!("function: {}\n", functions.join(" | "));
    for (i, tool) in tools.iter().enumerate() {
        let open = lark_string(&format!("<function={}>\n", tool.name));
        let params = match &tool.parameters {
            Some(schema) => xml_parameters(&mut rules, i, schema),
            None => {
                rules +=
                    "free_parameter: \"<parameter=\" /[A-Za-z0-9_.\\-]+/ \">\\n\" text_value\n";
                "free_parameter*".to_string()
            }
        };
        rules += &format!("function_{i}: {open} {params} \"</function>\\n\"\n");
    }
    rules += "text_value[lazy]: /(.|\\n)*\\n<\\/parameter>\\n/\n";
    rules
}

/// The rules of tool `i`'s parameters; returns their sequence for the function rule.
fn xml_parameters(rules: &mut String, i: usize, schema: &Value) -> String {
    let required: Vec<&str> =
        schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let mut sequence = Vec::new();
    for (j, (key, property)) in schema["properties"].as_object().into_iter().flatten().enumerate() {
        let rule = format!("parameter_{i}_{j}");
        let open = lark_string(&format!("<parameter={key}>\n"));
        let words: Option<Vec<&str>> =
            property["enum"].as_array().and_then(|e| e.iter().map(Value::as_str).collect());
        let value = if let Some(words) = words.filter(|w| !w.is_empty()) {
            // The XML form writes strings bare, enum members included.
            let choices: Vec<String> = words.iter().map(|w| lark_string(w)).collect();
            format!("({}) \"\\n</parameter>\\n\"", choices.join(" | "))
        } else if property.get("type") == Some(&json!("string")) {
            "text_value".to_string()
        } else {
            format!("%json {} \"\\n</parameter>\\n\"", styled(&with_definitions(property, schema)))
        };
        *rules += &format!("{rule}: {open} {value}\n");
        sequence.push(if required.contains(&key.as_str()) { rule } else { format!("{rule}?") });
    }
    sequence.join(" ")
}

/// Points every local `$ref` of `schema` (`#/...`) at the same place once `schema` sits at
/// `pointer` inside a larger schema: tools' parameters (pydantic's `$defs` among them) are
/// embedded in the call object, whose root is not theirs.
fn rebase_refs(schema: &mut Value, pointer: &str) {
    match schema {
        Value::Object(map) => {
            for (name, value) in map.iter_mut() {
                match value {
                    Value::String(target) if name == "$ref" && target.starts_with('#') => {
                        target.insert_str(1, pointer);
                    }
                    _ => rebase_refs(value, pointer),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rebase_refs(item, pointer)),
        _ => {}
    }
}

/// `property`, compiled as a document of its own (a parameter's value in the XML form), with
/// the definitions of the tool `schema` it belongs to, which its `$ref`s may name.
fn with_definitions(property: &Value, schema: &Value) -> Value {
    let mut property = property.clone();
    if let Value::Object(map) = &mut property {
        for key in ["$defs", "definitions"] {
            if let Some(definitions) = schema.get(key) {
                map.entry(key).or_insert_with(|| definitions.clone());
            }
        }
    }
    property
}

fn arguments_schema(tool: &ToolRule) -> Value {
    tool.parameters.clone().unwrap_or_else(|| json!({"type": "object"}))
}

/// `text` as a Lark string literal.
fn lark_string(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialise")
}
