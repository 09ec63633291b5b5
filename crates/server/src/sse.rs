//! Server-sent events: a generation's outputs rendered as `data:` events, closed by `[DONE]`.
//! A failure mid-stream becomes an error object event, since the status line is already sent.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive};
use futures_util::stream::{self, Stream, StreamExt};

use crate::generation::{Generation, Output};
use crate::state::AppState;

pub fn json_event(value: &impl serde::Serialize) -> Event {
    Event::default().data(serde_json::to_string(value).expect("response types serialise"))
}

/// A comment line after `state`'s keep-alive interval of quiet: proxies and clients see the
/// connection live while a long prompt waits or is read, and no client reads it as content.
pub fn keep_alive(state: &AppState) -> KeepAlive {
    KeepAlive::new().interval(state.config.keep_alive).text("keep-alive")
}

/// [`keep_alive`] as Anthropic's `ping` event, which Messages clients expect instead.
pub fn keep_alive_ping(state: &AppState) -> KeepAlive {
    KeepAlive::new()
        .interval(state.config.keep_alive)
        .event(Event::default().event("ping").data(r#"{"type":"ping"}"#))
}

pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

/// The events of `generation`, each text or end output rendered by `render`. Dropping the
/// stream (the client went away) drops the generation, which cancels it in the engine.
pub fn event_stream(
    generation: Generation,
    mut render: impl FnMut(Output) -> Vec<Event> + Send + 'static,
) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(generation, |mut g| async move { g.next().await.map(|output| (output, g)) })
        .flat_map(move |output| {
            let events = match output {
                Output::Failed(error) => vec![json_event(&error.to_response_body()), done_event()],
                output => render(output),
            };
            stream::iter(events.into_iter().map(Ok))
        })
}
