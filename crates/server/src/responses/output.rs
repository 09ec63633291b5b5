//! A generation's outputs read as Responses events: reasoning, text and tool calls become
//! output items, each opened, filled by deltas and closed before the next one starts. The
//! streamed response sends these events; the whole response is what the same machine holds at
//! the end, so both always carry the same items. It starts from the [`empty_response`] that
//! echoes the request's settings.

use serde_json::json;
use spindle_api::{
    ApiError, IncompleteDetails, ItemStatus, OutputItem, OutputPart, ReasoningPart,
    Response as ResponseObject, ResponseError, ResponseEvent, ResponseStatus, ResponseUsage,
    ResponsesRequest, Role, StreamEvent, TextOptions, ToolCallDelta,
};
use spindle_runner::{FinishReason, SequenceSummary, TextDelta};

use crate::answer_parts::{staged, staged_tail, ResponseHead};
use crate::pipeline::generation::Output;
use crate::pipeline::tool_calls::ToolCallStage;
use crate::responses::input::ToolNames;

/// The output item being filled.
enum Open {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
    Call { id: String, call_id: String, name: String, namespace: Option<String>, arguments: String },
}

pub struct Assembler {
    /// The response so far: finished items in `output`; status and usage set at the end.
    response: ResponseObject,
    /// Ids of items are `<kind>_<this>_<output index>`.
    id_suffix: String,
    next_sequence: u64,
    tools: Option<ToolCallStage>,
    names: ToolNames,
    open: Option<Open>,
    /// Whitespace before any text: a message is opened only for text that says something
    /// (models put a newline before a tool call).
    held_space: String,
    finished: bool,
}

impl Assembler {
    pub fn new(response: ResponseObject, tools: Option<ToolCallStage>, names: ToolNames) -> Self {
        let id_suffix = response.id.trim_start_matches("resp_").to_string();
        Self {
            response,
            id_suffix,
            next_sequence: 0,
            tools,
            names,
            open: None,
            held_space: String::new(),
            finished: false,
        }
    }

    /// `response.created` and `response.in_progress`.
    pub fn opening(&mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        self.emit(&mut events, ResponseEvent::Created { response: self.response.clone() });
        events.extend(self.in_progress());
        events
    }

    /// `response.in_progress` with the items finished so far: also what a quiet stream repeats.
    pub fn in_progress(&mut self) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        self.emit(&mut events, ResponseEvent::InProgress { response: self.response.clone() });
        events
    }

    /// The response once the last output has been pushed.
    pub fn finished(&self) -> Option<&ResponseObject> {
        self.finished.then_some(&self.response)
    }

    /// The events one output of the generation makes.
    pub fn push(&mut self, output: Output) -> Vec<StreamEvent> {
        let mut events = Vec::new();
        match output {
            Output::Text { delta, .. } => {
                let (text, calls) = staged(&mut self.tools, delta);
                self.advance(&mut events, text, calls);
            }
            Output::Done(summary) => self.finish(&mut events, summary),
            Output::Progress(_) => {}
            Output::Failed(error) => self.fail(&mut events, error),
        }
        events
    }

    fn emit(&mut self, events: &mut Vec<StreamEvent>, event: ResponseEvent) {
        events.push(StreamEvent { sequence_number: self.next_sequence, event });
        self.next_sequence += 1;
    }

    fn output_index(&self) -> usize {
        self.response.output.len()
    }

    fn advance(
        &mut self,
        events: &mut Vec<StreamEvent>,
        text: TextDelta,
        calls: Vec<ToolCallDelta>,
    ) {
        if !text.reasoning.is_empty() {
            self.reasoning(events, &text.reasoning);
        }
        if !text.content.is_empty() {
            self.content(events, &text.content);
        }
        for call in calls {
            self.call(events, call);
        }
    }

    fn reasoning(&mut self, events: &mut Vec<StreamEvent>, delta: &str) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close(events, ItemStatus::Completed);
            let id = format!("rs_{}_{}", self.id_suffix, self.output_index());
            let item = OutputItem::Reasoning {
                id: id.clone(),
                summary: vec![],
                content: vec![],
                status: ItemStatus::InProgress,
            };
            self.emit(
                events,
                ResponseEvent::OutputItemAdded { output_index: self.output_index(), item },
            );
            self.open = Some(Open::Reasoning { id, text: String::new() });
        }
        let Some(Open::Reasoning { id, text }) = &mut self.open else {
            unreachable!("opened above")
        };
        text.push_str(delta);
        let item_id = id.clone();
        let event = ResponseEvent::ReasoningTextDelta {
            item_id,
            output_index: self.output_index(),
            content_index: 0,
            delta: delta.into(),
        };
        self.emit(events, event);
    }

    fn content(&mut self, events: &mut Vec<StreamEvent>, delta: &str) {
        let delta = if matches!(self.open, Some(Open::Message { .. })) {
            delta.to_string()
        } else {
            self.held_space.push_str(delta);
            if self.held_space.trim().is_empty() {
                return;
            }
            self.close(events, ItemStatus::Completed);
            let id = format!("msg_{}_{}", self.id_suffix, self.output_index());
            let output_index = self.output_index();
            let item = OutputItem::Message {
                id: id.clone(),
                role: Role::Assistant,
                status: ItemStatus::InProgress,
                content: vec![],
            };
            self.emit(events, ResponseEvent::OutputItemAdded { output_index, item });
            let part = text_part(String::new());
            self.emit(
                events,
                ResponseEvent::ContentPartAdded {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    part,
                },
            );
            self.open = Some(Open::Message { id, text: String::new() });
            std::mem::take(&mut self.held_space)
        };
        let Some(Open::Message { id, text }) = &mut self.open else { unreachable!("opened above") };
        text.push_str(&delta);
        let item_id = id.clone();
        let output_index = self.output_index();
        self.emit(
            events,
            ResponseEvent::OutputTextDelta {
                item_id,
                output_index,
                content_index: 0,
                delta,
                logprobs: vec![],
            },
        );
    }

    /// A call starts with its id and name; later pieces add to its arguments.
    fn call(&mut self, events: &mut Vec<StreamEvent>, delta: ToolCallDelta) {
        if let Some(call_id) = delta.id {
            self.close(events, ItemStatus::Completed);
            self.held_space.clear();
            let (name, namespace) = self.names.split(&delta.function.name.unwrap_or_default());
            let id = format!("fc_{}_{}", self.id_suffix, self.output_index());
            let item = OutputItem::FunctionCall {
                id: id.clone(),
                call_id: call_id.clone(),
                name: name.clone(),
                namespace: namespace.clone(),
                arguments: String::new(),
                status: ItemStatus::InProgress,
            };
            self.emit(
                events,
                ResponseEvent::OutputItemAdded { output_index: self.output_index(), item },
            );
            self.open = Some(Open::Call { id, call_id, name, namespace, arguments: String::new() });
        }
        let fragment = delta.function.arguments;
        let Some(Open::Call { id, arguments, .. }) = &mut self.open else { return };
        if fragment.is_empty() {
            return;
        }
        arguments.push_str(&fragment);
        let item_id = id.clone();
        let output_index = self.output_index();
        self.emit(
            events,
            ResponseEvent::FunctionCallArgumentsDelta { item_id, output_index, delta: fragment },
        );
    }

    /// Closes the open item, if any: its done events, then it joins the output.
    fn close(&mut self, events: &mut Vec<StreamEvent>, status: ItemStatus) {
        let Some(open) = self.open.take() else { return };
        let output_index = self.output_index();
        let item = match open {
            Open::Reasoning { id, text } => {
                let done = ResponseEvent::ReasoningTextDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    text: text.clone(),
                };
                self.emit(events, done);
                OutputItem::Reasoning {
                    id,
                    summary: vec![],
                    content: vec![ReasoningPart::ReasoningText { text }],
                    status,
                }
            }
            Open::Message { id, text } => {
                let done = ResponseEvent::OutputTextDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    text: text.clone(),
                    logprobs: vec![],
                };
                self.emit(events, done);
                let part = text_part(text);
                let done = ResponseEvent::ContentPartDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    part: part.clone(),
                };
                self.emit(events, done);
                OutputItem::Message { id, role: Role::Assistant, status, content: vec![part] }
            }
            Open::Call { id, call_id, name, namespace, arguments } => {
                let done = ResponseEvent::FunctionCallArgumentsDone {
                    item_id: id.clone(),
                    output_index,
                    arguments: arguments.clone(),
                };
                self.emit(events, done);
                OutputItem::FunctionCall { id, call_id, name, namespace, arguments, status }
            }
        };
        self.emit(events, ResponseEvent::OutputItemDone { output_index, item: item.clone() });
        self.response.output.push(item);
    }

    fn finish(&mut self, events: &mut Vec<StreamEvent>, mut summary: SequenceSummary) {
        let (tail, calls) = staged_tail(&mut self.tools, std::mem::take(&mut summary.tail));
        self.advance(events, tail, calls);
        let cut = summary.finish_reason == FinishReason::Length;
        self.close(events, if cut { ItemStatus::Incomplete } else { ItemStatus::Completed });
        let response = &mut self.response;
        response.usage = Some(ResponseUsage {
            input_tokens: summary.prompt_tokens as u32,
            input_tokens_details: spindle_api::InputTokensDetails {
                cached_tokens: summary.cached_tokens as u32,
            },
            output_tokens: summary.completion_tokens as u32,
            output_tokens_details: spindle_api::OutputTokensDetails {
                reasoning_tokens: summary.reasoning_tokens as u32,
            },
            total_tokens: (summary.prompt_tokens + summary.completion_tokens) as u32,
        });
        let event = if cut {
            response.status = ResponseStatus::Incomplete;
            response.incomplete_details =
                Some(IncompleteDetails { reason: "max_output_tokens".into() });
            ResponseEvent::Incomplete { response: response.clone() }
        } else {
            response.status = ResponseStatus::Completed;
            ResponseEvent::Completed { response: response.clone() }
        };
        self.emit(events, event);
        self.finished = true;
    }

    fn fail(&mut self, events: &mut Vec<StreamEvent>, error: ApiError) {
        self.close(events, ItemStatus::Incomplete);
        self.response.status = ResponseStatus::Failed;
        let code = error.code.clone().unwrap_or_else(|| "server_error".into());
        self.response.error = Some(ResponseError { code, message: error.message });
        let event = ResponseEvent::Failed { response: self.response.clone() };
        self.emit(events, event);
        self.finished = true;
    }
}

/// The response before any output, which the [`Assembler`] starts from: the request's settings echoed, OpenAI's defaults where it
/// is silent.
pub fn empty_response(request: &ResponsesRequest, head: ResponseHead) -> ResponseObject {
    let suffix = head.id.rsplit('-').next().unwrap_or(&head.id);
    ResponseObject {
        id: format!("resp_{suffix}"),
        created_at: head.created,
        status: ResponseStatus::InProgress,
        error: None,
        incomplete_details: None,
        instructions: request.instructions.clone(),
        max_output_tokens: request.max_output_tokens,
        model: head.model,
        output: Vec::new(),
        parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
        previous_response_id: request.previous_response_id.clone(),
        reasoning: request.reasoning.clone().unwrap_or_default(),
        store: request.stores(),
        temperature: Some(request.sampling.temperature.unwrap_or(1.0)),
        text: request
            .text
            .clone()
            .unwrap_or(TextOptions { format: Some(json!({"type": "text"})), verbosity: None }),
        tool_choice: request.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        tools: request.tools.clone(),
        top_p: Some(request.sampling.top_p.unwrap_or(1.0)),
        truncation: "disabled".into(),
        usage: None,
        user: request.user.clone(),
        metadata: request.metadata.clone(),
    }
}

fn text_part(text: String) -> OutputPart {
    OutputPart::OutputText { text, annotations: vec![] }
}

/// The SSE frame of `event`: `event: <type>` and the JSON, which carries the type too.
pub fn sse_event(event: &StreamEvent) -> axum::response::sse::Event {
    let value = json!(event);
    let kind = value["type"].as_str().unwrap_or_default().to_string();
    axum::response::sse::Event::default().event(kind).data(value.to_string())
}
