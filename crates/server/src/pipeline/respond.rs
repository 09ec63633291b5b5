//! The one driver every generation endpoint answers through: a generation read to its end,
//! streamed as server-sent events while its outputs come, or collected into one JSON body. Each
//! API (Chat Completions, Completions, Messages, Responses) supplies only its [`Protocol`].
//! A streamed request whose model is not loaded yet is answered at once, with keep-alives until
//! the load ends ([`respond_on_model`]).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use spindle_api::ApiError;
use tokio::time::{timeout, timeout_at, Duration, Instant};

use crate::loaded_model::{LoadedModel, ModelLease};
use crate::model_registry::{Acquisition, LoadWait};
use crate::pipeline::generation::{Collected, Generation, Output};
use crate::sse::{failure_events, keep_alive_comment};
use crate::state::{registry_error, AppState};

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
    /// clients see it live while a long prompt waits or is read: an SSE comment unless the API
    /// has its own.
    fn keep_alive(&mut self) -> Vec<Event> {
        vec![keep_alive_comment()]
    }

    /// What a stream sends while its model loads, before the opening: a keep-alive the API's
    /// clients skip before any other event.
    fn loading_keep_alive() -> Vec<Event>
    where
        Self: Sized,
    {
        vec![keep_alive_comment()]
    }

    /// The events of a failure before the opening: the model did not load, or refused the
    /// request once loaded (the status line has been sent). OpenAI's error event unless the API
    /// has its own.
    fn failure_before_opening(error: &ApiError) -> Vec<Event>
    where
        Self: Sized,
    {
        failure_events(error)
    }

    /// The whole response to a generation read to its end.
    fn whole(self, collected: Collected) -> Result<Self::Whole, ApiError>;
}

/// A request's model, as it names it (`None`: the first), and the idle time-to-live it asks
/// for in seconds.
pub(crate) struct ModelChoice<'a> {
    pub name: Option<&'a str>,
    pub ttl_seconds: Option<u64>,
}

/// Makes a request's generation and its protocol on the leased model (renders, plans, admits
/// and submits it).
pub(crate) type Answer<P> =
    Box<dyn FnOnce(ModelLease) -> Result<(Generation, P), ApiError> + Send + 'static>;

/// The answer to a request on the model `choice` names, made by `answer` once the model is
/// leased. A model not served, or without room to load, is refused now with its status. A
/// streamed request whose model must load first is answered at once: the protocol's loading
/// keep-alive right away and after each quiet interval until the load ends, then the answer's
/// events; a failure after that is answered with events. A whole response simply waits.
pub(crate) async fn respond_on_model<P: Protocol>(
    state: &Arc<AppState>,
    choice: ModelChoice<'_>,
    delivery: Delivery,
    answer: Answer<P>,
) -> Result<Response, ApiError> {
    let model = match state.begin_model(choice.name, choice.ttl_seconds)? {
        Acquisition::Ready(model) => model,
        Acquisition::Loading(load) => match delivery {
            Delivery::Stream => {
                let events = events_after_load(load, answer, state.config.keep_alive);
                return Ok(Sse::new(events.map(Ok::<_, Infallible>)).into_response());
            }
            Delivery::Whole => load.finish().await.map_err(registry_error)?,
        },
    };
    let (generation, protocol) = answer(model)?;
    respond(state, generation, protocol, delivery).await
}

/// Keep-alives until `load` ends (one at once, then one each `quiet`), then `answer`'s events.
fn events_after_load<P: Protocol>(
    load: LoadWait<LoadedModel>,
    answer: Answer<P>,
    quiet: Duration,
) -> impl Stream<Item = Event> {
    let answered: BoxFuture<'static, Result<(Generation, P), ApiError>> = Box::pin(async move {
        let model = load.finish().await.map_err(registry_error)?;
        answer(model)
    });
    let waiting = stream::iter(P::loading_keep_alive());
    let rest = stream::unfold(Some(answered), move |answered| async move {
        let mut answered = answered?;
        let next: BoxStream<'static, Event> = match timeout(quiet, &mut answered).await {
            Err(_) => return Some((stream::iter(P::loading_keep_alive()).boxed(), Some(answered))),
            Ok(Ok((generation, protocol))) => event_stream(generation, protocol, quiet).boxed(),
            Ok(Err(error)) => stream::iter(P::failure_before_opening(&error)).boxed(),
        };
        Some((next, None))
    });
    waiting.chain(rest.flatten())
}

/// `generation` answered in `protocol`'s shape.
async fn respond(
    state: &AppState,
    generation: Generation,
    protocol: impl Protocol,
    delivery: Delivery,
) -> Result<Response, ApiError> {
    Ok(match delivery {
        Delivery::Stream => {
            let events = event_stream(generation, protocol, state.config.keep_alive);
            Sse::new(events.map(Ok::<_, Infallible>)).into_response()
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
) -> impl Stream<Item = Event> {
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
    stream::iter(opening).chain(rest.flat_map(stream::iter))
}
