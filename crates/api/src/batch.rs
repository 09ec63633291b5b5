//! OpenAI's Files and Batch APIs: the `file` and `batch` objects, their lists, and the JSONL
//! lines a batch reads (one request each) and writes (one result each).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ApiError;

/// The only endpoint a batch line may call.
pub const BATCH_ENDPOINT: &str = "/v1/chat/completions";
/// The only completion window OpenAI offers.
pub const COMPLETION_WINDOW: &str = "24h";

/// An uploaded (or batch-written) file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "file")]
pub struct FileObject {
    pub id: String,
    /// Size of the contents.
    pub bytes: u64,
    /// Unix seconds.
    pub created_at: u64,
    pub filename: String,
    /// `batch` for uploads, `batch_output` for the files a batch writes.
    pub purpose: String,
    /// Always `processed`: a file is validated before it is stored.
    pub status: String,
}

/// The body of `DELETE /v1/files/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "file")]
pub struct FileDeleted {
    pub id: String,
    pub deleted: bool,
}

/// One page of a list endpoint, newest first; `after` = `last_id` asks for the next page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "list")]
pub struct ListPage<T> {
    pub data: Vec<T>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

/// The query of a list endpoint.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ListQuery {
    /// Items per page (1–100, default 20).
    pub limit: Option<usize>,
    /// The id of the item before the page.
    pub after: Option<String>,
}

impl ListQuery {
    /// The page of `items` (newest first, each with its id) this query asks for.
    pub fn page<T>(&self, items: Vec<T>, id: impl Fn(&T) -> &str) -> Result<ListPage<T>, ApiError> {
        let limit = self.limit.unwrap_or(20);
        if !(1..=100).contains(&limit) {
            return Err(ApiError::bad_request(
                format!("limit must be between 1 and 100, got {limit}"),
                Some("limit"),
            ));
        }
        let start = match &self.after {
            Some(after) => {
                items.iter().position(|item| id(item) == after).map(|i| i + 1).ok_or_else(|| {
                    ApiError::bad_request(
                        format!("`after` names no item of this list: {after}"),
                        Some("after"),
                    )
                })?
            }
            None => 0,
        };
        let has_more = items.len() > start + limit;
        let data: Vec<T> = items.into_iter().skip(start).take(limit).collect();
        let first_id = data.first().map(|item| id(item).to_string());
        let last_id = data.last().map(|item| id(item).to_string());
        Ok(ListPage { data, first_id, last_id, has_more })
    }
}

/// One line of a batch's input file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchInputLine {
    /// The caller's name for the request, unique in the file; results carry it back.
    pub custom_id: String,
    pub method: String,
    pub url: String,
    /// A chat-completion request; read when the line runs, so a bad body fails that line only.
    pub body: Map<String, Value>,
}

impl BatchInputLine {
    /// Reads line `number` (1-based) of an input file; the 400 names the line.
    pub fn parse(text: &str, number: usize) -> Result<Self, ApiError> {
        let bad = |message: String| {
            ApiError::bad_request(format!("line {number} of the file: {message}"), Some("file"))
        };
        let line: Self =
            serde_json::from_str(text).map_err(|e| bad(format!("not a batch request: {e}")))?;
        if line.custom_id.is_empty() {
            return Err(bad("custom_id is empty".into()));
        }
        if line.method != "POST" {
            return Err(bad(format!("method must be POST, got `{}`", line.method)));
        }
        if line.url != BATCH_ENDPOINT {
            return Err(bad(format!(
                "url must be {BATCH_ENDPOINT} (the only batch endpoint served), got `{}`",
                line.url
            )));
        }
        Ok(line)
    }
}

/// The body of `POST /v1/batches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateBatchRequest {
    pub input_file_id: String,
    pub endpoint: String,
    pub completion_window: String,
    /// Up to 16 caller's key-value pairs, returned as given.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

impl CreateBatchRequest {
    pub fn validate(&self) -> Result<(), ApiError> {
        if self.endpoint != BATCH_ENDPOINT {
            let message = format!(
                "endpoint must be {BATCH_ENDPOINT} (the only batch endpoint served), got `{}`",
                self.endpoint
            );
            return Err(ApiError::bad_request(message, Some("endpoint")));
        }
        if self.completion_window != COMPLETION_WINDOW {
            let message = format!(
                "completion_window must be `{COMPLETION_WINDOW}`, got `{}`",
                self.completion_window
            );
            return Err(ApiError::bad_request(message, Some("completion_window")));
        }
        if let Some(metadata) = &self.metadata {
            if metadata.len() > 16 || metadata.values().any(|v| !v.is_string()) {
                return Err(ApiError::bad_request(
                    "metadata holds at most 16 string values",
                    Some("metadata"),
                ));
            }
        }
        Ok(())
    }
}

/// Where a batch is in its life: `validating` → `in_progress` → `finalizing` → `completed`,
/// or `cancelling` → `cancelled`, or `failed` (its input could not be read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    /// No more work will be done.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Failed | Self::Completed | Self::Expired | Self::Cancelled)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    pub total: usize,
    pub completed: usize,
    pub failed: usize,
}

/// Why a batch failed as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "list")]
pub struct BatchErrors {
    pub data: Vec<BatchError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    pub line: Option<usize>,
}

/// A batch. Timestamps are Unix seconds, `null` until the batch gets there. Batches here do
/// not expire, so `expires_at` stays `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "object", rename = "batch")]
pub struct Batch {
    pub id: String,
    pub endpoint: String,
    pub errors: Option<BatchErrors>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: BatchStatus,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: u64,
    pub in_progress_at: Option<u64>,
    pub expires_at: Option<u64>,
    pub finalizing_at: Option<u64>,
    pub completed_at: Option<u64>,
    pub failed_at: Option<u64>,
    pub expired_at: Option<u64>,
    pub cancelling_at: Option<u64>,
    pub cancelled_at: Option<u64>,
    pub request_counts: RequestCounts,
    pub metadata: Option<Map<String, Value>>,
}

/// One line of a batch's output file (`response.status_code` 200, `error` null) or error file
/// (the status and OpenAI error body of the failure, and `error` with its code and message).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchOutputLine {
    /// `batch_req_…`, unique per line.
    pub id: String,
    pub custom_id: String,
    pub response: BatchLineResponse,
    pub error: Option<BatchLineError>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchLineResponse {
    pub status_code: u16,
    pub request_id: String,
    /// A `chat.completion`, or an error body.
    pub body: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchLineError {
    pub code: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_lines_name_the_line_that_is_wrong() {
        let good = r#"{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}"#;
        assert_eq!(BatchInputLine::parse(good, 1).unwrap().custom_id, "a");
        let url = good.replace("/v1/chat/completions", "/v1/embeddings");
        let error = BatchInputLine::parse(&url, 7).unwrap_err();
        assert!(
            error.message.starts_with("line 7 of the file: url must be /v1/chat/completions"),
            "{}",
            error.message
        );
        let error = BatchInputLine::parse("{not json", 3).unwrap_err();
        assert!(
            error.message.starts_with("line 3 of the file: not a batch request"),
            "{}",
            error.message
        );
        assert_eq!(error.status, 400);
        let missing = BatchInputLine::parse(
            r#"{"method": "POST", "url": "/v1/chat/completions", "body": {}}"#,
            2,
        );
        assert!(missing.unwrap_err().message.contains("custom_id"));
    }

    #[test]
    fn pages_follow_the_after_cursor() {
        let items: Vec<String> = (0..5).map(|i| format!("id{i}")).collect();
        let query = ListQuery { limit: Some(2), after: None };
        let first = query.page(items.clone(), |s| s).unwrap();
        assert_eq!(
            (first.data.as_slice(), first.has_more),
            (&["id0".to_string(), "id1".into()][..], true)
        );
        let next =
            ListQuery { limit: Some(2), after: first.last_id }.page(items.clone(), |s| s).unwrap();
        assert_eq!(next.data, vec!["id2", "id3"]);
        let last = ListQuery { limit: Some(2), after: Some("id3".into()) }
            .page(items.clone(), |s| s)
            .unwrap();
        assert_eq!((last.data.len(), last.has_more), (1, false));
        assert_eq!(
            ListQuery { limit: Some(0), after: None }
                .page(items, |s| s)
                .unwrap_err()
                .param
                .as_deref(),
            Some("limit")
        );
    }

    #[test]
    fn a_batch_serializes_in_openais_shape() {
        let batch = Batch {
            id: "batch_1".into(),
            endpoint: BATCH_ENDPOINT.into(),
            errors: None,
            input_file_id: "file-1".into(),
            completion_window: "24h".into(),
            status: BatchStatus::InProgress,
            output_file_id: None,
            error_file_id: None,
            created_at: 1,
            in_progress_at: Some(2),
            expires_at: None,
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            request_counts: RequestCounts { total: 3, completed: 1, failed: 0 },
            metadata: None,
        };
        let json = serde_json::to_value(&batch).unwrap();
        assert_eq!(json["object"], "batch");
        assert_eq!(json["status"], "in_progress");
        assert_eq!(
            json["request_counts"],
            serde_json::json!({"total": 3, "completed": 1, "failed": 0})
        );
        assert!(json["output_file_id"].is_null() && json.get("cancelled_at").is_some());
    }
}
