//! Chat templates rendered by us against Jinja2 configured as transformers configures it
//! (tests/data/templates/expected.json, made by tests/data/templates/render_expected.py), for
//! templates taken from the GGUF files and from Qwen3's tokenizer_config.json.

use crate::common;

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{json, Value as Json};
use spindle_chat::{ChatError, ChatTemplate, TemplateInput, Tokenizer};

#[derive(Deserialize)]
struct Case {
    template: String,
    name: String,
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    add_generation_prompt: bool,
    kwargs: serde_json::Map<String, Json>,
    expected: String,
}

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

fn cases(template: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(data("templates/expected.json")).unwrap();
    let all: Vec<Case> = serde_json::from_str(&text).unwrap();
    let mine: Vec<Case> = all.into_iter().filter(|c| c.template == template).collect();
    assert!(!mine.is_empty(), "no cases for {template}");
    mine
}

fn check(template: &ChatTemplate, cases: &[Case]) {
    for c in cases {
        let input = TemplateInput {
            messages: &c.messages,
            tools: c.tools.as_deref(),
            add_generation_prompt: c.add_generation_prompt,
            extra: &c.kwargs,
        };
        let got =
            template.render(&input).unwrap_or_else(|e| panic!("{}/{}: {e}", c.template, c.name));
        assert_eq!(got, c.expected, "{}/{}", c.template, c.name);
    }
}

/// The GGUF's template, checked to be the one Jinja2 rendered the expectations with.
fn gguf_template(model: &str, file: &str) -> (ChatTemplate, Tokenizer) {
    let meta = common::gguf_metadata(model, file);
    let Some(source) = meta.get("tokenizer.chat_template").and_then(|v| v.as_str()) else {
        panic!("{model} has no template")
    };
    assert_eq!(
        source,
        &std::fs::read_to_string(data(&format!("templates/{model}.jinja"))).unwrap()
    );
    let tok = Tokenizer::from_gguf(meta.clone()).unwrap();
    (ChatTemplate::from_gguf(&meta, &tok).unwrap().expect("template present"), tok)
}

#[test]
fn smollm2_template_matches_jinja2() {
    let (template, tok) = gguf_template("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf");
    check(&template, &cases("smollm2-135m"));
    // The exact ChatML shape, spelled out.
    let msgs = [json!({"role": "system", "content": "S"}), json!({"role": "user", "content": "U"})];
    let out = template
        .render(&TemplateInput {
            messages: &msgs,
            tools: None,
            add_generation_prompt: true,
            extra: &Default::default(),
        })
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
    // And the prompt tokenizes with the turn markers as single ids.
    let ids = tok.encode(&out, true).unwrap();
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == im_start).count(), 3);
}

#[test]
fn qwen25_template_with_tools_matches_jinja2() {
    let (template, _) =
        gguf_template("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    check(&template, &cases("qwen2.5-coder-0.5b"));
}

#[test]
fn qwen3_template_with_tools_and_thinking_matches_jinja2() {
    let tok = Tokenizer::from_tokenizer_json(&data("qwen3/tokenizer.json")).unwrap();
    let template = ChatTemplate::from_tokenizer_config(&data("qwen3/tokenizer_config.json"), &tok)
        .unwrap()
        .unwrap();
    check(&template, &cases("qwen3"));
}

#[test]
fn model_without_template_gives_none_and_chatml_fallback_works() {
    let meta = common::gguf_metadata("gemma3-270m", "gemma-3-270m-q4_k_m.gguf");
    let tok = Tokenizer::from_gguf(meta.clone()).unwrap();
    assert!(ChatTemplate::from_gguf(&meta, &tok).unwrap().is_none());
    let msgs =
        [json!({"role": "user", "content": "Hi"}), json!({"role": "assistant", "content": "Yo"})];
    let out = ChatTemplate::chatml()
        .render(&TemplateInput {
            messages: &msgs,
            tools: None,
            add_generation_prompt: false,
            extra: &Default::default(),
        })
        .unwrap();
    assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n");
}

#[test]
fn tokenizer_config_template_list_takes_default_and_missing_key_is_none() {
    let tok = Tokenizer::from_tokenizer_json(&data("qwen3/tokenizer.json")).unwrap();
    let dir = std::env::temp_dir().join(format!("spindle-chat-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let listed = dir.join("listed.json");
    let templates = json!({"chat_template": [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "{{ eos_token }}{{ messages | length }}"}]});
    std::fs::write(&listed, templates.to_string()).unwrap();
    let t = ChatTemplate::from_tokenizer_config(&listed, &tok).unwrap().unwrap();
    let out = t
        .render(&TemplateInput {
            messages: &[json!({})],
            tools: None,
            add_generation_prompt: false,
            extra: &Default::default(),
        })
        .unwrap();
    assert_eq!(out, "<|im_end|>1");
    let bare = dir.join("bare.json");
    std::fs::write(&bare, "{}").unwrap();
    assert!(ChatTemplate::from_tokenizer_config(&bare, &tok).unwrap().is_none());
    assert!(ChatTemplate::from_tokenizer_config(&dir.join("absent.json"), &tok).unwrap().is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn template_errors_are_chat_errors_with_the_message() {
    let err = ChatTemplate::new("{% if %}", None, None).err().unwrap();
    assert!(matches!(err, ChatError::Template(_)), "{err}");
    let t = ChatTemplate::new("{{ raise_exception('System message must be first') }}", None, None)
        .unwrap();
    let err = t
        .render(&TemplateInput {
            messages: &[],
            tools: None,
            add_generation_prompt: false,
            extra: &Default::default(),
        })
        .unwrap_err();
    assert!(err.to_string().contains("System message must be first"), "{err}");
}
