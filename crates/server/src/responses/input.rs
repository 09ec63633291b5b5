//! A Responses request read as the pipeline's generation request: `instructions` and input
//! items become chat messages, flat and namespaced function tools become chat tools,
//! `reasoning.effort` a thinking switch and budget, `text.format` the answer's format.

use std::collections::HashMap;

use serde_json::Value;
use spindle_api::{
    ApiError, ChatMessage, FunctionCall, FunctionDefinition, InputItem, MessageContent,
    ResponsesRequest, Tool, ToolCall, ToolType,
};

use crate::pipeline::request::{AnswerFormat, Conversation, GenerationRequest, Prompt, ToolChoice};

/// What the model sees as one flat function name, and the namespace tool it came from.
#[derive(Default)]
pub struct ToolNames {
    /// Combined name → (namespace, the member function's name).
    namespaced: HashMap<String, (String, String)>,
}

impl ToolNames {
    /// The `(name, namespace)` a call of `model_name` is reported under.
    pub fn split(&self, model_name: &str) -> (String, Option<String>) {
        match self.namespaced.get(model_name) {
            Some((namespace, name)) => (name.clone(), Some(namespace.clone())),
            None => (model_name.to_string(), None),
        }
    }
}

/// The name the model sees for `name` inside namespace `namespace`, joined as Codex flattens
/// its own namespaced tools (`mcp__server__` + `tool` → `mcp__server__tool`).
fn combined_name(namespace: &str, name: &str) -> String {
    format!("{}__{}", namespace.trim_end_matches('_'), name.trim_start_matches('_'))
}

/// The generation request for `request`, whose conversation is `items` (a stored
/// conversation, if continued, then the request's own input).
pub fn generation_request(
    request: &ResponsesRequest,
    items: &[InputItem],
) -> Result<(GenerationRequest, ToolNames), ApiError> {
    let (tools, names) = chat_tools(&request.tools)?;
    let mut template_kwargs = request.chat_template_kwargs.clone();
    let mut thinking_budget = None;
    if let Some(effort) = request.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
        match reasoning_budget(effort, request.max_output_tokens)? {
            Thinking::Off => {
                template_kwargs.insert("enable_thinking".into(), Value::Bool(false));
            }
            Thinking::On(budget) => thinking_budget = budget,
        }
    }
    let conversation = Conversation {
        messages: chat_messages(request.instructions.as_deref(), items)?,
        tools,
        tool_choice: tool_choice(request.tool_choice.as_ref())?,
        parallel_tool_calls: request.parallel_tool_calls != Some(false),
        format: answer_format(request)?,
        template_kwargs,
        thinking_budget,
    };
    let generation = GenerationRequest {
        model: request.model.clone(),
        prompt: Prompt::Chat(Box::new(conversation)),
        sampling: request.sampling.clone(),
        max_tokens: request.max_output_tokens,
        logprobs: None,
        prompt_field: "input",
        endpoint: "/v1/responses",
        ttl: request.ttl,
    };
    Ok((generation, names))
}

/// Function tools as chat tools; each member of a namespace under its combined name. Tools of
/// every other type are OpenAI's hosted tools (or Codex's freeform ones) and are skipped.
fn chat_tools(tools: &[Value]) -> Result<(Vec<Tool>, ToolNames), ApiError> {
    let mut chat = Vec::new();
    let mut names = ToolNames::default();
    for (i, tool) in tools.iter().enumerate() {
        match tool["type"].as_str() {
            Some("function") => chat.push(function_tool(tool, None, &format!("tools[{i}]"))?),
            Some("namespace") => {
                let namespace = tool["name"].as_str().ok_or_else(|| {
                    ApiError::bad_request(
                        format!("tools[{i}].name is missing"),
                        Some(format!("tools[{i}].name").as_str()),
                    )
                })?;
                let members = tool["tools"].as_array().map(Vec::as_slice).unwrap_or_default();
                for (j, member) in
                    members.iter().enumerate().filter(|(_, m)| m["type"] == "function")
                {
                    let function =
                        function_tool(member, Some(namespace), &format!("tools[{i}].tools[{j}]"))?;
                    let member_name = member["name"].as_str().unwrap_or_default().to_string();
                    names.namespaced.insert(
                        function.function.name.clone(),
                        (namespace.to_string(), member_name),
                    );
                    chat.push(function);
                }
            }
            _ => {}
        }
    }
    Ok((chat, names))
}

/// A flat `{type: "function", name, description, parameters, strict}` tool as a chat tool.
fn function_tool(tool: &Value, namespace: Option<&str>, param: &str) -> Result<Tool, ApiError> {
    let name = tool["name"].as_str().filter(|n| !n.is_empty()).ok_or_else(|| {
        ApiError::bad_request(
            format!("{param}.name is missing"),
            Some(format!("{param}.name").as_str()),
        )
    })?;
    let optional = |key: &str| tool.get(key).filter(|v| !v.is_null()).cloned();
    Ok(Tool {
        kind: ToolType::Function,
        function: FunctionDefinition {
            name: namespace.map_or_else(|| name.to_string(), |ns| combined_name(ns, name)),
            description: optional("description").and_then(|d| d.as_str().map(str::to_string)),
            parameters: optional("parameters"),
            strict: optional("strict").and_then(|s| s.as_bool()),
        },
    })
}

/// `tool_choice`: a mode by name, or a named function (a namespace folded into the name as
/// the model sees it).
fn tool_choice(choice: Option<&Value>) -> Result<Option<ToolChoice>, ApiError> {
    let Some(choice) = choice.filter(|c| !c.is_null()) else { return Ok(None) };
    if let Some(mode) = choice.as_str() {
        return ToolChoice::from_mode(mode).map(Some);
    }
    match (choice["type"].as_str(), choice["name"].as_str()) {
        (Some("function"), Some(name)) => {
            let name = choice["namespace"].as_str().map_or_else(|| name.to_string(), |ns| combined_name(ns, name));
            Ok(Some(ToolChoice::Named(name)))
        }
        (Some("function"), None) => Err(ApiError::bad_request("tool_choice.name is missing", Some("tool_choice.name"))),
        _ => Err(ApiError::bad_request(
            format!("tool_choice {choice} is not supported; expected none, auto, required or {{\"type\": \"function\", \"name\": ...}}"),
            Some("tool_choice"),
        )),
    }
}

/// `reasoning.effort`, resolved.
enum Thinking {
    Off,
    /// Thinking on, with at most this many reasoning tokens (`None`: the server's budget).
    On(Option<u32>),
}

/// `none` and `minimal` turn thinking off. `low`, `medium` and `high` leave 1/4, 1/2 and 3/4
/// of `max_output_tokens` to reasoning (1024, 4096 and 16384 tokens without a limit); `xhigh`
/// only the server's budget (the answer always keeps a quarter of the output).
fn reasoning_budget(effort: &str, max_output_tokens: Option<u32>) -> Result<Thinking, ApiError> {
    let share = |quarters: u32, default: u32| {
        Thinking::On(Some(max_output_tokens.map_or(default, |n| (n * quarters / 4).max(1))))
    };
    Ok(match effort {
        "none" | "minimal" => Thinking::Off,
        "low" => share(1, 1024),
        "medium" => share(2, 4096),
        "high" => share(3, 16384),
        "xhigh" => Thinking::On(None),
        other => {
            return Err(ApiError::bad_request(
                format!("unknown reasoning.effort `{other}`; expected none, minimal, low, medium, high or xhigh"),
                Some("reasoning.effort"),
            ))
        }
    })
}

/// `text.format`, the answer's format.
fn answer_format(request: &ResponsesRequest) -> Result<Option<AnswerFormat>, ApiError> {
    let Some(format) =
        request.text.as_ref().and_then(|t| t.format.as_ref()).filter(|f| !f.is_null())
    else {
        return Ok(None);
    };
    let bad = |message: String, param: &str| ApiError::bad_request(message, Some(param));
    match format["type"].as_str() {
        Some("text") => Ok(Some(AnswerFormat::Text)),
        Some("json_object") => Ok(Some(AnswerFormat::JsonObject)),
        Some("json_schema") => match &format["schema"] {
            schema @ Value::Object(_) => Ok(Some(AnswerFormat::JsonSchema(schema.clone()))),
            _ => Err(bad(
                "text.format json_schema needs a `schema` object".into(),
                "text.format.schema",
            )),
        },
        Some(other) => Err(bad(
            format!(
                "unknown text.format type `{other}`; expected text, json_object or json_schema"
            ),
            "text.format.type",
        )),
        None => Err(bad("text.format needs a type".into(), "text.format.type")),
    }
}

/// The conversation as chat messages: `instructions` and every system / developer message as
/// one leading system message (rendered in place, a second system message breaks templates,
/// Qwen's among them); consecutive function calls, and the reasoning and text before them, as
/// one assistant message.
fn chat_messages(
    instructions: Option<&str>,
    items: &[InputItem],
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut system: Vec<&str> = instructions.into_iter().collect();
    let mut messages = Vec::new();
    // Reasoning waits for the assistant message of the same turn.
    let mut reasoning: Option<String> = None;
    for item in items {
        match item {
            InputItem::Reasoning { text } => reasoning = Some(text.clone()),
            InputItem::Message { role, content } if role == "system" || role == "developer" => {
                system.push(content)
            }
            InputItem::Message { role, content } if role == "assistant" => {
                let mut m = message("assistant", content.clone());
                m.reasoning_content = reasoning.take();
                messages.push(m);
            }
            InputItem::Message { role, content } => {
                reasoning = None;
                messages.push(message(role, content.clone()));
            }
            InputItem::FunctionCall { call_id, name, namespace, arguments } => {
                let call = ToolCall {
                    id: call_id.clone(),
                    kind: ToolType::Function,
                    function: FunctionCall {
                        name: namespace
                            .as_deref()
                            .map_or_else(|| name.clone(), |ns| combined_name(ns, name)),
                        arguments: arguments.clone(),
                    },
                };
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" && reasoning.is_none() => {
                        last.tool_calls.push(call)
                    }
                    _ => {
                        let mut m = message("assistant", String::new());
                        m.content = None;
                        m.reasoning_content = reasoning.take();
                        m.tool_calls.push(call);
                        messages.push(m);
                    }
                }
            }
            InputItem::FunctionCallOutput { call_id, output } => {
                reasoning = None;
                let mut m = message("tool", output.clone());
                m.tool_call_id = Some(call_id.clone());
                messages.push(m);
            }
        }
    }
    if !system.is_empty() {
        messages.insert(0, message("system", system.join("\n\n")));
    }
    if messages.is_empty() {
        return Err(ApiError::bad_request("input must not be empty", Some("input")));
    }
    Ok(messages)
}

fn message(role: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: role.to_string(),
        content: Some(MessageContent::Text(content)),
        name: None,
        tool_calls: Vec::new(),
        tool_call_id: None,
        reasoning_content: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The conversation a request's body becomes, and its tool names.
    fn read(body: Value) -> (Conversation, ToolNames) {
        let request: ResponsesRequest = serde_json::from_value(body).unwrap();
        let (generation, names) =
            generation_request(&request, &request.input_items().unwrap()).unwrap();
        match generation.prompt {
            Prompt::Chat(conversation) => (*conversation, names),
            Prompt::Tokens(_) => unreachable!("a Responses request is a conversation"),
        }
    }

    /// Each message as (role, content, reasoning, tool call names, tool_call_id).
    fn shape(chat: &Conversation) -> Vec<Value> {
        chat.messages
            .iter()
            .map(|m| {
                let calls: Vec<&str> =
                    m.tool_calls.iter().map(|c| c.function.name.as_str()).collect();
                json!([
                    m.role,
                    m.content.as_ref().map(|c| c.text().into_owned()),
                    m.reasoning_content,
                    calls,
                    m.tool_call_id
                ])
            })
            .collect()
    }

    #[test]
    fn a_turn_of_reasoning_text_and_calls_is_one_assistant_message() {
        let (chat, _) = read(json!({
            "instructions": "Be useful.",
            "input": [
                {"role": "developer", "content": "Sandbox: read-only."},
                {"role": "user", "content": "Look around."},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "ls first"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "read", "namespace": "mcp__fs__", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"type": "function_call_output", "call_id": "c2", "output": "hello"},
                {"type": "function_call", "call_id": "c3", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c3", "output": "done"},
                {"role": "developer", "content": "Later note."},
            ],
        }));
        assert_eq!(
            shape(&chat),
            vec![
                json!([
                    "system",
                    "Be useful.\n\nSandbox: read-only.\n\nLater note.",
                    null,
                    [],
                    null
                ]),
                json!(["user", "Look around.", null, [], null]),
                json!(["assistant", "Listing.", "ls first", ["shell", "mcp__fs__read"], null]),
                json!(["tool", "a.txt", null, [], "c1"]),
                json!(["tool", "hello", null, [], "c2"]),
                json!(["assistant", null, null, ["shell"], null]),
                json!(["tool", "done", null, [], "c3"]),
            ]
        );
    }

    #[test]
    fn namespace_members_are_offered_under_combined_names_and_split_back() {
        let (chat, names) = read(json!({
            "input": "hi",
            "tools": [
                {"type": "function", "name": "shell", "parameters": {"type": "object"}},
                {"type": "namespace", "name": "mcp__fs__", "description": "Files", "tools": [
                    {"type": "function", "name": "read", "description": "Read a file", "strict": true},
                    {"type": "custom", "name": "patch"},
                ]},
                {"type": "web_search"},
                {"type": "custom", "name": "apply_patch"},
            ],
            "tool_choice": {"type": "function", "name": "read", "namespace": "mcp__fs__"},
        }));
        let offered: Vec<(&str, Option<bool>)> =
            chat.tools.iter().map(|t| (t.function.name.as_str(), t.function.strict)).collect();
        assert_eq!(offered, vec![("shell", None), ("mcp__fs__read", Some(true))]);
        assert_eq!(chat.tool_choice, Some(ToolChoice::Named("mcp__fs__read".into())));
        assert_eq!(
            names.split("mcp__fs__read"),
            ("read".to_string(), Some("mcp__fs__".to_string()))
        );
        assert_eq!(names.split("shell"), ("shell".to_string(), None));
    }

    #[test]
    fn reasoning_effort_sets_thinking_and_its_budget() {
        let effort = |effort: &str, max: Option<u32>| {
            let (chat, _) = read(
                json!({"input": "hi", "reasoning": {"effort": effort}, "max_output_tokens": max}),
            );
            (chat.template_kwargs.get("enable_thinking").cloned(), chat.thinking_budget)
        };
        assert_eq!(effort("none", Some(100)), (Some(json!(false)), None));
        assert_eq!(effort("minimal", None), (Some(json!(false)), None));
        assert_eq!(effort("low", Some(100)), (None, Some(25)));
        assert_eq!(effort("medium", Some(100)), (None, Some(50)));
        assert_eq!(effort("high", Some(100)), (None, Some(75)));
        assert_eq!(effort("medium", None), (None, Some(4096)));
        assert_eq!(effort("xhigh", Some(100)), (None, None));
    }

    #[test]
    fn text_format_becomes_the_answer_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let (chat, _) = read(
            json!({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": true}}}),
        );
        assert_eq!(chat.format, Some(AnswerFormat::JsonSchema(schema)));
        let (chat, _) = read(json!({"input": "hi", "text": {"format": {"type": "json_object"}}}));
        assert_eq!(chat.format, Some(AnswerFormat::JsonObject));
    }
}
