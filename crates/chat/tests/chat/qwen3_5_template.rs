//! Qwen3.5's chat template, as we wrote it (tests/data/qwen3_5/qwen3_5_chat_template.jinja:
//! thinking on by default, `<tool_call><function=…><parameter=…>` calls, reasoning kept only after
//! the last user query), rendered by us (minijinja) against goldens recorded with Jinja2 configured
//! as transformers configures it from Qwen's official Qwen3.5 template
//! (tests/data/qwen3_5/expected.json, made by tests/data/qwen3_5/render_expected.py, which also
//! checks that our template reproduces every golden under Jinja2, and optionally that transformers'
//! own apply_chat_template agrees).

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{json, Value as Json};
use spindle_chat::{ChatError, ChatTemplate, TemplateInput, Tokenizer};

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    add_generation_prompt: bool,
    kwargs: serde_json::Map<String, Json>,
    /// The prompt, or else (in `error`) the message of the template's own `raise_exception`.
    expected: Option<String>,
    error: Option<String>,
}

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3_5").join(rel)
}

fn cases() -> Vec<Case> {
    serde_json::from_str(&std::fs::read_to_string(data("expected.json")).unwrap()).unwrap()
}

fn render(template: &ChatTemplate, c: &Case) -> Result<String, ChatError> {
    template.render(&TemplateInput {
        messages: &c.messages,
        tools: c.tools.as_deref(),
        add_generation_prompt: c.add_generation_prompt,
        extra: &c.kwargs,
    })
}

const TEMPLATE: &str = "qwen3_5_chat_template.jinja";

fn template() -> ChatTemplate {
    let source = std::fs::read_to_string(data(TEMPLATE)).unwrap();
    ChatTemplate::new(&source, None, Some("<|im_end|>")).unwrap()
}

#[test]
fn renders_like_jinja2_in_transformers() {
    let template = template();
    let cases = cases();
    let mut wrong = Vec::new();
    for c in cases.iter().filter(|c| c.expected.is_some()) {
        match render(&template, c) {
            Ok(got) if Some(&got) == c.expected.as_ref() => {}
            Ok(got) => wrong.push(format!(
                "{}:\n--- got\n{got}\n--- expected\n{}",
                c.name,
                c.expected.as_ref().unwrap()
            )),
            Err(e) => wrong.push(format!("{}: {e}", c.name)),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

/// What each error case's message must mention (any one spelling of each group, ignoring case):
/// the message has to name the problem, whatever its exact wording.
const ERROR_MEANINGS: [(&str, &[&[&str]]); 5] = [
    ("error_no_messages", &[&["no messages", "empty"]]),
    ("error_system_not_first", &[&["system"], &["beginning", "first", "start"]]),
    ("error_no_user_query", &[&["user"]]),
    ("error_unknown_role", &[&["role"]]),
    ("error_image_in_system", &[&["system"], &["image"]]),
];

#[test]
fn template_errors_name_the_problem() {
    let template = template();
    let errors: Vec<Case> = cases().into_iter().filter(|c| c.error.is_some()).collect();
    assert_eq!(errors.len(), ERROR_MEANINGS.len());
    for c in &errors {
        let err = render(&template, c).expect_err(&c.name);
        assert!(matches!(err, ChatError::TemplateRaised(_)), "{}: {err}", c.name);
        let (_, groups) = ERROR_MEANINGS
            .iter()
            .find(|(name, _)| *name == c.name)
            .unwrap_or_else(|| panic!("{}", c.name));
        let message = err.to_string().to_lowercase();
        for group in groups.iter() {
            assert!(
                group.iter().any(|word| message.contains(word)),
                "{}: {err} names none of {group:?}",
                c.name
            );
        }
    }
}

#[test]
fn tokenizer_config_carries_the_same_template() {
    let tok = Tokenizer::from_tokenizer_json(&data("tokenizer.json")).unwrap();
    let from_config =
        ChatTemplate::from_tokenizer_config(&data("tokenizer_config.json"), &tok).unwrap().unwrap();
    assert_eq!(from_config.source(), std::fs::read_to_string(data(TEMPLATE)).unwrap());

    // A rendered tool round tokenizes with every marker as one added token.
    let c = cases().into_iter().find(|c| c.name == "tool_round_then_generation").unwrap();
    let prompt = render(&from_config, &c).unwrap();
    let ids = tok.encode(&prompt, false).unwrap();
    let count = |t: &str| {
        let id = tok.token_to_id(t).unwrap();
        ids.iter().filter(|&&i| i == id).count()
    };
    // Two calls, plus two of each in the tools block's instructions.
    assert_eq!((count("<tool_call>"), count("</tool_call>")), (4, 4));
    assert_eq!((count("<tool_response>"), count("</tool_response>")), (2, 2));
    assert_eq!((count("<think>"), count("</think>")), (2, 1));
    assert_eq!((count("<|im_start|>"), count("<|im_end|>")), (5, 4));
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
}

#[test]
fn thinking_switch_changes_only_the_generation_prompt() {
    let template = template();
    let msgs = [json!({"role": "user", "content": "Hi"})];
    let with = |extra: Json| {
        let extra = extra.as_object().unwrap().clone();
        template
            .render(&TemplateInput {
                messages: &msgs,
                tools: None,
                add_generation_prompt: true,
                extra: &extra,
            })
            .unwrap()
    };
    let base = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(with(json!({})), format!("{base}<think>\n"));
    assert_eq!(with(json!({"enable_thinking": true})), format!("{base}<think>\n"));
    assert_eq!(with(json!({"enable_thinking": false})), format!("{base}<think>\n\n</think>\n\n"));
}
