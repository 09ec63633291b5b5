//! Checks shared by the request types' `validate` methods. Each failure is a 400 that
//! names the offending field in `param`.

use std::fmt::Display;
use std::ops::RangeBounds;

use crate::{ApiError, StreamOptions};

/// Fails when `value` is given and outside `allowed`; `expected` describes `allowed` in the
/// message, e.g. "between 0 and 2".
pub(crate) fn check_range<T>(
    value: Option<T>,
    allowed: impl RangeBounds<T>,
    param: &str,
    expected: &str,
) -> Result<(), ApiError>
where
    T: PartialOrd + Display,
{
    match value {
        Some(v) if !allowed.contains(&v) => {
            Err(ApiError::bad_request(format!("{param} must be {expected}, got {v}"), Some(param)))
        }
        _ => Ok(()),
    }
}

/// OpenAI refuses `stream_options` on a non-streaming request rather than ignoring it.
pub(crate) fn check_stream_options(
    stream: bool,
    stream_options: Option<&StreamOptions>,
) -> Result<(), ApiError> {
    if stream_options.is_some() && !stream {
        return Err(ApiError::bad_request(
            "stream_options is only allowed when stream is true",
            Some("stream_options"),
        ));
    }
    Ok(())
}
