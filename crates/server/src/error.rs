//! The one place where failures become HTTP responses: every error leaves with its status (and
//! `Retry-After` on 429 and 503), as the OpenAI error JSON (Anthropic's on the Messages routes).

use std::fmt::Display;

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};
use spindle_api::{ApiError, SamplingParams};
use spindle_chat::ChatError;
use spindle_runner::RunnerError;

/// Seconds a client should wait before retrying when the queue is full.
const RETRY_AFTER_SECONDS: &str = "1";

/// Seconds a client should wait before retrying when no model can be unloaded to make room for
/// its own: until a running request ends, at least.
const RETRY_AFTER_NO_ROOM_SECONDS: &str = "5";

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

/// `error`'s status (and `Retry-After` on 429 and 503) around `body`, the error in a protocol's shape.
pub fn error_response(error: &ApiError, body: impl IntoResponse) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body).into_response();
    let retry_after = match status {
        StatusCode::TOO_MANY_REQUESTS => Some(RETRY_AFTER_SECONDS),
        StatusCode::SERVICE_UNAVAILABLE => Some(RETRY_AFTER_NO_ROOM_SECONDS),
        _ => None,
    };
    if let Some(seconds) = retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(seconds));
    }
    response
}

/// The one mapping of runner failures to HTTP. What the request caused is a 4xx naming the
/// field to change; anything else is a 500 whose message names only `request_id`, the detail
/// (panic text, model error, file paths) going to the log under that id.
pub fn runner_failure(request_id: &str, error: RunnerError) -> ApiError {
    match &error {
        RunnerError::PromptExceedsContext { .. } | RunnerError::PromptExceedsKvPool { .. } => {
            prompt_too_long(&error, "messages")
        }
        RunnerError::GrammarDeadEnd(_) => ApiError::bad_request(
            format!("{error}; the schema of response_format (or of the tools) cannot be met"),
            Some("response_format"),
        ),
        RunnerError::Chat(ChatError::TemplateRaised(_)) => {
            ApiError::bad_request(error.to_string(), Some("messages"))
        }
        RunnerError::Sampling(e) => ApiError::bad_request(error.to_string(), Some(e.field)),
        RunnerError::EmptyPrompt => ApiError::bad_request(error.to_string(), Some("prompt")),
        _ => internal_error(request_id, &error),
    }
}

/// The 400 `context_length_exceeded` of a prompt that does not fit, naming `field`, the request
/// field that holds the prompt (`messages`, or `prompt` on the legacy completions).
pub fn prompt_too_long(error: &RunnerError, field: &str) -> ApiError {
    let advice = match error {
        RunnerError::PromptExceedsKvPool { .. } => " or raise --kv-cache-memory",
        _ => "",
    };
    ApiError {
        param: Some(field.into()),
        ..ApiError::context_length_exceeded(format!("{error}; shorten the {field}{advice}"))
    }
}

/// [`runner_failure`] before the request has a response id: a fresh id ties the answer to
/// its log line.
pub fn failure(error: impl Into<RunnerError>) -> ApiError {
    runner_failure(&fresh_request_id(), error.into())
}

/// A 500 for a fault of the server's own: the client learns the request id, the log the detail.
pub fn internal_error(request_id: &str, detail: &dyn Display) -> ApiError {
    tracing::error!(request_id, %detail, "request failed");
    ApiError::internal(format!("the server failed on request {request_id}; its log has the detail"))
}

/// [`internal_error`] before the request has a response id.
pub fn internal(detail: impl Display) -> ApiError {
    internal_error(&fresh_request_id(), &detail)
}

fn fresh_request_id() -> String {
    format!("req_{:016x}", rand::random::<u64>())
}

/// Parses a JSON body into `T`. A body that is not JSON is a 400 "malformed JSON"; one that does
/// not fit `T` (a missing field, a field of the wrong type) is a 400 whose message and `param`
/// name the field's JSON path, e.g. `messages[2].content`.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, HttpError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        request_error(error, || {
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
        })
    })?;
    deserializer.end().map_err(malformed)?;
    Ok(value)
}

/// [`parse_json`] for a body already read as JSON, e.g. one line of a batch input file.
pub fn parse_json_value<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body)
        .map_err(|error| request_error(error, || serde_path_to_error::deserialize(body)))
}

type TrackedError = serde_path_to_error::Error<serde_json::Error>;

fn malformed(error: serde_json::Error) -> HttpError {
    HttpError(ApiError::bad_request(format!("malformed JSON: {error}"), None))
}

/// The 400 for a body that failed to parse, naming the path of the field at fault.
/// `sampling_alone` reads the body as [`SamplingParams`] (see [`flattened_sampling_path`]).
fn request_error(
    error: TrackedError,
    sampling_alone: impl FnOnce() -> Result<SamplingParams, TrackedError>,
) -> ApiError {
    let inner = error.inner();
    if inner.is_syntax() || inner.is_eof() {
        return malformed(error.into_inner()).0;
    }
    let mut path = json_path(error.path());
    if path.is_empty() {
        path = flattened_sampling_path(sampling_alone(), inner).unwrap_or_default();
    }
    // serde reports a missing field at the object that lacks it; the field itself is at fault.
    if let Some(field) = missing_field(inner) {
        path = if path.is_empty() { field } else { format!("{path}.{field}") };
    }
    if path.is_empty() {
        ApiError::bad_request(format!("invalid request: {inner}"), None)
    } else {
        ApiError::bad_request(format!("invalid request: {path}: {inner}"), Some(&path))
    }
}

/// `messages[2].content`: the path as an OpenAI `param`. Segments serde could not name (inside
/// an untagged enum) end it, so the path stops at the last field it knows.
fn json_path(path: &Path) -> String {
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => break,
        }
    }
    out
}

/// The field of a "missing field `name`" error (serde's fixed wording in every format).
fn missing_field(error: &serde_json::Error) -> Option<String> {
    let message = error.to_string();
    let name = message.strip_prefix("missing field `")?.split('`').next()?;
    Some(name.to_owned())
}

/// Chat, completion and Responses requests flatten [`SamplingParams`] into their top level, and
/// serde reads flattened fields from a buffer that has lost their path, so `"temperature":
/// "hot"` fails at the root. Reading the body as the sampling fields alone finds the field; it
/// is the one at fault when that fails with the same complaint (a request type without sampling
/// fields ignores them and fails for another reason).
fn flattened_sampling_path(
    sampling_alone: Result<SamplingParams, TrackedError>,
    original: &serde_json::Error,
) -> Option<String> {
    let error = sampling_alone.err()?;
    let path = json_path(error.path());
    let same_complaint = without_position(error.inner()) == without_position(original);
    (same_complaint && !path.is_empty()).then_some(path)
}

/// The error's message without serde_json's " at line L column C", which differs between two
/// reads that fail on the same value.
fn without_position(error: &serde_json::Error) -> String {
    let text = error.to_string();
    let position = format!(" at line {} column {}", error.line(), error.column());
    text.strip_suffix(&position).unwrap_or(&text).to_owned()
}

#[cfg(test)]
mod tests {
    use spindle_chat::ChatError;
    use spindle_runner::RunnerError;

    use super::runner_failure;

    #[test]
    fn what_the_request_caused_is_a_4xx_naming_the_field() {
        let cases = [
            (RunnerError::PromptExceedsContext { prompt: 90, context: 64 }, 400, "messages"),
            (RunnerError::PromptExceedsKvPool { prompt: 90, kv_tokens: 64 }, 400, "messages"),
            (RunnerError::GrammarDeadEnd("no way on".into()), 400, "response_format"),
            (
                RunnerError::Chat(ChatError::TemplateRaised("roles must alternate".into())),
                400,
                "messages",
            ),
            (RunnerError::EmptyPrompt, 400, "prompt"),
        ];
        for (error, status, param) in cases {
            let detail = error.to_string();
            let answer = runner_failure("chatcmpl-1", error);
            assert_eq!((answer.status, answer.param.as_deref()), (status, Some(param)), "{detail}");
            assert!(answer.message.contains(&detail), "{answer}");
        }
    }

    #[test]
    fn a_fault_of_the_server_is_a_500_naming_only_the_request_id() {
        let faults = [
            RunnerError::Internal("a sequence step panicked: index out of bounds".into()),
            RunnerError::Load("cannot read /models/secret/model.gguf".into()),
            RunnerError::Chat(ChatError::Template("unknown method no_such_method".into())),
        ];
        for fault in faults {
            let detail = fault.to_string();
            let answer = runner_failure("chatcmpl-7", fault);
            assert_eq!((answer.status, answer.param.as_deref()), (500, None), "{detail}");
            assert!(answer.message.contains("chatcmpl-7"), "{answer}");
            for word in detail.split_whitespace().filter(|w| w.len() > 6) {
                assert!(!answer.message.contains(word), "{word:?} leaked: {answer}");
            }
        }
    }
}
