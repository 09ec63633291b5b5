//! Server-sent events of the OpenAI APIs: JSON `data:` events, closed by `[DONE]`.

use axum::response::sse::Event;
use spindle_api::ApiError;

pub fn json_event(value: &impl serde::Serialize) -> Event {
    Event::default().data(serde_json::to_string(value).expect("response types serialise"))
}

pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

/// A failure mid-stream: an error object event, since the status line is already sent.
pub fn failure_events(error: &ApiError) -> Vec<Event> {
    vec![json_event(&error.to_response_body()), done_event()]
}

/// A comment line: proxies and clients see the connection live, and no client reads it as
/// content.
pub fn keep_alive_comment() -> Event {
    Event::default().comment("keep-alive")
}
