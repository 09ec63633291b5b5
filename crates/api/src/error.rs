//! The error every endpoint returns, and its OpenAI JSON body
//! (`{"error": {"message", "type", "param", "code"}}`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The `type` of an error body; tells a client which family of failure it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request is malformed or asks for something impossible (400, 413).
    InvalidRequest,
    /// The model or route does not exist (404).
    NotFound,
    /// The API key is missing or wrong (401).
    Authentication,
    /// The queue is full; retry later (429).
    RateLimit,
    /// Spindle failed; not the client's fault (500).
    Server,
}

impl ErrorKind {
    /// The wire string for the body's `type` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request_error",
            Self::NotFound => "not_found_error",
            Self::Authentication => "authentication_error",
            Self::RateLimit => "rate_limit_error",
            Self::Server => "server_error",
        }
    }
}

/// A failed request: the HTTP status plus what goes into the OpenAI error body.
///
/// Validation returns these; the server turns one into a response in a single place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// Human-readable explanation, shown to the client as is.
    pub message: String,
    /// Error family, written as the body's `type`.
    pub kind: ErrorKind,
    /// The request field at fault, e.g. `messages[1].role`.
    pub param: Option<String>,
    /// A machine-readable code for errors clients branch on, e.g. `context_length_exceeded`.
    pub code: Option<String>,
}

impl ApiError {
    fn new(status: u16, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None }
    }

    /// 400: the request is invalid; `param` names the offending field when there is one.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            param: param.map(str::to_owned),
            ..Self::new(400, ErrorKind::InvalidRequest, message)
        }
    }

    /// 404: unknown model or route.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, ErrorKind::NotFound, message)
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, ErrorKind::Authentication, message)
    }

    /// 413: the request body is over the size limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, ErrorKind::InvalidRequest, message)
    }

    /// 429: the queue is full; the server adds `Retry-After`.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(429, ErrorKind::RateLimit, message)
    }

    /// 400 with code `context_length_exceeded`, the code OpenAI clients look for to trim
    /// history and retry.
    pub fn context_length_exceeded(message: impl Into<String>) -> Self {
        Self {
            code: Some("context_length_exceeded".to_owned()),
            ..Self::new(400, ErrorKind::InvalidRequest, message)
        }
    }

    /// 503: the server cannot take the request now (memory for its model cannot be freed
    /// while other models run); the server adds `Retry-After`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, ErrorKind::Server, message)
    }

    /// 500: an internal failure; the message should already be sanitized.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, ErrorKind::Server, message)
    }

    /// The JSON body to send with [`ApiError::status`].
    pub fn to_response_body(&self) -> ErrorResponse {
        ErrorResponse {
            error: ErrorBody {
                message: self.message.clone(),
                kind: self.kind.as_str().to_owned(),
                param: self.param.clone(),
                code: self.code.clone(),
            },
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.status, self.kind.as_str(), self.message)
    }
}

impl std::error::Error for ApiError {}

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

/// The inside of [`ErrorResponse`]. `type` is a plain string so a client can read errors
/// from servers whose types differ from [`ErrorKind`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// Sent as `null` when no single field is at fault, as OpenAI does.
    pub param: Option<String>,
    /// Sent as `null` when there is no code, as OpenAI does.
    pub code: Option<String>,
}
