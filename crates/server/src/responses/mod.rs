//! `POST /v1/responses` (OpenAI's Responses API, as the Codex CLI uses it), and
//! `GET` / `DELETE /v1/responses/{id}` for stored responses. A request is read as a generation
//! request ([`input`]) and runs through the pipeline; its outputs become Responses
//! items ([`output`]), streamed as typed events or returned whole.

pub(crate) mod input;
pub(crate) mod output;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::sse::Event;
use axum::response::Response;
use axum::Json;
use spindle_api::{
    ApiError, InputItem, Response as ResponseObject, ResponseDeleted, ResponseEvent,
    ResponseStatus, ResponsesRequest, StreamEvent,
};

use crate::admission::Admission;
use crate::answer_parts::ResponseHead;
use crate::error::{internal, parse_json, HttpError};
use crate::pipeline::generation::{Collected, Output};
use crate::pipeline::respond::{respond_on_model, Answer, Delivery, ModelChoice, Protocol};
use crate::pipeline::{start_on, Started};
use crate::responses::input::generation_request;
use crate::responses::output::{empty_response, sse_event, Assembler};
use crate::sse::keep_alive_comment;
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
    let (generation_request, names) = generation_request(&request, &conversation)?;
    generation_request.validate()?;
    let model_name = request.model.clone();
    let choice = ModelChoice { name: model_name.as_deref(), ttl_seconds: request.ttl };
    let delivery = Delivery::of(request.stream);
    let started = state.clone();
    let answer: Answer<ResponsesAnswer> = Box::new(move |model| {
        let id = ResponseHead::fresh_id("resp");
        let Started { generation, tools, .. } =
            start_on(&started, model, &generation_request, &id, Admission::Live)?;
        let response = empty_response(&request, ResponseHead::new(id, generation.model_name()));
        let assembler = Assembler::new(response, tools, names);
        let keep = request.stores().then(|| Keep { state: started.clone(), conversation });
        Ok((generation, ResponsesAnswer { assembler, keep }))
    });
    Ok(respond_on_model(&state, choice, delivery, answer).await?)
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

/// Where a finished response is kept (`store` not false), with the conversation before it.
struct Keep {
    state: Arc<AppState>,
    conversation: Vec<InputItem>,
}

/// The Responses answer: the assembler's events streamed, or the response it holds at the end;
/// kept when finished (not failed) and asked to.
struct ResponsesAnswer {
    assembler: Assembler,
    keep: Option<Keep>,
}

impl ResponsesAnswer {
    fn store_when_finished(&mut self) {
        let Some(response) = self.assembler.finished() else { return };
        if let Some(Keep { state, conversation }) =
            self.keep.take().filter(|_| response.status != ResponseStatus::Failed)
        {
            state.responses.insert(response.clone(), conversation);
        }
    }
}

impl Protocol for ResponsesAnswer {
    type Whole = ResponseObject;

    fn opening(&mut self) -> Vec<Event> {
        self.assembler.opening().iter().map(sse_event).collect()
    }

    fn events(&mut self, output: Output) -> Vec<Event> {
        let events = self.assembler.push(output);
        self.store_when_finished();
        events.iter().map(sse_event).collect()
    }

    /// `response.in_progress` again: Codex's idle timeout counts events, not SSE comments.
    fn keep_alive(&mut self) -> Vec<Event> {
        self.assembler.in_progress().iter().map(sse_event).collect()
    }

    /// A comment: the response is created once its model is loaded, and Codex's idle timeout
    /// (300 seconds by default) outlasts most loads.
    fn loading_keep_alive() -> Vec<Event> {
        vec![keep_alive_comment()]
    }

    /// OpenAI's `error` event, the one a stream sends before its response is created.
    fn failure_before_opening(error: &ApiError) -> Vec<Event> {
        let code = error.code.clone().unwrap_or_else(|| "server_error".into());
        let event = ResponseEvent::Error {
            code,
            message: error.message.clone(),
            param: error.param.clone(),
        };
        vec![sse_event(&StreamEvent { sequence_number: 0, event })]
    }

    fn whole(mut self, collected: Collected) -> Result<ResponseObject, ApiError> {
        for output in collected.outputs() {
            self.assembler.push(output);
        }
        self.store_when_finished();
        self.assembler
            .finished()
            .cloned()
            .ok_or_else(|| internal("the engine ended the request without a result"))
    }
}
