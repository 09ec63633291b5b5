//! A conversation rendered by the model's chat template: the server's and the request's
//! template variables merged, the thinking switch resolved into how the answer's reasoning is
//! split, and the byte offsets where the prefix cache keeps snapshots.

use serde_json::{json, Map, Value};
use spindle_api::{ApiError, ChatMessage, Tool};
use spindle_chat::TemplateInput;
use spindle_runner::ReasoningMode;

use crate::error::failure;
use crate::loaded_model::LoadedModel;
use crate::state::AppState;

/// A conversation rendered by the chat template.
pub(crate) struct RenderedPrompt {
    pub text: String,
    /// Think tags split the answer when the template knows them and thinking is on (the
    /// server's template kwargs, then the request's, then `--no-thinking` where neither says).
    pub reasoning: ReasoningMode,
    /// Byte offsets in `text` where the prefix cache keeps snapshots: the end of every message
    /// (a preamble the template writes as a turn of its own included), and before each
    /// assistant message the end of the prompt that asked for it (with the generation prompt),
    /// so the next call of a growing conversation resumes where the last one's prompt ended.
    /// Every call of a conversation cuts its prefill at the same offsets, which is what lets
    /// one call continue the state another computed. Found by the turn markers the model
    /// profile learnt, without rendering any shorter conversation.
    pub message_ends: Vec<usize>,
}

/// `messages` with `tools` offered, rendered with the generation prompt.
pub(crate) fn render_prompt(
    state: &AppState,
    model: &LoadedModel,
    messages: &[ChatMessage],
    tools: &[Tool],
    request_kwargs: &Map<String, Value>,
) -> Result<RenderedPrompt, ApiError> {
    let mut kwargs = state.config.chat_template_kwargs.clone();
    kwargs.extend(request_kwargs.clone());
    if !state.config.thinking_default {
        kwargs.entry("enable_thinking").or_insert(Value::Bool(false));
    }
    let enable_thinking = kwargs.get("enable_thinking");
    let reasoning = match &model.profile.reasoning {
        Some(tags) if enable_thinking != Some(&Value::Bool(false)) => ReasoningMode::Tagged {
            open: tags.open.clone(),
            close: tags.close.clone(),
            starts_inside: tags.starts_inside(enable_thinking),
        },
        _ => ReasoningMode::Off,
    };
    let messages: Vec<Value> = messages.iter().map(template_message).collect();
    let tools: Vec<Value> = tools.iter().map(|t| json!(t)).collect();
    let input = TemplateInput {
        messages: &messages,
        tools: (!tools.is_empty()).then_some(tools.as_slice()),
        add_generation_prompt: true,
        extra: &kwargs,
    };
    // A template refusing the messages (its `raise_exception`) is a 400; failing by itself, a 500.
    let text = model.model.template.render(&input).map_err(failure)?;
    let message_ends = model.profile.boundaries.as_ref().map_or_else(Vec::new, |b| b.find(&text));
    Ok(RenderedPrompt { text, reasoning, message_ends })
}

/// A message as chat templates expect it: `developer` read as `system`, content as one string
/// (`null`, which clients send beside tool calls, as empty: templates concatenate and search
/// it), tool-call arguments as the JSON object they encode (templates serialise them with
/// `tojson`).
fn template_message(message: &ChatMessage) -> Value {
    let role = if message.role == "developer" { "system" } else { message.role.as_str() };
    let mut out = Map::new();
    out.insert("role".into(), json!(role));
    out.insert(
        "content".into(),
        json!(message.content.as_ref().map(|c| c.text()).unwrap_or_default()),
    );
    if let Some(name) = &message.name {
        out.insert("name".into(), json!(name));
    }
    if !message.tool_calls.is_empty() {
        let calls: Vec<Value> = message
            .tool_calls
            .iter()
            .map(|call| {
                let arguments = serde_json::from_str::<Value>(&call.function.arguments)
                    .unwrap_or_else(|_| json!(call.function.arguments));
                json!({"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}})
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &message.tool_call_id {
        out.insert("tool_call_id".into(), json!(id));
    }
    if let Some(reasoning) = &message.reasoning_content {
        out.insert("reasoning_content".into(), json!(reasoning));
    }
    Value::Object(out)
}
