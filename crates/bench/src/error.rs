//! The one error type of the benchmark client.

use std::time::Duration;

/// Why a benchmark call or phase failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The request could not be sent or its body could not be read.
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    /// The server answered with an error status.
    #[error("status {status}: {body}")]
    Status { status: u16, body: String },
    /// An error event in the middle of a stream (the status line was already 200).
    #[error("error event in the stream: {0}")]
    StreamError(String),
    /// A `data:` payload that is not JSON.
    #[error("bad event payload: {0}")]
    BadPayload(String),
    /// The stream ended before `[DONE]` or a finish reason.
    #[error("the stream ended early")]
    Truncated,
    /// The server could not be restarted.
    #[error("restart: {0}")]
    Restart(String),
    /// A plain socket to the server failed.
    #[error("socket: {0}")]
    Socket(#[from] std::io::Error),
    /// The server did not become ready in time.
    #[error("not ready after {0:?}")]
    NotReady(Duration),
}
