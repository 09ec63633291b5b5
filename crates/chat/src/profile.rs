//! What serving a model needs to know about its chat format, found once when the model is
//! loaded: the reasoning tags and whether the template opens the block itself, the syntax the
//! model writes tool calls in, where rendered messages end, and what the template can render.
//! Request handlers read this instead of searching the template's source or rendering probes
//! (or every prefix of the conversation) for every request.

use serde_json::{json, Map, Value as Json};

use crate::{
    prompt_ends_in_reasoning, ChatError, ChatTemplate, TemplateInput, Tokenizer, ToolCallFormat,
};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
/// Text a probe renders, to be found again in the output: a template that drops it ignores
/// what carried it.
const PROBE_TOOL: &str = "spindle_probe_tool";
const PROBE_SYSTEM: &str = "spindle probe system prompt";
const PROBE_ANSWER: &str = "spindle probe answer";

/// A model's chat format, as its template and tokenizer define it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelProfile {
    /// The reasoning block, for templates that know `<think>` blocks.
    pub reasoning: Option<ReasoningProfile>,
    /// `--tool-call-parser` where given, else the template's, else Hermes (the most common).
    pub tool_call_format: ToolCallFormat,
    /// `None` where the template ends user and assistant turns differently (or not at all).
    pub boundaries: Option<MessageBoundaries>,
    pub capabilities: TemplateCapabilities,
}

/// How the template marks where messages end, learnt from a one-turn conversation rendered
/// with and without the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageBoundaries {
    /// What follows every message, e.g. `<|im_end|>\n` (ChatML) or `<|eot_id|>` (Llama 3).
    pub turn_end: String,
}

/// The reasoning block a model writes before its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningProfile {
    pub open: String,
    pub close: String,
    /// The generation prompt already opens the block when `enable_thinking` is left unset.
    pub opens_by_default: bool,
    /// The same, when `enable_thinking` is set (to anything but `false`).
    pub opens_when_enabled: bool,
    /// What ends a block the thinking budget cuts short: the close tag on its own line and
    /// the blank line before the answer, as the model writes it.
    pub close_ids: Vec<u32>,
}

/// What the template renders, judged by rendering probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateCapabilities {
    /// The tool definitions reach the prompt.
    pub tools: bool,
    /// A system message is accepted and reaches the prompt.
    pub system_role: bool,
    /// `enable_thinking` changes the generation prompt.
    pub thinking_toggle: bool,
}

impl ModelProfile {
    /// Reads the profile off `template` and `tokenizer`; `tool_call_parser` overrides the
    /// tool-call syntax the template shows.
    pub fn new(
        template: &ChatTemplate,
        tokenizer: &Tokenizer,
        tool_call_parser: Option<ToolCallFormat>,
    ) -> Result<Self, ChatError> {
        let probe = Probe(template);
        let reasoning = if template.source().contains(THINK_OPEN) {
            let opens = |extra: Map<String, Json>| {
                probe.generation_prompt(extra).is_some_and(|prompt| {
                    prompt_ends_in_reasoning(&prompt, THINK_OPEN, THINK_CLOSE)
                })
            };
            Some(ReasoningProfile {
                open: THINK_OPEN.into(),
                close: THINK_CLOSE.into(),
                opens_by_default: opens(Map::new()),
                opens_when_enabled: opens(thinking(true)),
                close_ids: tokenizer.encode(&format!("\n{THINK_CLOSE}\n\n"), false)?,
            })
        } else {
            None
        };
        let tool_call_format = tool_call_parser
            .or_else(|| ToolCallFormat::detect(template.source()))
            .unwrap_or(ToolCallFormat::Hermes);
        let capabilities = TemplateCapabilities {
            tools: probe.shows(PROBE_TOOL, &[user()], Some(&[probe_tool()])),
            system_role: probe.shows(
                PROBE_SYSTEM,
                &[json!({"role": "system", "content": PROBE_SYSTEM}), user()],
                None,
            ),
            thinking_toggle: match (
                probe.generation_prompt(thinking(true)),
                probe.generation_prompt(thinking(false)),
            ) {
                (Some(on), Some(off)) => on != off,
                _ => false,
            },
        };
        Ok(Self { reasoning, tool_call_format, boundaries: probe.boundaries(), capabilities })
    }
}

impl ReasoningProfile {
    /// Whether generation starts inside the block, for a request with thinking on whose
    /// `enable_thinking` is `enable_thinking`.
    pub fn starts_inside(&self, enable_thinking: Option<&Json>) -> bool {
        match enable_thinking {
            None => self.opens_by_default,
            Some(_) => self.opens_when_enabled,
        }
    }
}

impl MessageBoundaries {
    /// Byte offsets in `prompt` (rendered with the generation prompt) where a message ends,
    /// and where an assistant turn's opening ends when it is spelled as the prompt's own
    /// generation prompt (where the prompt that asked for that turn ended), short of the end.
    /// The marker written inside a message's text also counts: a cut there costs a snapshot
    /// nobody resumes from, never a wrong answer. The offsets come out in increasing order:
    /// the generation prompt follows the last marker, so it holds none.
    pub fn find(&self, prompt: &str) -> Vec<usize> {
        let turn_ends: Vec<usize> = prompt
            .match_indices(self.turn_end.as_str())
            .map(|(at, marker)| at + marker.len())
            .collect();
        let Some(&last) = turn_ends.last() else { return Vec::new() };
        let generation_prompt = &prompt[last..];
        let mut ends = Vec::new();
        for end in turn_ends {
            ends.push(end);
            if !generation_prompt.is_empty() && prompt[end..].starts_with(generation_prompt) {
                ends.push(end + generation_prompt.len());
            }
        }
        ends.retain(|&end| end < prompt.len());
        ends
    }
}

/// Renders one-turn conversations; a render the template refuses or fails counts as nothing.
struct Probe<'a>(&'a ChatTemplate);

impl Probe<'_> {
    fn render(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        extra: &Map<String, Json>,
        add_generation_prompt: bool,
    ) -> Option<String> {
        self.0.render(&TemplateInput { messages, tools, add_generation_prompt, extra }).ok()
    }

    /// A user turn and the generation prompt after it.
    fn generation_prompt(&self, extra: Map<String, Json>) -> Option<String> {
        self.render(&[user()], None, &extra, true)
    }

    /// The turn end is what follows the answer. User turns must end the same way, and both the
    /// answer's turn and the generation prompt must extend the conversation before them, for
    /// offsets in one rendering to hold in the next call's.
    fn boundaries(&self) -> Option<MessageBoundaries> {
        let no_extra = Map::new();
        let asked = self.render(&[user()], None, &no_extra, false)?;
        let answered = self.render(
            &[user(), json!({"role": "assistant", "content": PROBE_ANSWER})],
            None,
            &no_extra,
            false,
        )?;
        let prompt = self.generation_prompt(no_extra.clone())?;
        let turn_end = &answered[answered.rfind(PROBE_ANSWER)? + PROBE_ANSWER.len()..];
        let consistent = !turn_end.is_empty()
            && asked.ends_with(turn_end)
            && answered.starts_with(&asked)
            && prompt.starts_with(&asked);
        consistent.then(|| MessageBoundaries { turn_end: turn_end.to_string() })
    }

    /// Whether `needle`, carried by `messages` or `tools`, reaches the prompt.
    fn shows(&self, needle: &str, messages: &[Json], tools: Option<&[Json]>) -> bool {
        self.render(messages, tools, &Map::new(), false).is_some_and(|text| text.contains(needle))
    }
}

fn user() -> Json {
    json!({"role": "user", "content": "Hi"})
}

fn probe_tool() -> Json {
    json!({"type": "function", "function": {
        "name": PROBE_TOOL,
        "description": "Probe",
        "parameters": {"type": "object", "properties": {}},
    }})
}

fn thinking(on: bool) -> Map<String, Json> {
    Map::from_iter([("enable_thinking".to_string(), Json::Bool(on))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(opens_by_default: bool, opens_when_enabled: bool) -> ReasoningProfile {
        ReasoningProfile {
            open: THINK_OPEN.into(),
            close: THINK_CLOSE.into(),
            opens_by_default,
            opens_when_enabled,
            close_ids: vec![1],
        }
    }

    #[test]
    fn ends_are_turn_ends_and_generation_prompts_before_the_prompts_end() {
        let chatml = MessageBoundaries { turn_end: "<|im_end|>\n".into() };
        let prompt = "<|im_start|>user\nA<|im_end|>\n<|im_start|>assistant\nB<|im_end|>\n\
                      <|im_start|>user\nC<|im_end|>\n<|im_start|>assistant\n";
        let at = |needle: &str| prompt.find(needle).unwrap();
        let asking = prompt.rfind("<|im_start|>assistant").unwrap();
        // B's turn opens as this prompt's generation prompt does: where the prompt that asked
        // for B ended counts too.
        let expected = [at("<|im_start|>assistant\nB"), at("B"), at("<|im_start|>user\nC"), asking];
        assert_eq!(chatml.find(prompt), expected);
        assert!(chatml.find("no markers at all").is_empty());
    }

    #[test]
    fn an_unset_toggle_reads_the_default_and_any_set_one_the_enabled_probe() {
        let profile = tags(false, true);
        assert!(!profile.starts_inside(None));
        assert!(profile.starts_inside(Some(&Json::Bool(true))));
        assert!(profile.starts_inside(Some(&json!("yes"))));
    }
}
