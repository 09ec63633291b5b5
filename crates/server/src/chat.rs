//! `POST /v1/chat/completions`: messages → template → tokens → engine, answered as one
//! `chat.completion` or as a stream of `chat.completion.chunk`s built from the same outputs.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Map, Value};
use spindle_api::{ApiError, ChatCompletionRequest, ChatMessage};
use spindle_chat::TemplateInput;
use spindle_constrain::Constraint;
use spindle_runner::{ReasoningBudget, ReasoningMode, SequenceRequest};

use crate::chat_answer::ChatAnswer;
use crate::error::{failure, parse_json, HttpError};
use crate::generation::Generation;
use crate::request::{check_model, fit_max_tokens, sequence_request, ResponseHead};
use crate::respond::{respond, Delivery};
use crate::state::{Admission, AppState};
use crate::structured::answer_shape;
use crate::tool_output::ToolCallStage;

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let request: ChatCompletionRequest = parse_json(&body?)?;
    let ChatStart { mut generation, head, tools, .. } =
        start_chat(&state, &request, ChatEndpoint::ChatCompletions, Admission::Live)?;
    let delivery = Delivery::of(request.stream);
    if matches!(delivery, Delivery::Stream) && request.return_progress {
        generation.report_progress();
    }
    let include_usage = request.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let answer = ChatAnswer { head, tools, include_usage };
    Ok(respond(&state, generation, answer, delivery).await?)
}

/// A chat request handed to the engine: what every protocol adapter (Chat Completions,
/// Messages, Responses) reads its response from.
pub(crate) struct ChatStart {
    pub generation: Generation,
    pub head: ResponseHead,
    /// The tool-call parser, when the request offers tools (and `tool_choice` is not `none`).
    pub tools: Option<ToolCallStage>,
    /// Tokens in the rendered prompt (known before any is read).
    pub prompt_tokens: usize,
}

/// The protocol a chat request came in by, which names things in its answers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ChatEndpoint {
    ChatCompletions,
    Messages,
    Responses,
}

impl ChatEndpoint {
    /// The prefix of the response ids.
    fn id_prefix(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chatcmpl",
            Self::Messages => "msg",
            Self::Responses => "resp",
        }
    }

    /// The request field holding the conversation: what a prompt too long for the context
    /// tells the client to shorten.
    fn prompt_field(self) -> &'static str {
        match self {
            Self::ChatCompletions | Self::Messages => "messages",
            Self::Responses => "input",
        }
    }
}

/// Validates `request` (in the OpenAI chat shape, converted from `endpoint`'s), renders and
/// tokenizes it, resolves its answer shape and submits it, live or as a batch's.
pub(crate) fn start_chat(
    state: &Arc<AppState>,
    request: &ChatCompletionRequest,
    endpoint: ChatEndpoint,
    admission: Admission,
) -> Result<ChatStart, ApiError> {
    request.validate()?;
    check_model(state, request.model.as_deref())?;
    let shape = answer_shape(state, request)?;
    let plan = plan(state, request, shape.constraint, endpoint.prompt_field())?;
    let prompt_tokens = plan.prompt_ids.len();
    let head = ResponseHead::new(state, endpoint.id_prefix());
    let tools = shape.tool_calls.as_ref().map(|parsing| ToolCallStage::new(parsing, &head.id));
    let generation = Generation::start(state, &head.id, plan, admission)?;
    Ok(ChatStart { generation, head, tools, prompt_tokens })
}

/// Renders the prompt and decides everything the engine needs; a prompt too long for the
/// context is refused naming `prompt_field`.
fn plan(
    state: &AppState,
    request: &ChatCompletionRequest,
    constraint: Option<Constraint>,
    prompt_field: &str,
) -> Result<SequenceRequest, ApiError> {
    let tools: Vec<Value> = request.tools.iter().map(|t| json!(t)).collect();
    let rendered = render_prompt(state, &request.messages, &tools, &request.chat_template_kwargs)?;
    // The template writes BOS itself where the model wants one.
    let (prompt_ids, spans) =
        state.model.tokenizer.encode_with_spans(&rendered.text).map_err(failure)?;
    let snapshot_positions = token_positions(&rendered.message_ends, &spans);
    let max_tokens =
        fit_max_tokens(state, prompt_ids.len(), request.max_output_tokens(), prompt_field)?;

    let reasoning = rendered.reasoning;
    let reasoning_budget = match (&reasoning, &state.profile.reasoning) {
        (ReasoningMode::Tagged { .. }, Some(tags)) => Some(ReasoningBudget {
            max_tokens: request
                .thinking_budget
                .or(request.max_reasoning_tokens)
                .map(|n| n as usize)
                .or(state.config.thinking_budget),
            close_ids: tags.close_ids.clone(),
        }),
        _ => None,
    };
    if let Some(budget) = &reasoning_budget {
        check_room_to_answer(max_tokens, budget)?;
    }
    let logprobs = request.logprobs.then(|| request.top_logprobs.unwrap_or(0) as usize);
    Ok(SequenceRequest {
        snapshot_positions,
        reasoning,
        reasoning_budget,
        constraint,
        ..sequence_request(state, prompt_ids, max_tokens, &request.sampling, logprobs)
    })
}

/// With thinking on, the engine may have to close the reasoning block itself and then owes the
/// answer a token: `max_tokens` too small for both could only end in an empty answer.
fn check_room_to_answer(max_tokens: usize, budget: &ReasoningBudget) -> Result<(), ApiError> {
    let needed = budget.close_ids.len() + 1;
    if max_tokens >= needed {
        return Ok(());
    }
    Err(ApiError::bad_request(
        format!(
            "the output may have {max_tokens} tokens (max_tokens, or the room the prompt leaves \
             in the context), but with thinking on it needs at least {needed}: {} to close the \
             reasoning block and one to answer; raise max_tokens or turn thinking off",
            budget.close_ids.len()
        ),
        Some("max_tokens"),
    ))
}

/// The token positions of the byte offsets `ends` in a prompt whose tokens cover `spans`: the
/// count of tokens before each, where a token ends exactly there and none straddles it (an end
/// inside a token has no position).
fn token_positions(ends: &[usize], spans: &[(usize, usize)]) -> Vec<usize> {
    ends.iter()
        .filter_map(|&end| {
            let position = spans.partition_point(|&(_, token_end)| token_end <= end);
            let ends_here = position > 0 && spans[position - 1].1 == end;
            let straddled = spans.get(position).is_some_and(|&(start, _)| start < end);
            (ends_here && !straddled).then_some(position)
        })
        .collect()
}

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

pub(crate) fn render_prompt(
    state: &AppState,
    messages: &[ChatMessage],
    tools: &[Value],
    request_kwargs: &Map<String, Value>,
) -> Result<RenderedPrompt, ApiError> {
    let mut kwargs = state.config.chat_template_kwargs.clone();
    kwargs.extend(request_kwargs.clone());
    if !state.config.thinking_default {
        kwargs.entry("enable_thinking").or_insert(Value::Bool(false));
    }
    let enable_thinking = kwargs.get("enable_thinking");
    let reasoning = match &state.profile.reasoning {
        Some(tags) if enable_thinking != Some(&Value::Bool(false)) => ReasoningMode::Tagged {
            open: tags.open.clone(),
            close: tags.close.clone(),
            starts_inside: tags.starts_inside(enable_thinking),
        },
        _ => ReasoningMode::Off,
    };
    let messages: Vec<Value> = messages.iter().map(template_message).collect();
    let input = TemplateInput {
        messages: &messages,
        tools: (!tools.is_empty()).then_some(tools),
        add_generation_prompt: true,
        extra: &kwargs,
    };
    // A template refusing the messages (its `raise_exception`) is a 400; failing by itself, a 500.
    let text = state.model.template.render(&input).map_err(failure)?;
    let message_ends = state.profile.boundaries.as_ref().map_or_else(Vec::new, |b| b.find(&text));
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

#[cfg(test)]
mod tests {
    use super::token_positions;

    #[test]
    fn offsets_map_to_the_tokens_before_them_unless_inside_a_token() {
        // "ab|cd|e" as tokens "ab", "cd", "e"; a multi-byte character split in two tokens shares
        // its span ("é" at 5..7).
        let spans = [(0, 2), (2, 4), (4, 5), (5, 7), (5, 7)];
        assert_eq!(token_positions(&[2, 4, 5, 7], &spans), vec![1, 2, 3, 5]);
        // Inside "cd", inside the split character, and at the start: no position.
        assert_eq!(token_positions(&[3, 6, 0], &spans), Vec::<usize>::new());
    }
}
