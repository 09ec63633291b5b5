//! The agent workload's text: a long system prompt of the kind coding agents send (rules, JSON
//! tool definitions, repository notes) and short, distinct user messages.
//!
//! Everything is built from fixed pieces, so the same `(salt, size)` gives the same bytes. The
//! salt is written in the first line: a new salt shares no prefix with earlier runs, so a
//! server's cache (in memory or on disk) cannot make a "cold" call warm.

use serde_json::json;

/// Characters per token assumed before the server has counted; English prose and JSON with
/// common tokenizers give 3–4.5.
pub const CHARS_PER_TOKEN: f64 = 4.0;

const RULES: [&str; 10] = [
    "You are a careful software engineering agent working inside a user's repository. You act only through the tools listed below, one call at a time, and you read the result of each call before deciding on the next.",
    "Before editing a file, read it. Keep changes minimal and in the style of the surrounding code: same naming, same error handling, same comment density. Never reformat code you did not change.",
    "When a task is ambiguous, state the assumption you make in one sentence and continue; ask the user only when a wrong guess would destroy work or cost more than a minute to undo.",
    "Run the project's tests after every change that could affect them. If a test fails, read the failure, fix the cause rather than the test, and run the tests again. Report the final test summary.",
    "Do not invent APIs. If you are unsure whether a function or flag exists, search the code or the documentation first. Quote file paths and line numbers when you refer to code.",
    "Shell commands run in a sandbox without network access. Long-running commands must be given a timeout. Never run destructive commands (rm -rf, git reset --hard, force pushes) unless the user asked for exactly that.",
    "Answer in the user's language. Be brief: lead with the result, then the evidence. Use fenced code blocks for code and commands, and no decorative headings.",
    "Secrets, tokens and credentials found in files must never be printed, copied into other files, or sent to any tool. If a task requires one, ask the user to provide it through the environment.",
    "A tool call is a single JSON object with the keys \"name\" and \"arguments\"; arguments must match the tool's schema exactly, with no extra keys. Emit nothing after a tool call: wait for its result.",
    "When the task is complete, summarize what changed (files and a one-line reason each), what you verified, and anything left undone. Do not claim checks you did not run.",
];

/// `(name, description, [(parameter, type, description)])`.
type ToolSpec = (&'static str, &'static str, &'static [(&'static str, &'static str, &'static str)]);

const TOOLS: [ToolSpec; 12] = [
    (
        "read_file",
        "Read a text file, optionally a range of lines.",
        &[
            ("path", "string", "Path relative to the repository root."),
            ("start_line", "integer", "First line, 1-based."),
            ("end_line", "integer", "Last line, inclusive."),
        ],
    ),
    (
        "write_file",
        "Create or overwrite a file with the given content.",
        &[
            ("path", "string", "Path relative to the repository root."),
            ("content", "string", "The complete new content."),
        ],
    ),
    (
        "apply_patch",
        "Apply a unified diff to the working tree.",
        &[
            ("patch", "string", "A unified diff with paths relative to the root."),
            ("check_only", "boolean", "Only check that the patch applies."),
        ],
    ),
    (
        "list_dir",
        "List the entries of a directory.",
        &[
            ("path", "string", "Directory relative to the root."),
            ("depth", "integer", "How many levels to descend (default 1)."),
        ],
    ),
    (
        "grep",
        "Search file contents with a regular expression.",
        &[
            ("pattern", "string", "Rust regex syntax."),
            ("path", "string", "Directory or file to search."),
            ("glob", "string", "Only files matching this glob."),
            ("max_results", "integer", "Stop after this many matches."),
        ],
    ),
    (
        "find_symbol",
        "Find where a function, type or constant is defined.",
        &[
            ("name", "string", "The symbol's name."),
            ("kind", "string", "One of function, type, constant, module."),
        ],
    ),
    (
        "run_shell",
        "Run a shell command in the sandbox and return its output.",
        &[
            ("command", "string", "The command line."),
            ("timeout_s", "integer", "Seconds before the command is killed."),
            ("cwd", "string", "Working directory relative to the root."),
        ],
    ),
    (
        "run_tests",
        "Run the test suite or a subset of it.",
        &[
            ("filter", "string", "Only tests whose name contains this."),
            ("package", "string", "Only this package."),
        ],
    ),
    (
        "git_diff",
        "Show uncommitted changes.",
        &[
            ("path", "string", "Limit the diff to this path."),
            ("staged", "boolean", "Show staged changes instead."),
        ],
    ),
    (
        "git_log",
        "Show recent commits.",
        &[
            ("path", "string", "Only commits touching this path."),
            ("limit", "integer", "Number of commits."),
        ],
    ),
    (
        "search_docs",
        "Search the project's documentation.",
        &[("query", "string", "Keywords."), ("limit", "integer", "Number of results.")],
    ),
    (
        "ask_user",
        "Ask the user a question and wait for the answer.",
        &[
            ("question", "string", "One clear question."),
            ("options", "array", "Suggested answers, if any."),
        ],
    ),
];

const CRATES: [&str; 8] = ["api", "chat", "models", "runner", "sched", "server", "hub", "bench"];
const MODULES: [&str; 11] = [
    "lib", "config", "error", "cache", "engine", "sampler", "template", "routes", "metrics",
    "pool", "stream",
];
const ROLES: [&str; 7] = [
    "owns the request lifecycle and must stay free of tensor code",
    "converts errors into the OpenAI error JSON; add new variants here, never ad hoc",
    "is performance-critical: avoid allocation inside the per-token loop",
    "has exact unit tests at the bottom of the file; extend them with every change",
    "is shared by the server and the benchmark client; keep it serde-only",
    "holds configuration defaults that the README documents; update both together",
    "runs on the engine thread; anything slow must go through a channel",
];

const TASKS: [&str; 6] = [
    "Find why the test `{sym}` fails intermittently and fix it",
    "Add a `--{sym}` flag and document it in the README",
    "Rename `{sym}` to something clearer everywhere it is used",
    "Explain what `{sym}` does and where it is called from",
    "Write a unit test for the edge case where `{sym}` gets an empty input",
    "Profile `{sym}` and remove the allocation in its hot loop",
];
const SYMBOLS: [&str; 9] = [
    "prefill_chunk",
    "max_queue",
    "fit_max_tokens",
    "render_prompt",
    "step_once",
    "block_size",
    "evict_lru",
    "decode_utf8",
    "retry_after",
];

/// A system prompt of about `target_tokens` tokens at `chars_per_token`, unique to `salt`.
/// Pieces are added whole (rules, then tools, then notes) until the length is reached.
pub fn system_prompt(salt: u64, target_tokens: usize, chars_per_token: f64) -> String {
    let target_chars = (target_tokens as f64 * chars_per_token).round() as usize;
    let mut text = format!("# Session {salt:016x}\n\n");
    let mut pieces = RULES
        .iter()
        .map(|r| format!("{r}\n\n"))
        .chain(std::iter::once(
            "# Tools\n\nYou can call the following tools, given as JSON schemas:\n\n".to_string(),
        ))
        .chain(TOOLS.iter().map(|t| format!("{}\n", tool_json(t))))
        .chain(std::iter::once("\n# Repository notes\n\n".to_string()))
        .chain((0..).map(note));
    while text.len() < target_chars {
        text.push_str(&pieces.next().expect("notes never run out"));
    }
    text
}

fn tool_json((name, description, params): &ToolSpec) -> String {
    let properties: serde_json::Map<String, serde_json::Value> = params
        .iter()
        .map(|(p, ty, d)| (p.to_string(), json!({"type": ty, "description": d})))
        .collect();
    let required = vec![params[0].0];
    json!({"type": "function", "function": {"name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}})
    .to_string()
}

/// The `i`-th line of repository notes.
fn note(i: usize) -> String {
    let krate = CRATES[i % CRATES.len()];
    let module = MODULES[(i * 7 + i / CRATES.len()) % MODULES.len()];
    let role = ROLES[(i * 3 + 1) % ROLES.len()];
    format!("- `crates/{krate}/src/{module}.rs` (note {i}): {role}.\n")
}

/// What a tool returned at turn `turn` of a conversation: about `target_chars` characters of
/// repository notes no other turn shows (a file listing, as an agent's `grep` or `ls` gives).
pub fn tool_result(turn: usize, target_chars: usize) -> String {
    let mut text = format!("Tool result {turn}:\n");
    // Far apart per turn, so no two turns repeat a line.
    let mut lines = (turn * 100_000..).map(note);
    while text.len() < target_chars {
        text.push_str(&lines.next().expect("notes never run out"));
    }
    text
}

/// The tool call an agent makes at turn `turn` of a conversation: `(name, arguments)`, the
/// arguments a JSON object text that fits the tool's schema in the system prompt. A read, a
/// search or a test run in turn, on a different file each time.
pub fn tool_call(turn: usize) -> (&'static str, String) {
    let krate = CRATES[turn % CRATES.len()];
    let module = MODULES[(turn * 7 + turn / CRATES.len()) % MODULES.len()];
    let path = format!("crates/{krate}/src/{module}.rs");
    match turn % 3 {
        0 => ("read_file", json!({"path": path, "start_line": 1, "end_line": 200}).to_string()),
        1 => {
            let pattern = SYMBOLS[turn % SYMBOLS.len()];
            ("grep", json!({"pattern": pattern, "path": format!("crates/{krate}")}).to_string())
        }
        _ => (
            "run_tests",
            json!({"filter": module, "package": format!("spindle-{krate}")}).to_string(),
        ),
    }
}

/// The `index`-th user message: a short coding request, different for every index.
pub fn user_message(index: usize) -> String {
    let task = TASKS[index % TASKS.len()]
        .replace("{sym}", SYMBOLS[(index / TASKS.len() + index) % SYMBOLS.len()]);
    let krate = CRATES[(index * 5) % CRATES.len()];
    format!(
        "Request {index}: {task}. Start in crates/{krate}. Reply with your first tool call only."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_inputs_same_bytes_and_salt_in_the_first_line() {
        let a = system_prompt(0xabc, 600, CHARS_PER_TOKEN);
        assert_eq!(a, system_prompt(0xabc, 600, CHARS_PER_TOKEN));
        assert!(a.starts_with("# Session 0000000000000abc\n\n"));
        let b = system_prompt(0xabd, 600, CHARS_PER_TOKEN);
        assert_eq!(a.len(), b.len());
        assert_ne!(a, b);
    }

    #[test]
    fn size_follows_the_target_within_one_piece() {
        for (tokens, cpt) in [(100, 4.0), (600, 4.0), (2150, 4.0), (2150, 3.3), (5000, 3.0)] {
            let target = (tokens as f64 * cpt).round() as usize;
            let len = system_prompt(1, tokens, cpt).len();
            assert!(
                len >= target && len < target + 600,
                "{tokens}×{cpt}: {len} chars for {target}"
            );
        }
    }

    #[test]
    fn tool_results_are_sized_and_differ_per_turn() {
        let (a, b) = (tool_result(1, 4000), tool_result(2, 4000));
        assert!(a.len() >= 4000 && a.len() < 4200, "{}", a.len());
        assert_eq!(a, tool_result(1, 4000));
        let lines_a: std::collections::HashSet<&str> = a.lines().skip(1).collect();
        assert!(b.lines().skip(1).all(|line| !lines_a.contains(line)), "turns share lines");
    }

    #[test]
    fn a_full_prompt_holds_rules_every_tool_and_notes() {
        let text = system_prompt(7, 2150, CHARS_PER_TOKEN);
        assert!(text.contains(RULES[9]));
        for (name, _, _) in TOOLS {
            assert!(text.contains(&format!("\"name\":\"{name}\"")), "{name}");
        }
        assert!(text.contains("(note 0)"));
        // Every tool line is valid JSON.
        let tool_lines: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
        assert_eq!(tool_lines.len(), TOOLS.len());
        for line in tool_lines {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["type"], "function");
        }
    }

    #[test]
    fn tool_json_shape() {
        assert_eq!(
            tool_json(&TOOLS[8]),
            r#"{"type":"function","function":{"name":"git_diff","description":"Show uncommitted changes.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"Limit the diff to this path."},"staged":{"type":"boolean","description":"Show staged changes instead."}},"required":["path"]}}}"#
        );
    }

    #[test]
    fn user_messages_are_distinct() {
        let messages: Vec<String> = (0..200).map(user_message).collect();
        let unique: std::collections::HashSet<&String> = messages.iter().collect();
        assert_eq!(unique.len(), messages.len());
        assert_eq!(
            user_message(0),
            "Request 0: Find why the test `prefill_chunk` fails intermittently and fix it. Start in crates/api. Reply with your first tool call only."
        );
    }

    #[test]
    fn tool_calls_cycle_through_tools_with_valid_arguments() {
        let names: Vec<&str> = (0..4).map(|t| tool_call(t).0).collect();
        assert_eq!(names, ["read_file", "grep", "run_tests", "read_file"]);
        assert_eq!(
            tool_call(0).1,
            r#"{"path":"crates/api/src/lib.rs","start_line":1,"end_line":200}"#
        );
        for turn in 0..30 {
            let (name, arguments) = tool_call(turn);
            let args: serde_json::Value = serde_json::from_str(&arguments).unwrap();
            let (_, _, params) = TOOLS.iter().find(|t| t.0 == name).unwrap();
            // Every key is a parameter of the tool, and the first (required) one is given.
            assert!(args.as_object().unwrap().keys().all(|k| params.iter().any(|p| p.0 == k)));
            assert!(args.get(params[0].0).is_some(), "{name}: {arguments}");
        }
    }

    #[test]
    fn notes_cycle_deterministically() {
        assert_eq!(note(0), "- `crates/api/src/lib.rs` (note 0): converts errors into the OpenAI error JSON; add new variants here, never ad hoc.\n");
        assert_eq!(
            note(9),
            "- `crates/chat/src/pool.rs` (note 9): owns the request lifecycle and must stay free of tensor code.\n"
        );
    }
}
