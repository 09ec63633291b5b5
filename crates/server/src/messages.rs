//! Anthropic's Messages API over the chat pipeline: `POST /v1/messages` (whole or streamed) and
//! `POST /v1/messages/count_tokens`. The request is read as a chat request
//! ([`chat_request`]), generated like any other, and answered as Anthropic events
//! ([`MessageEvents`]); errors leave in Anthropic's shape with the status OpenAI's would have.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use spindle_api::anthropic::{ErrorResponse, Message, MessagesRequest, StreamEvent, TokenCount};
use spindle_api::ApiError;

use crate::chat::{render_prompt, start_chat, ChatStart};
use crate::error::{error_response, failure, parse_json, HttpError};
use crate::generation::{Generation, Output};
use crate::messages_events::{assemble, MessageEvents};
use crate::messages_request::chat_request;
use crate::request::check_model;
use crate::sse::keep_alive_ping;
use crate::state::AppState;

/// The path prefix whose errors take Anthropic's shape.
const MESSAGES_PATH: &str = "/v1/messages";

pub async fn messages(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, MessagesError> {
    let request: MessagesRequest = parse_json(&body?)?;
    request.validate()?;
    let chat = chat_request(&request)?;
    let ChatStart { generation, head, tools, prompt_tokens } = start_chat(&state, &chat, "msg")?;
    let events = MessageEvents::new(head, tools);
    if request.stream {
        Ok(Sse::new(event_stream(generation, events, prompt_tokens))
            .keep_alive(keep_alive_ping(&state))
            .into_response())
    } else {
        Ok(Json(collect(generation, events, prompt_tokens).await?).into_response())
    }
}

/// The prompt's tokens, rendered and tokenized as `/v1/messages` would (`chat::plan`), without
/// generating.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenCount>, MessagesError> {
    let request: MessagesRequest = parse_json(&body?)?;
    let chat = chat_request(&request)?;
    chat.validate()?;
    check_model(&state, chat.model.as_deref())?;
    let tools: Vec<Value> = chat.tools.iter().map(|t| json!(t)).collect();
    let prompt = render_prompt(&state, &chat.messages, &tools, &chat.chat_template_kwargs)?.text;
    let ids = state.bundle.tokenizer.encode(&prompt, false).map_err(failure)?;
    Ok(Json(TokenCount { input_tokens: ids.len() as u32 }))
}

fn sse_event(event: &StreamEvent) -> Event {
    Event::default()
        .event(event.name())
        .data(serde_json::to_string(event).expect("response types serialise"))
}

/// `message_start` and `ping`, then the events of each output; a failure becomes an `error`
/// event (the status line is already sent). Dropping the stream cancels the generation.
fn event_stream(
    generation: Generation,
    events: MessageEvents,
    prompt_tokens: usize,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let opening = stream::iter(events.start(prompt_tokens));
    let rest = stream::unfold((generation, events), |(mut generation, mut events)| async move {
        let batch = match generation.next().await? {
            Output::Text { delta, .. } => events.push(delta),
            Output::Progress(_) => vec![],
            Output::Done(summary) => events.finish(summary),
            Output::Failed(error) => vec![StreamEvent::Error { error: (&error).into() }],
        };
        Some((stream::iter(batch), (generation, events)))
    })
    .flatten();
    opening.chain(rest).map(|event| Ok(sse_event(&event)))
}

/// The whole message, assembled from the events a stream would have sent.
async fn collect(
    generation: Generation,
    mut events: MessageEvents,
    prompt_tokens: usize,
) -> Result<Message, ApiError> {
    let whole = generation.collect().await?;
    let mut all = Vec::new();
    for (delta, _) in whole.pieces {
        all.extend(events.push(delta));
    }
    all.extend(events.finish(whole.summary));
    Ok(assemble(events.empty_message(prompt_tokens), all))
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
