//! Model profiles of the real templates the other tests render: what each one's probes find.

use std::path::PathBuf;

use spindle_chat::{ChatTemplate, ModelProfile, TemplateCapabilities, Tokenizer, ToolCallFormat};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

fn qwen3_tokenizer() -> Tokenizer {
    Tokenizer::from_tokenizer_json(&data("qwen3/tokenizer.json")).unwrap()
}

/// The profile of the template in file `rel`, with the Qwen3 tokenizer.
fn profile_of(rel: &str, tool_call_parser: Option<ToolCallFormat>) -> ModelProfile {
    let source = std::fs::read_to_string(data(rel)).unwrap();
    let template = ChatTemplate::new(&source, None, Some("<|im_end|>")).unwrap();
    ModelProfile::new(&template, &qwen3_tokenizer(), tool_call_parser).unwrap()
}

const ALL: TemplateCapabilities =
    TemplateCapabilities { tools: true, system_role: true, thinking_toggle: true };

#[test]
fn qwen3_5_opens_the_block_itself_and_writes_xml_calls() {
    let profile = profile_of("qwen3_5/qwen3_5_chat_template.jinja", None);
    let reasoning = profile.reasoning.expect("Qwen3.5 thinks");
    assert_eq!((reasoning.open.as_str(), reasoning.close.as_str()), ("<think>", "</think>"));
    assert!(reasoning.opens_by_default && reasoning.opens_when_enabled);
    assert_eq!(profile.tool_call_format, ToolCallFormat::QwenXml);
    assert_eq!(profile.capabilities, ALL);
}

#[test]
fn qwen3_leaves_the_opening_tag_to_the_model() {
    let tok = qwen3_tokenizer();
    let template = ChatTemplate::from_tokenizer_config(&data("qwen3/tokenizer_config.json"), &tok)
        .unwrap()
        .unwrap();
    let profile = ModelProfile::new(&template, &tok, None).unwrap();
    let reasoning = profile.reasoning.expect("Qwen3 thinks");
    assert!(!reasoning.opens_by_default && !reasoning.opens_when_enabled);
    // `</think>` is one token of Qwen3's vocabulary, between the newlines around it.
    assert_eq!(reasoning.close_ids.len(), 3, "{:?}", reasoning.close_ids);
    assert_eq!(tok.decode(&reasoning.close_ids, false).unwrap(), "\n</think>\n\n");
    assert_eq!(profile.tool_call_format, ToolCallFormat::Hermes);
    assert_eq!(profile.capabilities, ALL);
}

#[test]
fn qwen2_5_coder_renders_tools_and_no_reasoning() {
    let profile = profile_of("templates/qwen2.5-coder-0.5b.jinja", None);
    assert_eq!(profile.reasoning, None);
    assert_eq!(profile.tool_call_format, ToolCallFormat::Hermes);
    assert_eq!(
        profile.capabilities,
        TemplateCapabilities { tools: true, system_role: true, thinking_toggle: false }
    );
}

#[test]
fn smollm2_drops_tools_and_the_parser_flag_wins() {
    let profile = profile_of("templates/smollm2-135m.jinja", None);
    assert_eq!(profile.reasoning, None);
    // The template shows no call syntax: the default.
    assert_eq!(profile.tool_call_format, ToolCallFormat::Hermes);
    assert_eq!(
        profile.capabilities,
        TemplateCapabilities { tools: false, system_role: true, thinking_toggle: false }
    );
    let flagged = profile_of("templates/smollm2-135m.jinja", Some(ToolCallFormat::Llama3Json));
    assert_eq!(flagged.tool_call_format, ToolCallFormat::Llama3Json);
}

#[test]
fn a_template_refusing_system_messages_has_no_system_role() {
    let source = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}";
    let template = ChatTemplate::new(source, None, None).unwrap();
    let profile = ModelProfile::new(&template, &qwen3_tokenizer(), None).unwrap();
    assert!(!profile.capabilities.system_role);
    assert!(
        !ModelProfile::new(&ChatTemplate::chatml(), &qwen3_tokenizer(), None)
            .unwrap()
            .capabilities
            .tools
    );
}
