//! `/v1/files`: upload (multipart, `purpose: batch`), list, get, download and delete the files
//! batches read and write. An upload is checked as a batch input before it is kept: a bad
//! line is a 400 naming it, a file over the limit a 413.

use std::io::Write;
use std::sync::Arc;

use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use spindle_api::{ApiError, FileDeleted, FileObject, ListPage, ListQuery};

use crate::batch_store::parse_input;
use crate::error::{internal, HttpError};
use crate::state::AppState;

/// Room for the multipart framing and the `purpose` field around the file itself.
const FORM_OVERHEAD_BYTES: usize = 64 * 1024;

pub fn routes(state: &AppState) -> Router<Arc<AppState>> {
    let upload_limit =
        DefaultBodyLimit::max(state.config.batch.max_file_bytes + FORM_OVERHEAD_BYTES);
    Router::new()
        .route("/v1/files", post(upload_file).layer(upload_limit).get(list_files))
        .route("/v1/files/{id}", get(retrieve_file).delete(delete_file))
        .route("/v1/files/{id}/content", get(file_content))
}

async fn upload_file(
    State(state): State<Arc<AppState>>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<FileObject>, HttpError> {
    let mut multipart = multipart.map_err(|e| {
        ApiError::bad_request(
            format!("the upload must be multipart/form-data with `file` and `purpose` fields: {e}"),
            None,
        )
    })?;
    let limit = state.config.batch.max_file_bytes;
    let mut purpose = None;
    let mut upload = None;
    while let Some(mut field) = multipart.next_field().await.map_err(form_error)? {
        match field.name() {
            Some("purpose") => purpose = Some(field.text().await.map_err(form_error)?),
            Some("file") => {
                let filename = field.file_name().unwrap_or("upload.jsonl").to_string();
                let (staged, mut file) = state.batches.stage_file().map_err(storage_error)?;
                let mut bytes = 0;
                while let Some(chunk) = field.chunk().await.map_err(form_error)? {
                    bytes += chunk.len();
                    if bytes > limit {
                        return Err(ApiError::too_large(format!(
                            "the file is larger than {limit} bytes, the most this server takes"
                        ))
                        .into());
                    }
                    file.write_all(&chunk).map_err(storage_error)?;
                }
                upload = Some((staged, filename));
            }
            // Other fields (`expires_after`) are accepted and ignored.
            _ => {}
        }
    }
    match purpose.as_deref() {
        Some("batch") => {}
        Some(other) => {
            let message =
                format!("purpose must be `batch` (this server keeps files for the Batch API only), got `{other}`");
            return Err(ApiError::bad_request(message, Some("purpose")).into());
        }
        None => {
            return Err(
                ApiError::bad_request("the form has no `purpose` field", Some("purpose")).into()
            )
        }
    }
    let Some((staged, filename)) = upload else {
        return Err(ApiError::bad_request("the form has no `file` field", Some("file")).into());
    };
    let max_requests = state.config.batch.max_requests;
    let checked = tokio::task::spawn_blocking(move || {
        let text = std::fs::read(staged.path()).map_err(storage_error)?;
        let text = String::from_utf8(text)
            .map_err(|_| ApiError::bad_request("the file is not UTF-8 text", Some("file")))?;
        parse_input(&text, max_requests)?;
        Ok::<_, ApiError>(staged)
    });
    let staged = checked.await.map_err(internal)??;
    Ok(Json(state.batches.add_file(staged, filename, "batch").map_err(storage_error)?))
}

/// A form the multipart reader gave up on: 413 when it ran past the body limit.
fn form_error(error: MultipartError) -> ApiError {
    if error.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(format!(
            "the upload is larger than the server accepts: {}",
            error.body_text()
        ))
    } else {
        ApiError::bad_request(
            format!("could not read the multipart form: {}", error.body_text()),
            None,
        )
    }
}

/// The batch folder could not be written or read: the server's fault, logged in full.
pub fn storage_error(error: std::io::Error) -> ApiError {
    internal(format!("batch storage failed: {error}"))
}

fn file_or_404(state: &AppState, id: &str) -> Result<FileObject, ApiError> {
    state.batches.file(id).ok_or_else(|| ApiError::not_found(format!("no file `{id}`")))
}

async fn list_files(
    State(state): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ListPage<FileObject>>, HttpError> {
    Ok(Json(list_query(query)?.page(state.batches.files(), |f| &f.id)?))
}

/// The `limit` and `after` of a list request.
pub fn list_query(query: Result<Query<ListQuery>, QueryRejection>) -> Result<ListQuery, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text()), None))
}

async fn retrieve_file(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<FileObject>, HttpError> {
    Ok(Json(file_or_404(&state, &id)?))
}

async fn file_content(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    file_or_404(&state, &id)?;
    let path = state.batches.content_path(&id);
    let bytes = tokio::task::spawn_blocking(move || std::fs::read(path))
        .await
        .map_err(internal)?
        .map_err(storage_error)?;
    Ok(([(header::CONTENT_TYPE, "application/jsonl")], bytes).into_response())
}

async fn delete_file(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<FileDeleted>, HttpError> {
    if state.batches.delete_file(&id).map_err(storage_error)? {
        Ok(Json(FileDeleted { id, deleted: true }))
    } else {
        Err(ApiError::not_found(format!("no file `{id}`")).into())
    }
}
