//! Anthropic's Messages API over the pipeline: `POST /v1/messages` (whole or streamed) and
//! `POST /v1/messages/count_tokens`. The request is read as a generation request
//! ([`generation_request`]), generated like any other, and answered as Anthropic events
//! ([`MessageEvents`]); errors leave in Anthropic's shape with the status OpenAI's would have.

pub(crate) mod events;
pub(crate) mod request;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use spindle_api::anthropic::{ErrorResponse, Message, MessagesRequest, StreamEvent, TokenCount};
use spindle_api::ApiError;

use crate::admission::Admission;
use crate::answer_parts::ResponseHead;
use crate::error::{error_response, parse_json, HttpError};
use crate::messages::events::{assemble, MessageEvents};
use crate::messages::request::generation_request;
use crate::pipeline::generation::{Collected, Output};
use crate::pipeline::respond::{respond_on_model, Answer, Delivery, ModelChoice, Protocol};
use crate::pipeline::{prompt_token_ids, start_on, Started};
use crate::state::AppState;

/// The path prefix whose errors take Anthropic's shape.
const MESSAGES_PATH: &str = "/v1/messages";

pub async fn messages(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, MessagesError> {
    let request: MessagesRequest = parse_json(&body?)?;
    request.validate()?;
    let generation_request = generation_request(&request)?;
    generation_request.validate()?;
    let choice = ModelChoice { name: request.model.as_deref(), ttl_seconds: request.ttl };
    let started = state.clone();
    let answer: Answer<MessagesAnswer> = Box::new(move |model| {
        let id = ResponseHead::fresh_id("msg");
        let Started { generation, tools, prompt_tokens } =
            start_on(&started, model, &generation_request, &id, Admission::Live)?;
        let head = ResponseHead::new(id, generation.model_name());
        let answer = MessagesAnswer { events: MessageEvents::new(head, tools), prompt_tokens };
        Ok((generation, answer))
    });
    Ok(respond_on_model(&state, choice, Delivery::of(request.stream), answer).await?)
}

/// The prompt's tokens, rendered and tokenized as `/v1/messages` would, without generating.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenCount>, MessagesError> {
    let request: MessagesRequest = parse_json(&body?)?;
    let generation_request = generation_request(&request)?;
    let (_, ids) = prompt_token_ids(&state, &generation_request).await?;
    Ok(Json(TokenCount { input_tokens: ids.len() as u32 }))
}

fn sse_event(event: &StreamEvent) -> Event {
    Event::default()
        .event(event.name())
        .data(serde_json::to_string(event).expect("response types serialise"))
}

/// The Messages answer: `message_start` and `ping`, then the events of each output (a failure
/// an `error` event) streamed; or the whole message, assembled from the same events.
struct MessagesAnswer {
    events: MessageEvents,
    prompt_tokens: usize,
}

impl MessagesAnswer {
    fn stream_events(&mut self, output: Output) -> Vec<StreamEvent> {
        match output {
            Output::Text { delta, .. } => self.events.push(delta),
            Output::Progress(_) => vec![],
            Output::Done(summary) => self.events.finish(summary),
            Output::Failed(error) => vec![StreamEvent::Error { error: (&error).into() }],
        }
    }
}

impl Protocol for MessagesAnswer {
    type Whole = Message;

    fn opening(&mut self) -> Vec<Event> {
        self.events.start(self.prompt_tokens).iter().map(sse_event).collect()
    }

    fn events(&mut self, output: Output) -> Vec<Event> {
        self.stream_events(output).iter().map(sse_event).collect()
    }

    /// Anthropic's `ping`, which Messages clients expect instead of a comment.
    fn keep_alive(&mut self) -> Vec<Event> {
        vec![sse_event(&StreamEvent::Ping)]
    }

    fn loading_keep_alive() -> Vec<Event> {
        vec![sse_event(&StreamEvent::Ping)]
    }

    fn failure_before_opening(error: &ApiError) -> Vec<Event> {
        vec![sse_event(&StreamEvent::Error { error: error.into() })]
    }

    fn whole(mut self, collected: Collected) -> Result<Message, ApiError> {
        let all: Vec<StreamEvent> =
            collected.outputs().flat_map(|output| self.stream_events(output)).collect();
        Ok(assemble(self.events.empty_message(self.prompt_tokens), all))
    }
}

/// An error on a Messages route: Anthropic's body, OpenAI's status.
#[derive(Debug)]
pub struct MessagesError(pub ApiError);

impl From<ApiError> for MessagesError {
    fn from(error: ApiError) -> Self {
        Self(error)
    }
}

impl From<HttpError> for MessagesError {
    fn from(error: HttpError) -> Self {
        Self(error.0)
    }
}

impl From<BytesRejection> for MessagesError {
    fn from(rejection: BytesRejection) -> Self {
        HttpError::from(rejection).into()
    }
}

impl IntoResponse for MessagesError {
    fn into_response(self) -> Response {
        error_response(&self.0, Json(ErrorResponse { error: (&self.0).into() }))
    }
}

/// An error raised outside a handler (authentication, an unknown route) in the shape the path's
/// protocol uses.
pub fn error_for_path(path: &str, error: ApiError) -> Response {
    if path.starts_with(MESSAGES_PATH) {
        MessagesError(error).into_response()
    } else {
        HttpError(error).into_response()
    }
}
