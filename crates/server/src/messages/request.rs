//! An Anthropic Messages request read as the pipeline's generation request: the system prompt
//! and any `system` turns become one leading system message, tool results become `tool`
//! messages, assistant `tool_use` blocks become tool calls and `thinking` blocks the turn's
//! reasoning; `thinking` and `output_config.effort` become the reasoning switch and budget,
//! `output_config.format` the answer's format.

use std::borrow::Cow;

use serde_json::{Map, Value};
use spindle_api::anthropic::{
    Content, Effort, InputBlock, MessagesRequest, SystemPrompt, ThinkingConfig, ToolChoice,
};
use spindle_api::{
    ApiError, ChatMessage, FunctionCall, FunctionDefinition, MessageContent, SamplingParams,
    StopSequences, Tool, ToolCall, ToolType,
};

use crate::pipeline::request::{
    AnswerFormat, Conversation, GenerationRequest, Prompt, ToolChoice as Choice,
};

/// Claude Code opens its system prompt with a line like `x-anthropic-billing-header:
/// cc_version=2.1.3.abc; cc_entrypoint=cli; cch=1f2e3;` whose values change from request to
/// request. Left in, every prompt would differ from its first tokens on and miss the prefix
/// cache; it means nothing to the model, so it is dropped.
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

pub(crate) fn generation_request(request: &MessagesRequest) -> Result<GenerationRequest, ApiError> {
    let mut system: Vec<Cow<str>> = match &request.system {
        None => Vec::new(),
        Some(SystemPrompt::Text(text)) => vec![Cow::Borrowed(text.as_str())],
        Some(SystemPrompt::Blocks(blocks)) => blocks
            .iter()
            .enumerate()
            .map(|(i, block)| match block.kind.as_str() {
                "text" => Ok(Cow::Borrowed(block.text.as_str())),
                other => Err(bad(
                    format!("system[{i}].type"),
                    format!("system blocks of type `{other}` are not supported; only `text`"),
                )),
            })
            .collect::<Result<_, _>>()?,
    };
    let mut messages = Vec::new();
    for (i, message) in request.messages.iter().enumerate() {
        let blocks = as_blocks(&message.content);
        match message.role.as_str() {
            "user" => user_turn(i, &blocks, &mut messages)?,
            "assistant" => messages.push(assistant_turn(i, &blocks)?),
            // Rendered in place, a second system message breaks templates (Qwen's tool calling
            // among them); it joins the one at the top instead.
            "system" => system.push(Cow::Owned(texts(i, &blocks)?)),
            other => {
                return Err(bad(
                    format!("messages[{i}].role"),
                    format!("unknown role `{other}`; expected user or assistant"),
                ))
            }
        }
    }
    let system = system.join("\n");
    let system = strip_billing_header(&system);
    if !system.is_empty() {
        messages.insert(0, message("system", Some(system.to_string())));
    }

    let tools: Vec<Tool> = request
        .tools
        .iter()
        // Anthropic's server tools (web search, its bash and editor) are not Spindle's to run.
        .filter(|tool| tool.is_client_tool())
        .map(|tool| Tool {
            kind: ToolType::Function,
            function: FunctionDefinition {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.input_schema.clone(),
                strict: tool.strict,
            },
        })
        .collect();
    let (tool_choice, single_call) = match &request.tool_choice {
        None => (None, false),
        Some(ToolChoice::Auto { disable_parallel_tool_use }) => {
            (Some(Choice::Auto), *disable_parallel_tool_use)
        }
        Some(ToolChoice::Any { disable_parallel_tool_use }) => {
            (Some(Choice::Required), *disable_parallel_tool_use)
        }
        Some(ToolChoice::Tool { name, disable_parallel_tool_use }) => {
            (Some(Choice::Named(name.clone())), *disable_parallel_tool_use)
        }
        Some(ToolChoice::None) => (Some(Choice::None), false),
    };

    let (template_kwargs, thinking_budget) = reasoning(request);
    let conversation = Conversation {
        messages,
        // `auto` without tools is no choice at all: no tool-call parsing.
        tool_choice: if tools.is_empty() && tool_choice == Some(Choice::Auto) {
            None
        } else {
            tool_choice
        },
        tools,
        parallel_tool_calls: !single_call,
        format: answer_format(request)?,
        template_kwargs,
        thinking_budget,
    };
    Ok(GenerationRequest {
        model: request.model.clone(),
        prompt: Prompt::Chat(Box::new(conversation)),
        sampling: SamplingParams {
            temperature: request.temperature,
            top_p: request.top_p,
            top_k: request.top_k,
            stop: (!request.stop_sequences.is_empty())
                .then(|| StopSequences::Many(request.stop_sequences.clone())),
            speculative: request.speculative,
            ..Default::default()
        },
        max_tokens: request.max_tokens,
        logprobs: None,
        prompt_field: "messages",
        endpoint: "/v1/messages",
        ttl: request.ttl,
    })
}

/// `output_config.format`, a JSON schema for the answer.
fn answer_format(request: &MessagesRequest) -> Result<Option<AnswerFormat>, ApiError> {
    let Some(format) =
        request.output_config.as_ref().and_then(|c| c.format.as_ref()).filter(|f| !f.is_null())
    else {
        return Ok(None);
    };
    match (format["type"].as_str(), &format["schema"]) {
        (Some("json_schema"), schema @ Value::Object(_)) => {
            Ok(Some(AnswerFormat::JsonSchema(schema.clone())))
        }
        _ => Err(bad(
            "output_config.format".into(),
            "expected {\"type\": \"json_schema\", \"schema\": {...}}".into(),
        )),
    }
}

/// Thinking on or off (absent: the server's default) and its budget: `budget_tokens` when given,
/// else a share of `max_tokens` by effort, the shares the Responses API gives its efforts: 1/4 at
/// low, 1/2 at medium, 3/4 at high; `xhigh` and `max` set no budget of their own (the server's
/// `--thinking-budget`, then the engine's rule that the answer keeps a quarter of `max_tokens`).
fn reasoning(request: &MessagesRequest) -> (Map<String, Value>, Option<u32>) {
    let mut kwargs = Map::new();
    let enable = match request.thinking {
        None => None,
        Some(
            ThinkingConfig::Enabled { .. }
            | ThinkingConfig::Adaptive
            | ThinkingConfig::BetweenTools,
        ) => Some(true),
        Some(ThinkingConfig::Disabled) => Some(false),
    };
    if let Some(enable) = enable {
        kwargs.insert("enable_thinking".into(), Value::Bool(enable));
    }
    let effort = request.output_config.as_ref().and_then(|c| c.effort);
    let budget = match (request.thinking, effort, request.max_tokens) {
        (Some(ThinkingConfig::Enabled { budget_tokens }), _, _) => Some(budget_tokens),
        (Some(ThinkingConfig::Disabled), _, _) => None,
        (_, Some(Effort::Low), Some(max)) => Some(max / 4),
        (_, Some(Effort::Medium), Some(max)) => Some(max / 2),
        (_, Some(Effort::High), Some(max)) => Some(max / 4 * 3),
        _ => None,
    };
    (kwargs, budget)
}

fn strip_billing_header(system: &str) -> &str {
    let mut rest = system;
    while rest.starts_with(BILLING_HEADER) {
        rest = rest.split_once('\n').map_or("", |(_, after)| after);
    }
    rest
}

fn as_blocks(content: &Content) -> Cow<'_, [InputBlock]> {
    match content {
        Content::Text(text) => Cow::Owned(vec![InputBlock::Text { text: text.clone() }]),
        Content::Blocks(blocks) => Cow::Borrowed(blocks),
    }
}

/// A user turn: its tool results first, as `tool` messages right after the assistant's calls
/// (where OpenAI-shaped templates expect them), then its text.
fn user_turn(
    i: usize,
    blocks: &[InputBlock],
    messages: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    let mut text = Vec::new();
    let mut results = 0;
    for (j, block) in blocks.iter().enumerate() {
        match block {
            InputBlock::Text { text: t } => text.push(t.as_str()),
            InputBlock::ToolResult { tool_use_id, content, is_error } => {
                let mut output = match content {
                    None => String::new(),
                    Some(content) => texts(i, &as_blocks(content))?,
                };
                if *is_error {
                    output.insert_str(0, "Error: ");
                }
                messages.push(ChatMessage {
                    tool_call_id: Some(tool_use_id.clone()),
                    ..message("tool", Some(output))
                });
                results += 1;
            }
            other => return Err(misplaced(i, j, other, "user")),
        }
    }
    if !text.is_empty() || results == 0 {
        messages.push(message("user", Some(text.join("\n"))));
    }
    Ok(())
}

/// An assistant turn: text, calls, and the reasoning of its thinking blocks (redacted thinking
/// is opaque and dropped).
fn assistant_turn(i: usize, blocks: &[InputBlock]) -> Result<ChatMessage, ApiError> {
    let (mut text, mut reasoning, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        match block {
            InputBlock::Text { text: t } => text.push(t.as_str()),
            InputBlock::Thinking { thinking, .. } => reasoning.push(thinking.as_str()),
            InputBlock::RedactedThinking { .. } => {}
            InputBlock::ToolUse { id, name, input } => calls.push(ToolCall {
                id: id.clone(),
                kind: ToolType::Function,
                function: FunctionCall {
                    name: name.clone(),
                    arguments: if input.is_null() { "{}".into() } else { input.to_string() },
                },
            }),
            other => return Err(misplaced(i, j, other, "assistant")),
        }
    }
    let content = (!text.is_empty() || calls.is_empty()).then(|| text.join("\n"));
    Ok(ChatMessage {
        tool_calls: calls,
        reasoning_content: (!reasoning.is_empty()).then(|| reasoning.join("\n")),
        ..message("assistant", content)
    })
}

/// The text of blocks that may only be text (a `system` turn, a tool result).
fn texts(i: usize, blocks: &[InputBlock]) -> Result<String, ApiError> {
    let mut out = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        match block {
            InputBlock::Text { text } => out.push(text.as_str()),
            other => return Err(misplaced(i, j, other, "text-only")),
        }
    }
    Ok(out.join("\n"))
}

fn misplaced(i: usize, j: usize, block: &InputBlock, place: &str) -> ApiError {
    let param = format!("messages[{i}].content[{j}]");
    let message = match block {
        InputBlock::Image { .. } | InputBlock::Document { .. } => {
            "image and document blocks are not supported: the served model reads text only"
                .to_string()
        }
        other => format!("a `{}` block cannot appear in {place} content", kind(other)),
    };
    bad(param, message)
}

fn kind(block: &InputBlock) -> String {
    serde_json::to_value(block)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn message(role: &str, content: Option<String>) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: content.map(MessageContent::Text),
        name: None,
        tool_calls: Vec::new(),
        tool_call_id: None,
        reasoning_content: None,
    }
}

fn bad(param: String, message: String) -> ApiError {
    ApiError::bad_request(format!("{param}: {message}"), Some(&param))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(body: Value) -> MessagesRequest {
        serde_json::from_value(body).unwrap()
    }

    /// The conversation `request` becomes.
    fn conversation(request: &MessagesRequest) -> Result<Conversation, ApiError> {
        match generation_request(request)?.prompt {
            Prompt::Chat(conversation) => Ok(*conversation),
            Prompt::Tokens(_) => unreachable!("a Messages request is a conversation"),
        }
    }

    #[test]
    fn the_billing_header_and_system_turns_join_one_system_message() {
        let chat = conversation(&request(json!({
            "max_tokens": 8,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3.abc; cch=1f2e3;"},
                       {"type": "text", "text": "You are terse."}],
            "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "Answer in French."}],
        })))
        .unwrap();
        assert_eq!(chat.messages.len(), 2);
        assert_eq!(chat.messages[0].role, "system");
        assert_eq!(
            chat.messages[0].content,
            Some(MessageContent::Text("You are terse.\nAnswer in French.".into()))
        );
        assert_eq!(chat.messages[1].role, "user");
    }

    #[test]
    fn tool_use_and_results_become_calls_and_tool_messages() {
        let chat = conversation(&request(json!({
            "max_tokens": 8,
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}, {"type": "bash_20250124", "name": "bash"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny", "is_error": true},
                    {"type": "text", "text": "thanks"}]},
            ],
        })))
        .unwrap();
        let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        let assistant = &chat.messages[1];
        assert_eq!(assistant.content, None);
        assert_eq!(assistant.reasoning_content.as_deref(), Some("Use the tool."));
        assert_eq!(assistant.tool_calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(chat.messages[2].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(chat.messages[2].content, Some(MessageContent::Text("Error: sunny".into())));
        assert_eq!(chat.tools.len(), 1, "the server tool is dropped");
        assert_eq!(chat.tool_choice, Some(Choice::Required));
        assert!(!chat.parallel_tool_calls);
    }

    #[test]
    fn thinking_and_effort_set_the_switch_and_the_budget() {
        let cases = [
            (
                json!({"thinking": {"type": "enabled", "budget_tokens": 300}, "output_config": {"effort": "low"}}),
                Some(true),
                Some(300),
            ),
            (
                json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}),
                Some(true),
                Some(750),
            ),
            (
                json!({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}}),
                Some(false),
                None,
            ),
            (json!({"output_config": {"effort": "medium"}}), None, Some(500)),
            (json!({"output_config": {"effort": "low"}}), None, Some(250)),
            (json!({"output_config": {"effort": "max"}}), None, None),
            (
                json!({"thinking": {"type": "between_tools"}, "output_config": {"effort": "xhigh"}}),
                Some(true),
                None,
            ),
            (json!({}), None, None),
        ];
        for (extra, enable, budget) in cases {
            let mut body =
                json!({"max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let chat = conversation(&request(body.clone())).unwrap();
            assert_eq!(
                chat.template_kwargs.get("enable_thinking").and_then(Value::as_bool),
                enable,
                "{body}"
            );
            assert_eq!(chat.thinking_budget, budget, "{body}");
        }
    }

    #[test]
    fn an_output_format_is_a_json_schema_response_format() {
        let schema = json!({"type": "object", "properties": {"title": {"type": "string"}}});
        let body = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                          "output_config": {"format": {"type": "json_schema", "schema": schema}}});
        let chat = conversation(&request(body)).unwrap();
        assert_eq!(chat.format, Some(AnswerFormat::JsonSchema(schema)));
        let body = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "output_config": {"format": {"type": "yaml"}}});
        assert_eq!(
            conversation(&request(body)).unwrap_err().param.as_deref(),
            Some("output_config.format")
        );
    }

    #[test]
    fn images_and_misplaced_blocks_are_refused_by_position() {
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}});
        let error = conversation(&request(
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [image]}]}),
        ))
        .unwrap_err();
        assert_eq!(error.param.as_deref(), Some("messages[0].content[0]"));
        assert!(error.message.contains("image"), "{}", error.message);
        let tool_use = json!({"type": "tool_use", "id": "t", "name": "f", "input": {}});
        let error = conversation(&request(
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [tool_use]}]}),
        ))
        .unwrap_err();
        assert!(error.message.contains("`tool_use`"), "{}", error.message);
    }
}
