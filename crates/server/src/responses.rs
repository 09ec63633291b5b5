//! `POST /v1/responses` (OpenAI's Responses API, as the Codex CLI uses it), and
//! `GET` / `DELETE /v1/responses/{id}` for stored responses. A request is read as a chat
//! request and runs through the same pipeline; its outputs become Responses items
//! (`responses_output`), streamed as typed events or returned whole.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::json;
use spindle_api::{
    ApiError, InputItem, Response as ResponseObject, ResponseDeleted, ResponseStatus,
    ResponsesRequest, TextOptions,
};

use crate::chat::{start_chat, ChatStart};
use crate::error::{internal, parse_json, HttpError};
use crate::generation::{Generation, Output};
use crate::request::ResponseHead;
use crate::responses_input::chat_request;
use crate::responses_output::{sse_event, Assembler};
use crate::state::AppState;

pub async fn create_response(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let request: ResponsesRequest = parse_json(&body?)?;
    request.validate()?;
    let mut conversation = match &request.previous_response_id {
        Some(id) => {
            state.responses.get(id).ok_or_else(|| previous_not_found(id))?.conversation.clone()
        }
        None => Vec::new(),
    };
    conversation.extend(request.input_items()?);
    let (chat, names) = chat_request(&request, &conversation)?;
    let ChatStart { generation, head, tools, .. } = start_chat(&state, &chat, "resp")?;
    let assembler = Assembler::new(in_progress(&request, head), tools, names);
    let keep = request.stores().then(|| Keep { state: state.clone(), conversation });
    if request.stream {
        Ok(Sse::new(event_stream(&state, generation, assembler, keep)).into_response())
    } else {
        Ok(Json(collect(generation, assembler, keep).await?).into_response())
    }
}

pub async fn retrieve_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ResponseObject>, HttpError> {
    let stored = state.responses.get(&id).ok_or_else(|| not_found(&id))?;
    Ok(Json(stored.response.clone()))
}

pub async fn delete_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ResponseDeleted>, HttpError> {
    if state.responses.remove(&id) {
        Ok(Json(ResponseDeleted { id, deleted: true }))
    } else {
        Err(not_found(&id).into())
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!(
        "no stored response `{id}` (responses are kept only with `store: true`)"
    ))
}

fn previous_not_found(id: &str) -> ApiError {
    ApiError {
        code: Some("previous_response_not_found".into()),
        param: Some("previous_response_id".into()),
        ..ApiError::not_found(format!(
            "previous response `{id}` is not stored here (expired, or sent with `store: false`)"
        ))
    }
}

/// The response before any output: the request's settings echoed, OpenAI's defaults where it
/// is silent.
fn in_progress(request: &ResponsesRequest, head: ResponseHead) -> ResponseObject {
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

/// Where a finished response is kept (`store` not false), with the conversation before it.
struct Keep {
    state: Arc<AppState>,
    conversation: Vec<InputItem>,
}

impl Keep {
    fn store(keep: Option<Self>, response: &ResponseObject) {
        if let Some(Keep { state, conversation }) =
            keep.filter(|_| response.status != ResponseStatus::Failed)
        {
            state.responses.insert(response.clone(), conversation);
        }
    }
}

/// The streamed response. A quiet stream (a long prompt being read) repeats
/// `response.in_progress`: Codex's idle timeout counts events, not SSE comments. Dropping the
/// stream (the client went away) drops the generation, which cancels it in the engine.
fn event_stream(
    state: &AppState,
    generation: Generation,
    mut assembler: Assembler,
    keep: Option<Keep>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let quiet = state.config.keep_alive;
    let opening = assembler.opening();
    let rest = stream::unfold(
        (generation, assembler, keep),
        move |(mut generation, mut assembler, mut keep)| async move {
            let events = match tokio::time::timeout(quiet, generation.next()).await {
                Ok(output) => assembler.push(output?),
                Err(_) => assembler.in_progress(),
            };
            if let Some(response) = assembler.finished() {
                Keep::store(keep.take(), response);
            }
            Some((events, (generation, assembler, keep)))
        },
    );
    stream::iter(opening).chain(rest.flat_map(stream::iter)).map(|event| Ok(sse_event(&event)))
}

/// The whole response: the same events, run to the end and only the result kept.
async fn collect(
    mut generation: Generation,
    mut assembler: Assembler,
    keep: Option<Keep>,
) -> Result<ResponseObject, ApiError> {
    while let Some(output) = generation.next().await {
        if let Output::Failed(error) = output {
            return Err(error);
        }
        assembler.push(output);
    }
    let response = assembler
        .finished()
        .ok_or_else(|| internal("the engine ended the request without a result"))?;
    Keep::store(keep, response);
    Ok(response.clone())
}
