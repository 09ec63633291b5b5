//! `POST /v1/chat/completions`: the request converted ([`generation_request`]), run through the
//! pipeline, and answered as one `chat.completion` or as a stream of `chat.completion.chunk`s
//! built from the same outputs.

pub(crate) mod answer;
pub(crate) mod request;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use spindle_api::ChatCompletionRequest;

use crate::admission::Admission;
use crate::answer_parts::ResponseHead;
use crate::chat::answer::ChatAnswer;
use crate::chat::request::generation_request;
use crate::error::{parse_json, HttpError};
use crate::pipeline::respond::{respond_on_model, Answer, Delivery, ModelChoice};
use crate::pipeline::{start_on, Started};
use crate::state::AppState;

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let request: ChatCompletionRequest = parse_json(&body?)?;
    request.validate()?;
    let generation_request = generation_request(&request)?;
    generation_request.validate()?;
    let delivery = Delivery::of(request.stream);
    let progress = matches!(delivery, Delivery::Stream) && request.return_progress;
    let include_usage = request.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let choice = ModelChoice { name: request.model.as_deref(), ttl_seconds: request.ttl };
    let started = state.clone();
    let answer: Answer<ChatAnswer> = Box::new(move |model| {
        let id = ResponseHead::fresh_id("chatcmpl");
        let Started { mut generation, tools, .. } =
            start_on(&started, model, &generation_request, &id, Admission::Live)?;
        let head = ResponseHead::new(id, generation.model_name());
        if progress {
            generation.report_progress();
        }
        Ok((generation, ChatAnswer { head, tools, include_usage }))
    });
    Ok(respond_on_model(&state, choice, delivery, answer).await?)
}
