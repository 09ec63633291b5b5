//! Agent quality probes (asiai's `--code`, `--thinking-ablation` and `--instruct`), greedy with
//! a fixed seed so a run repeats:
//!
//! - **code**: a scripted multi-turn edit task (read a file, fix it, run the tests, fix again,
//!   add a docstring, search, rename) with four tools. Each turn the model answers the history
//!   so far; its tool call is *clean* when it names a known tool and its arguments parse and
//!   validate against that tool's schema ([`crate::schema`]). Whatever it answered, the history
//!   then continues with the script's own call and result, so every server sees the same prompts.
//! - **thinking ablation**: the code probe with thinking off, on and replayed into the history
//!   (`preserve_thinking`), and on but dropped (`chat_template_kwargs`, as Qwen3 templates read).
//! - **instruct**: a research brief with five required sections, thinking off and on: the share
//!   of sections delivered.

use serde_json::{json, Value};

use crate::client::Client;
use crate::schema::validate;

/// The seed of every probe request.
pub const SEED: u64 = 1234;

/// How a request asks for thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    /// The template's default; no `chat_template_kwargs`.
    Default,
    Off,
    /// Thinking on, and each turn's reasoning replayed in the history.
    OnPreserved,
    /// Thinking on, and the reasoning dropped from the history.
    OnDropped,
}

impl Thinking {
    /// The `chat_template_kwargs` of a request.
    pub fn kwargs(self) -> Option<Value> {
        match self {
            Thinking::Default => None,
            Thinking::Off => Some(json!({"enable_thinking": false})),
            Thinking::OnPreserved => {
                Some(json!({"enable_thinking": true, "preserve_thinking": true}))
            }
            Thinking::OnDropped => {
                Some(json!({"enable_thinking": true, "preserve_thinking": false}))
            }
        }
    }
}

impl std::fmt::Display for Thinking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Thinking::Default => "default",
            Thinking::Off => "enable_thinking=off",
            Thinking::OnPreserved => "enable_thinking=on + preserve_thinking=on",
            Thinking::OnDropped => "enable_thinking=on + preserve_thinking=off",
        })
    }
}

const SYSTEM: &str = "You are a coding agent working in a Python repository. Act only through \
    the tools, one tool call per reply, and read each result before the next call.";

const STATS_PY: &str = "1 def mean(values):\n2     return sum(values) / len(values)\n3 \n\
    4 def median(values):\n5     ordered = sorted(values)\n6     middle = len(ordered) // 2\n\
    7     return ordered[middle]\n8 \n9 def variance(values):\n10     m = mean(values)\n\
    11     return sum((v - m) ** 2 for v in values) / len(values)\n";

/// One scripted turn: an optional new user message, the tool a good agent calls, and the
/// call and result the history continues with.
struct Step {
    user: Option<&'static str>,
    tool: &'static str,
    arguments: fn() -> Value,
    result: &'static str,
}

/// `edit_file` arguments with one edit.
fn edit(path: &str, old_text: &str, new_text: &str) -> Value {
    json!({"path": path, "edits": [{"old_text": old_text, "new_text": new_text}]})
}

const SCRIPT: [Step; 8] = [
    Step {
        user: Some(
            "`mean` in src/stats.py raises ZeroDivisionError on an empty list; it should return \
             0.0 instead. Fix it.",
        ),
        tool: "read_file",
        arguments: || json!({"path": "src/stats.py"}),
        result: STATS_PY,
    },
    Step {
        user: None,
        tool: "edit_file",
        arguments: || {
            let old = "    return sum(values) / len(values)";
            edit("src/stats.py", old, &format!("    if not values:\n        return 0.0\n{old}"))
        },
        result: "Applied 1 edit to src/stats.py.",
    },
    Step {
        user: None,
        tool: "run_tests",
        arguments: || json!({"filter": "stats"}),
        result: "12 passed, 1 failed: test_median_even_length: median([1, 2, 3, 4]) returned 3, \
                 expected 2.5",
    },
    Step {
        user: None,
        tool: "edit_file",
        arguments: || {
            let old = "    return ordered[middle]";
            let even = "    if len(ordered) % 2 == 0:\n        \
                        return (ordered[middle - 1] + ordered[middle]) / 2\n";
            edit("src/stats.py", old, &format!("{even}{old}"))
        },
        result: "Applied 1 edit to src/stats.py.",
    },
    Step {
        user: None,
        tool: "run_tests",
        arguments: || json!({"filter": "stats"}),
        result: "13 passed.",
    },
    Step {
        user: Some("Now add a one-line docstring to `variance`."),
        tool: "edit_file",
        arguments: || {
            let old = "def variance(values):";
            edit("src/stats.py", old, &format!("{old}\n    \"\"\"Population variance.\"\"\""))
        },
        result: "Applied 1 edit to src/stats.py.",
    },
    Step {
        user: Some("Where else is `variance` used? Search the repository."),
        tool: "grep",
        arguments: || json!({"pattern": "variance", "path": "."}),
        result: "src/report.py:14:    spread = variance(samples)",
    },
    Step {
        user: Some("Rename `variance` to `population_variance`, in src/report.py too."),
        tool: "edit_file",
        arguments: || edit("src/report.py", "variance(samples)", "population_variance(samples)"),
        result: "Applied 1 edit to src/report.py.",
    },
];

/// The tools of the code probe, as OpenAI function definitions.
pub fn tools() -> Value {
    let function = |name: &str, description: &str, parameters: Value| {
        let function = json!({"name": name, "description": description, "parameters": parameters});
        json!({"type": "function", "function": function})
    };
    let edit = json!({"type": "object", "properties": {
        "old_text": {"type": "string", "description": "Exact text to replace."},
        "new_text": {"type": "string", "description": "Its replacement."}},
        "required": ["old_text", "new_text"], "additionalProperties": false});
    json!([
        function(
            "read_file",
            "Read a text file.",
            json!({"type": "object",
            "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"},
                "end_line": {"type": "integer"}},
            "required": ["path"], "additionalProperties": false})
        ),
        function(
            "edit_file",
            "Replace exact text in a file; every edit must match once.",
            json!({"type": "object",
            "properties": {"path": {"type": "string"},
                "edits": {"type": "array", "minItems": 1, "items": edit}},
            "required": ["path", "edits"], "additionalProperties": false})
        ),
        function(
            "run_tests",
            "Run the test suite, or the tests whose name contains `filter`.",
            json!({"type": "object",
            "properties": {"filter": {"type": "string"}}, "additionalProperties": false})
        ),
        function(
            "grep",
            "Search file contents with a regular expression.",
            json!({"type": "object",
            "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
            "required": ["pattern"], "additionalProperties": false})
        ),
    ])
}

/// What one reply's tool call was: the tool named (if any) and whether it is clean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallCheck {
    pub called: Option<String>,
    /// `None` when clean, else why not.
    pub problem: Option<String>,
}

/// Checks the `message` of a chat completion against `tools`: one or more tool calls, each
/// naming a known tool with arguments that parse and validate.
fn check_message(message: &Value, tools: &Value) -> CallCheck {
    let calls = message.get("tool_calls").and_then(Value::as_array).filter(|c| !c.is_empty());
    let Some(calls) = calls else {
        return CallCheck { called: None, problem: Some("no tool call".into()) };
    };
    let called = calls[0]["function"]["name"].as_str().map(str::to_string);
    let problem = calls.iter().find_map(|call| {
        let name = call["function"]["name"].as_str().unwrap_or_default();
        let Some(tool) = tools.as_array()?.iter().find(|t| t["function"]["name"] == name) else {
            return Some(format!("unknown tool `{name}`"));
        };
        let text = call["function"]["arguments"].as_str().unwrap_or_default();
        match serde_json::from_str::<Value>(text) {
            Err(e) => Some(format!("{name}: arguments are not JSON ({e})")),
            Ok(args) => validate(&tool["function"]["parameters"], &args)
                .err()
                .map(|e| format!("{name}: {e}")),
        }
    });
    CallCheck { called, problem }
}

/// One turn of the code probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnCheck {
    /// From 0.
    pub turn: usize,
    /// The tool the script calls here.
    pub expected: &'static str,
    pub check: CallCheck,
    pub completion_tokens: u32,
}

impl TurnCheck {
    pub fn clean(&self) -> bool {
        self.check.problem.is_none()
    }
}

/// One run of the code probe under one thinking setting.
#[derive(Debug, Clone, PartialEq)]
pub struct CodeProbe {
    pub thinking: Thinking,
    pub turns: Vec<TurnCheck>,
}

impl CodeProbe {
    /// `(clean, all)` turns.
    pub fn clean(&self) -> (usize, usize) {
        (self.turns.iter().filter(|t| t.clean()).count(), self.turns.len())
    }

    /// `(clean, all)` of the turns where the script edits a file: clean and an `edit_file` call.
    pub fn edit_clean(&self) -> (usize, usize) {
        let edits = self.turns.iter().filter(|t| t.expected == "edit_file");
        let good = |t: &&TurnCheck| t.clean() && t.check.called.as_deref() == Some("edit_file");
        (edits.clone().filter(good).count(), edits.count())
    }
}

/// Share `a / b` in percent (0 for no turns).
pub fn percent((a, b): (usize, usize)) -> f64 {
    if b == 0 {
        0.0
    } else {
        100.0 * a as f64 / b as f64
    }
}

fn request(
    messages: &[Value],
    thinking: Thinking,
    max_tokens: u32,
    tools: Option<&Value>,
) -> Value {
    let mut body = json!({"messages": messages, "temperature": 0, "seed": SEED,
        "max_tokens": max_tokens, "stream": false});
    if let Some(tools) = tools {
        body["tools"] = tools.clone();
        body["tool_choice"] = json!("auto");
    }
    if let Some(kwargs) = thinking.kwargs() {
        body["chat_template_kwargs"] = kwargs;
    }
    body
}

/// Runs the scripted edit task once. An HTTP error on a turn is that turn's problem (a server
/// that fails once reasoning accumulates shows as dirty turns, not as a failed probe).
pub async fn run_code(client: &Client, thinking: Thinking, max_tokens: u32) -> CodeProbe {
    let tools = tools();
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    let mut turns = Vec::with_capacity(SCRIPT.len());
    for (turn, step) in SCRIPT.iter().enumerate() {
        if let Some(user) = step.user {
            messages.push(json!({"role": "user", "content": user}));
        }
        let answer =
            client.chat_completion(request(&messages, thinking, max_tokens, Some(&tools))).await;
        let (check, completion_tokens, reasoning) = match &answer {
            Ok(response) => {
                let message = &response["choices"][0]["message"];
                let tokens = response["usage"]["completion_tokens"].as_u64().unwrap_or(0) as u32;
                (
                    check_message(message, &tools),
                    tokens,
                    message["reasoning_content"].as_str().map(str::to_string),
                )
            }
            Err(e) => (CallCheck { called: None, problem: Some(e.to_string()) }, 0, None),
        };
        turns.push(TurnCheck { turn, expected: step.tool, check, completion_tokens });
        let id = format!("call_{turn}");
        let function = json!({"name": step.tool, "arguments": (step.arguments)().to_string()});
        let mut call = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": id, "type": "function", "function": function}]});
        if let (Thinking::OnPreserved, Some(reasoning)) = (thinking, reasoning) {
            call["reasoning_content"] = json!(reasoning);
        }
        messages.push(call);
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": step.result}));
    }
    CodeProbe { thinking, turns }
}

/// The sections the instruct probe asks for, in order.
pub const SECTIONS: [&str; 5] = ["Summary", "Findings", "Risks", "Recommendation", "Next steps"];

const BRIEF: &str = "Write a research brief on whether our team should move its coding agents to \
    an inference server with a cross-user prefix cache. Use exactly these five sections, each a \
    Markdown heading: ## Summary, ## Findings, ## Risks, ## Recommendation, ## Next steps.";

/// The sections of [`SECTIONS`] that `text` has as headings: a `#` line, a bold line, or a
/// line that starts `Name:`.
fn sections_found(text: &str) -> usize {
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.trim().trim_start_matches('#').trim().replace("**", "").to_lowercase())
        .collect();
    let heads = |section: &str| {
        let section = section.to_lowercase();
        lines
            .iter()
            .any(|l| l.trim_end_matches(':') == section || l.starts_with(&format!("{section}:")))
    };
    SECTIONS.iter().filter(|s| heads(s)).count()
}

/// One run of the instruct probe.
#[derive(Debug, Clone, PartialEq)]
pub struct InstructProbe {
    pub thinking: Thinking,
    pub sections: usize,
    pub completion_tokens: u32,
    pub error: Option<String>,
}

pub async fn run_instruct(client: &Client, thinking: Thinking, max_tokens: u32) -> InstructProbe {
    let messages = [
        json!({"role": "system", "content": "You are a careful research assistant."}),
        json!({"role": "user", "content": BRIEF}),
    ];
    match client.chat_completion(request(&messages, thinking, max_tokens, None)).await {
        Ok(response) => InstructProbe {
            thinking,
            sections: sections_found(
                response["choices"][0]["message"]["content"].as_str().unwrap_or_default(),
            ),
            completion_tokens: response["usage"]["completion_tokens"].as_u64().unwrap_or(0) as u32,
            error: None,
        },
        Err(e) => InstructProbe {
            thinking,
            sections: 0,
            completion_tokens: 0,
            error: Some(e.to_string()),
        },
    }
}

/// Every probe run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QualityReport {
    pub code: Vec<CodeProbe>,
    pub instruct: Vec<InstructProbe>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(name: &str, arguments: &str) -> Value {
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}]})
    }

    #[test]
    fn the_script_itself_is_clean() {
        let tools = tools();
        for step in &SCRIPT {
            let check = check_message(&message(step.tool, &(step.arguments)().to_string()), &tools);
            assert_eq!(check, CallCheck { called: Some(step.tool.into()), problem: None });
        }
    }

    #[test]
    fn dirty_calls_say_why() {
        let tools = tools();
        let problem = |m: &Value| check_message(m, &tools).problem.unwrap();
        assert_eq!(problem(&json!({"content": "I will read the file."})), "no tool call");
        assert_eq!(
            problem(&message("edit_file", r#"{"path":"a","edits":{}}"#)),
            "edit_file: edits: expected array, got object"
        );
        assert_eq!(problem(&message("delete", "{}")), "unknown tool `delete`");
        assert!(problem(&message("read_file", "{path: a}"))
            .starts_with("read_file: arguments are not JSON"));
    }

    #[test]
    fn shares_of_clean_and_edit_turns() {
        let turn = |turn, expected, called: &str, problem: Option<&str>| TurnCheck {
            turn,
            expected,
            check: CallCheck { called: Some(called.into()), problem: problem.map(str::to_string) },
            completion_tokens: 20,
        };
        let probe = CodeProbe {
            thinking: Thinking::Off,
            turns: vec![
                turn(0, "read_file", "read_file", None),
                turn(1, "edit_file", "edit_file", Some("edits: 0 items, at least 1")),
                turn(2, "run_tests", "run_tests", None),
                turn(3, "edit_file", "read_file", None),
            ],
        };
        assert_eq!(probe.clean(), (3, 4));
        // Turn 3 is clean but reads instead of editing.
        assert_eq!(probe.edit_clean(), (0, 2));
        assert_eq!(percent(probe.clean()), 75.0);
        assert_eq!(percent((0, 0)), 0.0);
    }

    #[test]
    fn sections_as_headings_only() {
        let brief =
            "## Summary\nYes.\n### Findings\n- fast\n**Risks:**\nfew\nRecommendation: adopt\n\
                     We list next steps below.";
        assert_eq!(sections_found(brief), 4);
        assert_eq!(sections_found("# summary\n## NEXT STEPS"), 2);
        assert_eq!(sections_found(""), 0);
    }

    #[test]
    fn thinking_kwargs() {
        assert_eq!(Thinking::Default.kwargs(), None);
        assert_eq!(Thinking::OnDropped.kwargs().unwrap()["preserve_thinking"], false);
        let body = request(&[], Thinking::Off, 64, Some(&tools()));
        assert_eq!((body["seed"].clone(), body["temperature"].clone()), (json!(SEED), json!(0)));
        assert_eq!(body["chat_template_kwargs"], json!({"enable_thinking": false}));
        assert_eq!(body["tools"].as_array().unwrap().len(), 4);
    }
}
