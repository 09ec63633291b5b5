//! The three requests of the speculation panel and the answers they should get:
//!
//! - **code-edit**: a ~160-line Python file in the prompt, one class renamed, the whole file
//!   back. Nearly every answer token is in the prompt: the best case for drafting by lookup.
//! - **tool-call**: an agent turn whose answer is an `edit_file` call repeating a path and a
//!   whole function from an earlier tool result, once as it is and once edited.
//! - **prose**: a short story, nothing to copy: drafting can only cost here. Sampled (at
//!   [`PROSE_TEMPERATURE`], fixed seed, with [`PROSE_FREQUENCY_PENALTY`]) rather than greedy: a
//!   small model's story falls into a loop otherwise, which drafts like a copy.
//!
//! Each request has [`VARIANTS`] versions (the new name, the topic) and a round takes the one its
//! seed picks. That keeps an earlier round's answer out of the drafts: Spindle also drafts from
//! the outputs it finished lately, and a repeated answer would be drafted whole.

use serde_json::{json, Value};

/// The file the code-edit request rewrites.
pub const INVENTORY_PY: &str = include_str!("inventory.py");
/// The class the code-edit request renames.
pub const RENAMED_CLASS: &str = "Item";
/// The new names of the class (code-edit) and of the local variable (tool-call), by variant.
const NEW_NAMES: [&str; VARIANTS] = [
    "StockItem",
    "Product",
    "Article",
    "InventoryItem",
    "Part",
    "CatalogEntry",
    "Ware",
    "StockLine",
];
/// The variable the tool-call request renames, in [`TIMEOUT_FN`].
const RENAMED_VARIABLE: &str = "raw";
/// Topics of the prose request, by variant.
const TOPICS: [&str; VARIANTS] = [
    "a lighthouse keeper who finds a letter in a bottle",
    "a baker on the night before a village festival",
    "two strangers sharing an umbrella at a tram stop",
    "a retired astronaut planting her first garden",
    "a boy who repairs an old radio with his grandfather",
    "a fox crossing a frozen lake at dawn",
    "a translator who misses the last train home",
    "a street musician and the child who listens every day",
];
/// Versions of each request.
pub const VARIANTS: usize = 8;

/// The path of the file the tool-call conversation has read.
pub const CONFIG_PATH: &str = "src/config/loader.rs";
/// The function the tool-call answer quotes and edits.
const TIMEOUT_FN: &str = r#"pub fn parse_timeout(value: &str) -> Result<Duration, ConfigError> {
    let raw = value.trim();
    if raw.is_empty() {
        return Err(ConfigError::Empty("timeout"));
    }
    let (digits, unit) = match raw.find(|c: char| !c.is_ascii_digit()) {
        Some(split) => raw.split_at(split),
        None => (raw, "s"),
    };
    let amount: u64 = digits.parse().map_err(|_| ConfigError::Invalid("timeout", raw.to_string()))?;
    match unit {
        "ms" => Ok(Duration::from_millis(amount)),
        "s" => Ok(Duration::from_secs(amount)),
        "m" => Ok(Duration::from_secs(amount * 60)),
        other => Err(ConfigError::Unit(other.to_string())),
    }
}"#;

/// Which request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    CodeEdit,
    ToolCall,
    Prose,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::CodeEdit, Kind::ToolCall, Kind::Prose];

    pub fn name(self) -> &'static str {
        match self {
            Kind::CodeEdit => "code-edit",
            Kind::ToolCall => "tool-call",
            Kind::Prose => "prose",
        }
    }

    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One version of one request: the body's messages and tools, and the answer's text that a
/// faithful reply repeats (empty for prose).
#[derive(Debug, Clone)]
pub struct Request {
    pub kind: Kind,
    pub variant: usize,
    /// 0 (greedy) but for prose.
    pub temperature: f64,
    /// OpenAI's `frequency_penalty`: 0 but for prose.
    pub frequency_penalty: f64,
    pub messages: Value,
    pub tools: Option<Value>,
    pub expected: String,
}

/// Version `variant` (taken modulo [`VARIANTS`]) of `kind`.
pub fn request(kind: Kind, variant: usize) -> Request {
    let variant = variant % VARIANTS;
    let (messages, tools, expected) = match kind {
        Kind::CodeEdit => code_edit(NEW_NAMES[variant]),
        Kind::ToolCall => tool_call(NEW_NAMES[variant]),
        Kind::Prose => (prose(TOPICS[variant]), None, String::new()),
    };
    let (temperature, frequency_penalty) = match kind {
        Kind::Prose => (PROSE_TEMPERATURE, PROSE_FREQUENCY_PENALTY),
        _ => (0.0, 0.0),
    };
    Request { kind, variant, temperature, frequency_penalty, messages, tools, expected }
}

/// The prose request's temperature (with the panel's fixed seed).
pub const PROSE_TEMPERATURE: f64 = 0.8;
/// The prose request's `frequency_penalty`: without it qwen2.5-coder-0.5b's stories repeated
/// themselves (50–80 % of their words) in two rounds of three even when sampled.
pub const PROSE_FREQUENCY_PENALTY: f64 = 0.5;

fn code_edit(new_name: &str) -> (Value, Option<Value>, String) {
    let system = "You are a careful refactoring assistant. Answer with the complete updated file \
                  in one ```python code block and nothing else: no explanation, no omissions.";
    let user = format!(
        "Rename the class `{RENAMED_CLASS}` to `{new_name}` everywhere in this file (its \
         definition, annotations and constructor calls). Change nothing else. Reply with the \
         whole file.\n\n```python\n{INVENTORY_PY}```"
    );
    let expected = rename_identifier(INVENTORY_PY, RENAMED_CLASS, new_name);
    (
        json!([{"role": "system", "content": system}, {"role": "user", "content": user}]),
        None,
        expected,
    )
}

/// The Rust file the conversation read: [`TIMEOUT_FN`] among its neighbours.
pub fn config_source() -> String {
    format!(
        "use std::collections::HashMap;\nuse std::time::Duration;\n\nuse crate::config::error::ConfigError;\n\n\
         /// Settings read from `key = value` lines; `#` starts a comment.\n\
         pub fn parse_lines(text: &str) -> HashMap<String, String> {{\n    \
             text.lines()\n        .map(|l| l.split('#').next().unwrap_or(\"\").trim())\n        \
             .filter(|l| !l.is_empty())\n        .filter_map(|l| l.split_once('='))\n        \
             .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))\n        .collect()\n}}\n\n\
         /// A duration such as `250ms`, `30s` or `5m`; plain digits are seconds.\n{TIMEOUT_FN}\n\n\
         pub fn parse_flag(value: &str) -> Result<bool, ConfigError> {{\n    \
             match value.trim().to_ascii_lowercase().as_str() {{\n        \
             \"1\" | \"true\" | \"yes\" | \"on\" => Ok(true),\n        \
             \"0\" | \"false\" | \"no\" | \"off\" => Ok(false),\n        \
             other => Err(ConfigError::Invalid(\"flag\", other.to_string())),\n    }}\n}}\n"
    )
}

/// The agent's tools: reading, editing and testing.
fn agent_tools() -> Value {
    let function = |name: &str, description: &str, properties: Value, required: &[&str]| {
        json!({"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}})
    };
    let string = |description: &str| json!({"type": "string", "description": description});
    json!([
        function(
            "read_file",
            "Read a file of the repository.",
            json!({"path": string("Path from the repository root")}),
            &["path"]
        ),
        function(
            "edit_file",
            "Replace old_string, which must occur exactly once in the file, by new_string.",
            json!({"path": string("Path from the repository root"),
                "old_string": string("The exact text to replace, copied from the file"),
                "new_string": string("The replacement text")}),
            &["path", "old_string", "new_string"]
        ),
        function(
            "run_tests",
            "Run the test suite, optionally filtered.",
            json!({"filter": string("Substring of the test names to run")}),
            &[]
        ),
    ])
}

fn tool_call(new_name: &str) -> (Value, Option<Value>, String) {
    let variable = snake_case(new_name);
    let system = "You are a coding agent working in a Rust repository. Act only through the \
                  tools. Edits replace exact text: copy old_string verbatim from the file.";
    let user = format!(
        "In {CONFIG_PATH}, rename the local variable `{RENAMED_VARIABLE}` of `parse_timeout` to \
         `{variable}`. Use one edit_file call whose old_string is the whole function."
    );
    let read = json!({"id": "call_1", "type": "function",
        "function": {"name": "read_file", "arguments": json!({"path": CONFIG_PATH}).to_string()}});
    let messages = json!([
        {"role": "system", "content": system},
        {"role": "user", "content": user},
        {"role": "assistant", "content": null, "tool_calls": [read]},
        {"role": "tool", "tool_call_id": "call_1", "content": config_source()},
    ]);
    let renamed = rename_identifier(TIMEOUT_FN, RENAMED_VARIABLE, &variable);
    let expected = format!("{CONFIG_PATH}\n{TIMEOUT_FN}\n{renamed}");
    (messages, Some(agent_tools()), expected)
}

fn prose(topic: &str) -> Value {
    let user = format!(
        "Write an original short story of about 400 words about {topic}. Plain prose, no title, \
         no lists."
    );
    json!([{"role": "user", "content": user}])
}

/// `StockItem` → `stock_item`.
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// `text` with every occurrence of the identifier `old` (not part of a longer identifier)
/// replaced by `new`.
pub fn rename_identifier(text: &str, old: &str, new: &str) -> String {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(old) {
        let (before, after) = (&rest[..at], &rest[at + old.len()..]);
        // The character before: in `rest`, or else the last one already written.
        let previous = before.chars().next_back().or_else(|| out.chars().next_back());
        let starts = !previous.is_some_and(is_ident);
        let ends = !after.chars().next().is_some_and(is_ident);
        out.push_str(before);
        out.push_str(if starts && ends { new } else { old });
        rest = after;
    }
    out + rest
}

/// Share of the expected answer's non-blank lines that the reply has as lines (whitespace at
/// the ends ignored): 1.0 when the model repeated all it should, `None` without an expectation.
pub fn fidelity(expected: &str, reply: &str) -> Option<f64> {
    let expected: Vec<&str> = expected.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if expected.is_empty() {
        return None;
    }
    let got: std::collections::HashSet<&str> = reply.lines().map(str::trim).collect();
    let found = expected.iter().filter(|l| got.contains(*l)).count();
    Some(found as f64 / expected.len() as f64)
}

/// Share of the reply's runs of 8 words that occurred earlier in the reply: near 0 for prose
/// that moves on, high for an answer stuck in a loop (a small model decoding greedily), whose
/// repeats the lookup drafts as well as a copied file's. `None` under 16 words.
pub fn self_repeat(reply: &str) -> Option<f64> {
    const RUN: usize = 8;
    let words: Vec<&str> = reply.split_whitespace().collect();
    if words.len() < 2 * RUN {
        return None;
    }
    let mut seen = std::collections::HashSet::new();
    let runs: Vec<&[&str]> = words.windows(RUN).collect();
    let repeated = runs.iter().filter(|run| !seen.insert(**run)).count();
    Some(repeated as f64 / runs.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_identifier(text: &str, name: &str) -> usize {
        let marker = "\u{1}";
        rename_identifier(text, name, marker).matches(marker).count()
    }

    #[test]
    fn the_code_edit_prompt_holds_the_file_and_its_answer_is_the_renamed_file() {
        let lines = INVENTORY_PY.lines().count();
        assert!((140..=200).contains(&lines), "{lines} lines");
        let r = request(Kind::CodeEdit, 1);
        let user = r.messages[1]["content"].as_str().unwrap();
        assert!(user.contains(INVENTORY_PY) && user.contains("`Item` to `Product`"));
        assert!(r.tools.is_none());
        // Every use of the class, and nothing else: `items`, `read_items` stay.
        let uses = count_identifier(INVENTORY_PY, "Item");
        assert_eq!(uses, 9);
        assert_eq!(count_identifier(&r.expected, "Product"), uses);
        assert_eq!(count_identifier(&r.expected, "Item"), 0);
        assert!(r.expected.contains("def read_items(path: Path) -> dict[str, Product]:"));
        assert_eq!(r.expected.lines().count(), lines);
        assert_eq!(fidelity(&r.expected, &format!("```python\n{}```", r.expected)), Some(1.0));
        assert!(fidelity(&r.expected, INVENTORY_PY).unwrap() < 0.95, "the old file is not it");
    }

    #[test]
    fn the_tool_call_answer_repeats_the_path_and_the_function_from_the_context() {
        let r = request(Kind::ToolCall, 0);
        let tools: Vec<&str> = r
            .tools
            .as_ref()
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(tools, ["read_file", "edit_file", "run_tests"]);
        let result = r.messages[3]["content"].as_str().unwrap();
        assert!(result.contains(TIMEOUT_FN) && r.messages[3]["role"] == "tool");
        assert!(r.messages[1]["content"].as_str().unwrap().contains("to `stock_item`"));
        assert!(r.expected.starts_with(CONFIG_PATH) && r.expected.contains(TIMEOUT_FN));
        assert!(r.expected.contains("let stock_item = value.trim();"));
        assert!(r.expected.contains("ConfigError::Invalid(\"timeout\", stock_item.to_string())"));
        assert_eq!(count_identifier(TIMEOUT_FN, "raw"), 6);
    }

    #[test]
    fn prose_has_nothing_to_copy_and_each_variant_differs() {
        let r = request(Kind::Prose, 3);
        assert!(r.expected.is_empty() && r.tools.is_none());
        assert_eq!(fidelity(&r.expected, "anything"), None);
        let users: std::collections::HashSet<String> =
            (0..VARIANTS).map(|v| request(Kind::Prose, v).messages.to_string()).collect();
        assert_eq!(users.len(), VARIANTS);
        assert_eq!(request(Kind::CodeEdit, VARIANTS + 2).variant, 2);
    }

    #[test]
    fn a_looping_answer_repeats_itself_and_prose_does_not() {
        let sentence = "The baker was ready to leave after hours of work in the warm kitchen.";
        let looped = [sentence; 10].join(" ");
        assert!(self_repeat(&looped).unwrap() > 0.85);
        let prose = "one two three four five six seven eight nine ten eleven twelve thirteen \
                     fourteen fifteen sixteen seventeen";
        assert_eq!(self_repeat(prose), Some(0.0));
        assert_eq!(self_repeat("too short"), None);
    }

    #[test]
    fn renames_only_whole_identifiers() {
        assert_eq!(
            rename_identifier("Item items Item_ xItem Item(", "Item", "P"),
            "P items Item_ xItem P("
        );
        assert_eq!(rename_identifier("raw", "raw", "r2"), "r2");
        assert_eq!(snake_case("CatalogEntry"), "catalog_entry");
        assert_eq!(Kind::parse("tool-call"), Some(Kind::ToolCall));
    }
}
