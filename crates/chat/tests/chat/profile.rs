//! Model profiles of the real templates the other tests render: what each one's probes find.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Map, Value as Json};
use spindle_chat::{
    ChatTemplate, MessageBoundaries, ModelProfile, TemplateCapabilities, TemplateInput, Tokenizer,
    ToolCallFormat,
};

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

fn chatml_turns() -> Option<MessageBoundaries> {
    Some(MessageBoundaries { turn_end: "<|im_end|>\n".into() })
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
    assert_eq!(profile.boundaries, chatml_turns());
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
    assert_eq!(profile.boundaries, chatml_turns());
    assert_eq!(profile.capabilities, ALL);
}

#[test]
fn qwen2_5_coder_renders_tools_and_no_reasoning() {
    let profile = profile_of("templates/qwen2.5-coder-0.5b.jinja", None);
    assert_eq!(profile.reasoning, None);
    assert_eq!(profile.boundaries, chatml_turns());
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
    // Nothing closes a turn: no boundaries to find.
    assert_eq!(profile.boundaries, None);
    assert!(
        !ModelProfile::new(&ChatTemplate::chatml(), &qwen3_tokenizer(), None)
            .unwrap()
            .capabilities
            .tools
    );
}

#[derive(Deserialize)]
struct Case {
    #[serde(default)]
    template: String,
    name: String,
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    kwargs: Map<String, Json>,
}

fn cases(rel: &str) -> Vec<Case> {
    serde_json::from_str(&std::fs::read_to_string(data(rel)).unwrap()).unwrap()
}

/// The message ends that rendering every shorter conversation finds (how the server found
/// them per request before): each prefix without, and each before an assistant message with,
/// the generation prompt, where the whole prompt starts with it.
fn ends_by_rendering_prefixes(template: &ChatTemplate, c: &Case) -> Option<BTreeSet<usize>> {
    let render = |messages: &[Json], add_generation_prompt: bool| {
        template
            .render(&TemplateInput {
                messages,
                tools: c.tools.as_deref(),
                add_generation_prompt,
                extra: &c.kwargs,
            })
            .ok()
    };
    let text = render(&c.messages, true)?;
    let mut prefixes = Vec::new();
    for n in 1..=c.messages.len() {
        if c.messages[n - 1]["role"] == "assistant" {
            prefixes.push(render(&c.messages[..n - 1], true));
        }
        prefixes.push(render(&c.messages[..n], false));
    }
    Some(
        prefixes
            .into_iter()
            .flatten()
            .filter(|p| !p.is_empty() && p.len() < text.len() && text.starts_with(p.as_str()))
            .map(|p| p.len())
            .collect(),
    )
}

/// The turn markers find, in one pass over the prompt, every end that rendering each shorter
/// conversation finds, for the templates and conversations the golden tests render.
#[test]
fn turn_markers_find_every_end_that_prefix_renders_find() {
    let tok = qwen3_tokenizer();
    let qwen3 = ChatTemplate::from_tokenizer_config(&data("qwen3/tokenizer_config.json"), &tok)
        .unwrap()
        .unwrap();
    let read = |rel: &str| {
        ChatTemplate::new(&std::fs::read_to_string(data(rel)).unwrap(), None, Some("<|im_end|>"))
            .unwrap()
    };
    let mut checked = 0;
    for (template, cases) in [
        (read("qwen3_5/qwen3_5_chat_template.jinja"), cases("qwen3_5/expected.json")),
        (
            qwen3,
            cases("templates/expected.json")
                .into_iter()
                .filter(|c| c.template == "qwen3")
                .collect(),
        ),
        (
            read("templates/qwen2.5-coder-0.5b.jinja"),
            cases("templates/expected.json")
                .into_iter()
                .filter(|c| c.template == "qwen2.5-coder-0.5b")
                .collect(),
        ),
        (
            read("templates/smollm2-135m.jinja"),
            cases("templates/expected.json")
                .into_iter()
                .filter(|c| c.template == "smollm2-135m")
                .collect(),
        ),
    ] {
        let profile = ModelProfile::new(&template, &tok, None).unwrap();
        let boundaries = profile.boundaries.expect("ChatML turns");
        for c in cases {
            let Some(expected) = ends_by_rendering_prefixes(&template, &c) else { continue };
            let prompt = template
                .render(&TemplateInput {
                    messages: &c.messages,
                    tools: c.tools.as_deref(),
                    add_generation_prompt: true,
                    extra: &c.kwargs,
                })
                .unwrap();
            let found: BTreeSet<usize> = boundaries.find(&prompt).into_iter().collect();
            assert!(expected.is_subset(&found), "{}: {expected:?} not all in {found:?}", c.name);
            checked += usize::from(c.messages.len() > 2);
        }
    }
    assert!(checked >= 8, "only {checked} multi-turn conversations");
}
