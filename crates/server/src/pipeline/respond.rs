//! The one driver every generation endpoint answers through: a generation read to its end,
//! streamed as server-sent events while its outputs come, or collected into one JSON body. Each
//! API (Chat Completions, Completions, Messages, Responses) supplies only its [`Protocol`].

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use spindle_api::ApiError;
use tokio::time::{timeout_at, Duration, Instant};

use crate::pipeline::generation::{Collected, Generation, Output};
use crate::state::AppState;

/// How the client takes the response (the request's `stream` flag).
#[derive(Clone, Copy)]
pub(crate) enum Delivery {
    /// Server-sent events as the outputs come.
    Stream,
    /// One JSON body at the end.
    Whole,
}

impl Delivery {
    pub fn of(stream: bool) -> Self {
        if stream {
            Self::Stream
        } else {
            Self::Whole
        }
    }
}

/// How one API answers a generation: its events, and its whole response, made from the same
/// outputs.
pub(crate) trait Protocol: Send + 'static {
    /// The body of the whole response.
    type Whole: serde::Serialize;

    /// The events sent before any output.
    fn opening(&mut self) -> Vec<Event>;

    /// The events of one output. A failure is answered with events too: the status line has
    /// been sent.
    fn events(&mut self, output: Output) -> Vec<Event>;

    /// What a stream sends after the keep-alive interval without an event, so that proxies and
    /// clients see it live while a long prompt waits or is read.
    fn keep_alive(&mut self) -> Vec<Event>;

    /// The whole response to a generation read to its end.
    fn whole(self, collected: Collected) -> Result<Self::Whole, ApiError>;
}

/// `generation` answered in `protocol`'s shape.
pub(crate) async fn respond(
    state: &AppState,
    generation: Generation,
    protocol: impl Protocol,
    delivery: Delivery,
) -> Result<Response, ApiError> {
    Ok(match delivery {
        Delivery::Stream => {
            Sse::new(event_stream(generation, protocol, state.config.keep_alive)).into_response()
        }
        Delivery::Whole => Json(whole(generation, protocol).await?).into_response(),
    })
}

/// The whole response, once the generation has ended.
pub(crate) async fn whole<P: Protocol>(
    generation: Generation,
    protocol: P,
) -> Result<P::Whole, ApiError> {
    protocol.whole(generation.collect().await?)
}

/// The opening, then each output's events, and the keep-alive after `quiet` without an event.
/// Dropping the stream (the client went away) drops the generation, which cancels it in the
/// engine.
fn event_stream<P: Protocol>(
    generation: Generation,
    mut protocol: P,
    quiet: Duration,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let opening = protocol.opening();
    let rest = stream::unfold((generation, protocol), move |(mut generation, mut protocol)| {
        async move {
            let deadline = Instant::now() + quiet;
            loop {
                // Reading an output is cancel-safe: a timed-out read loses nothing.
                let Ok(output) = timeout_at(deadline, generation.next()).await else {
                    return Some((protocol.keep_alive(), (generation, protocol)));
                };
                // An output without events (text held back) leaves the quiet time running.
                let events = protocol.events(output?);
                if !events.is_empty() {
                    return Some((events, (generation, protocol)));
                }
            }
        }
    });
    stream::iter(opening).chain(rest.flat_map(stream::iter)).map(Ok)
}
