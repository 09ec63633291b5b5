//! Fuzzing chat templates (issue #20): the message lists of the template tests (system, user,
//! assistant and tool turns, tool calls, tool definitions, `chat_template_kwargs`), mutated
//! (roles and contents of other types, fields missing or added, lists repeated, odd strings),
//! rendered by the templates of the cached test models, Qwen3, Qwen3.5 and ChatML. Every
//! render must give a prompt or an error that says something, never a panic or a hang.
//!
//! Inputs go through JSON text first, as a request's messages do, so only what a request body
//! can hold reaches the templates (serde_json refuses nesting deeper than 128).
//!
//! `SPINDLE_FUZZ_CASES=100000` runs a long campaign; the default is CI's fixed subset.

use std::path::PathBuf;

use serde_json::{json, Map, Value};
use spindle_chat::{ChatTemplate, TemplateInput};
use spindle_fuzz::{mutate_json, Rng};

const CI_CASES: u64 = 3_000;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

/// Every template the tests hold: the cached models', Qwen3's, Qwen3.5's and ChatML.
fn templates() -> Vec<(&'static str, ChatTemplate)> {
    let read = |rel: &str| std::fs::read_to_string(data(rel)).unwrap();
    let config: Value = serde_json::from_str(&read("qwen3/tokenizer_config.json")).unwrap();
    let qwen3 = config["chat_template"].as_str().unwrap().to_string();
    let sources = [
        ("smollm2-135m", read("templates/smollm2-135m.jinja")),
        ("qwen2.5-coder-0.5b", read("templates/qwen2.5-coder-0.5b.jinja")),
        ("qwen3", qwen3),
        ("qwen3.5", read("qwen3_5/qwen3_5_chat_template.jinja")),
    ];
    let mut templates: Vec<(&str, ChatTemplate)> = sources
        .into_iter()
        .map(|(name, source)| {
            (name, ChatTemplate::new(&source, Some("<s>"), Some("<|im_end|>")).unwrap())
        })
        .collect();
    templates.push(("chatml", ChatTemplate::chatml()));
    templates
}

/// The template tests' inputs, each as one JSON object: `messages`, `tools`, `kwargs`.
fn corpus() -> Vec<Value> {
    let text = std::fs::read_to_string(data("templates/expected.json")).unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    cases
        .into_iter()
        .map(|case| {
            json!({"messages": case["messages"], "tools": case["tools"], "kwargs": case["kwargs"]})
        })
        .collect()
}

/// Keys a message, a tool call or a tool definition may carry, and the kwargs templates read.
const KEYS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "function",
    "arguments",
    "type",
    "text",
    "image_url",
    "reasoning_content",
    "parameters",
    "properties",
    "required",
    "description",
    "enable_thinking",
    "add_generation_prompt",
    "messages",
    "tools",
];

/// One render's input, as the templates receive it.
#[derive(Debug)]
struct Case {
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    kwargs: Map<String, Value>,
    add_generation_prompt: bool,
}

fn generate(rng: &mut Rng, corpus: &[Value]) -> Case {
    let mut input = rng.pick(corpus).clone();
    mutate_json(rng, &mut input, KEYS);
    // What a request body can carry: nesting beyond serde_json's limit is refused there.
    let text = serde_json::to_vec(&input).unwrap();
    let input: Value = serde_json::from_slice(&text).unwrap_or_else(|_| rng.pick(corpus).clone());
    let as_list = |value: &Value| match value {
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    Case {
        messages: as_list(&input["messages"]),
        tools: (!input["tools"].is_null()).then(|| as_list(&input["tools"])),
        kwargs: input["kwargs"].as_object().cloned().unwrap_or_default(),
        add_generation_prompt: rng.one_in(2),
    }
}

#[test]
fn mutated_message_lists_render_or_fail_cleanly_in_every_template() {
    let templates = templates();
    let corpus = corpus();
    let mut rendered = 0u64;
    let cases = spindle_fuzz::run(
        "templates",
        CI_CASES,
        |rng| generate(rng, &corpus),
        |case| {
            let input = TemplateInput {
                messages: &case.messages,
                tools: case.tools.as_deref(),
                add_generation_prompt: case.add_generation_prompt,
                extra: &case.kwargs,
            };
            for (name, template) in &templates {
                match template.render(&input) {
                    Ok(_) => rendered += 1,
                    Err(error) => assert!(!error.to_string().is_empty(), "{name}: empty error"),
                }
            }
        },
    );
    // Most mutations leave a renderable list: the templates' code past the first checks runs.
    if cases >= 100 {
        assert!(rendered > cases, "{rendered} renders succeeded in {cases} cases");
    }
}
