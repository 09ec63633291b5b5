//! The one place where failures become HTTP responses: every error leaves with its status (and
//! `Retry-After` on 429), as the OpenAI error JSON (Anthropic's on the Messages routes).

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use spindle_api::ApiError;

/// Seconds a client should wait before retrying when the queue is full.
const RETRY_AFTER_SECONDS: &str = "1";

/// Wraps [`ApiError`] so handlers can return it with `?`.
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<BytesRejection> for HttpError {
    fn from(rejection: BytesRejection) -> Self {
        let status = rejection.status();
        Self(if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large("the request body is larger than the server accepts")
        } else {
            ApiError::bad_request(
                format!("could not read the request body: {}", rejection.body_text()),
                None,
            )
        })
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        error_response(&self.0, Json(self.0.to_response_body()))
    }
}

/// `error`'s status (and `Retry-After` on 429) around `body`, the error in a protocol's shape.
pub fn error_response(error: &ApiError, body: impl IntoResponse) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
    }
    response
}

/// Parses a JSON body into `T`, naming what is wrong (bad syntax, a missing field, a field of
/// the wrong type) in the 400 message.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, HttpError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "malformed JSON"
            }
            _ => "invalid request",
        };
        HttpError(ApiError::bad_request(format!("{what}: {e}"), None))
    })
}
