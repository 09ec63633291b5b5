//! A Chat Completions request (live, or a line of a batch) as the pipeline's generation request:
//! its messages and tools as they are, `tool_choice` and `response_format` read into their
//! resolved forms, the output limit and the thinking budget under whichever name was sent.

use serde_json::Value;
use spindle_api::{ApiError, ChatCompletionRequest};

use crate::pipeline::request::{AnswerFormat, Conversation, GenerationRequest, Prompt, ToolChoice};

/// `request`, already validated, for the pipeline; a malformed `tool_choice` or
/// `response_format` is a 400 naming it.
pub(crate) fn generation_request(
    request: &ChatCompletionRequest,
) -> Result<GenerationRequest, ApiError> {
    let conversation = Conversation {
        messages: request.messages.clone(),
        tools: request.tools.clone(),
        tool_choice: tool_choice(request.tool_choice.as_ref())?,
        parallel_tool_calls: request.parallel_tool_calls != Some(false),
        format: response_format(request.response_format.as_ref())?,
        template_kwargs: request.chat_template_kwargs.clone(),
        thinking_budget: request.thinking_budget.or(request.max_reasoning_tokens),
    };
    Ok(GenerationRequest {
        model: request.model.clone(),
        prompt: Prompt::Chat(Box::new(conversation)),
        sampling: request.sampling.clone(),
        max_tokens: request.max_output_tokens(),
        logprobs: request.logprobs.then(|| request.top_logprobs.unwrap_or(0) as usize),
        prompt_field: "messages",
        endpoint: "/v1/chat/completions",
        ttl: request.ttl,
    })
}

/// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": ...}}`;
/// `null` or absent is the default.
fn tool_choice(choice: Option<&Value>) -> Result<Option<ToolChoice>, ApiError> {
    match choice {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(mode)) => ToolChoice::from_mode(mode).map(Some),
        Some(value) => match value["function"]["name"].as_str() {
            Some(name) if value["type"] == "function" => Ok(Some(ToolChoice::Named(name.to_string()))),
            _ => Err(ApiError::bad_request("tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}", Some("tool_choice"))),
        },
    }
}

/// `{"type": "text" | "json_object" | "json_schema", ...}`; `null` or absent names no format.
fn response_format(format: Option<&Value>) -> Result<Option<AnswerFormat>, ApiError> {
    let bad = |message: &str| ApiError::bad_request(message.to_string(), Some("response_format"));
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    match format["type"].as_str() {
        Some("text") => Ok(Some(AnswerFormat::Text)),
        Some("json_object") => Ok(Some(AnswerFormat::JsonObject)),
        Some("json_schema") => match &format["json_schema"]["schema"] {
            schema @ Value::Object(_) => Ok(Some(AnswerFormat::JsonSchema(schema.clone()))),
            Value::Null => Err(bad("response_format json_schema needs json_schema.schema")),
            _ => Err(bad("response_format json_schema.schema must be an object")),
        },
        Some(other) => Err(bad(&format!(
            "unknown response_format type `{other}`; expected text, json_object or json_schema"
        ))),
        None => Err(bad("response_format needs a type")),
    }
}
