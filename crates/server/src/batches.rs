//! `/v1/batches`: create a batch over an uploaded file, get and list batches, cancel one. The
//! batch worker (`batch_worker.rs`) does the work; these handlers only record and report.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use spindle_api::{
    ApiError, Batch, BatchStatus, CreateBatchRequest, ListPage, ListQuery, RequestCounts,
};

use crate::clock::unix_now;
use crate::error::{internal, parse_json, HttpError};
use crate::files::{list_query, storage_error};
use crate::state::AppState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/batches", post(create_batch).get(list_batches))
        .route("/v1/batches/{id}", get(retrieve_batch))
        .route("/v1/batches/{id}/cancel", post(cancel_batch))
}

async fn create_batch(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Batch>, HttpError> {
    let request: CreateBatchRequest = parse_json(&body?)?;
    request.validate()?;
    let file_id = request.input_file_id.clone();
    let file = state.batches.file(&file_id).ok_or_else(|| ApiError {
        param: Some("input_file_id".into()),
        ..ApiError::not_found(format!("no file `{file_id}`"))
    })?;
    if file.purpose != "batch" {
        let message = format!(
            "the file `{file_id}` has purpose `{}`; a batch reads a file uploaded with purpose `batch`",
            file.purpose
        );
        return Err(ApiError::bad_request(message, Some("input_file_id")).into());
    }
    let reader = state.clone();
    let max_requests = state.config.batch.max_requests;
    let lines =
        tokio::task::spawn_blocking(move || reader.batches.read_input(&file_id, max_requests))
            .await
            .map_err(internal)??;
    let batch = Batch {
        id: String::new(),
        endpoint: request.endpoint,
        errors: None,
        input_file_id: request.input_file_id,
        completion_window: request.completion_window,
        status: BatchStatus::Validating,
        output_file_id: None,
        error_file_id: None,
        created_at: unix_now(),
        in_progress_at: None,
        expires_at: None,
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
        request_counts: RequestCounts { total: lines.len(), completed: 0, failed: 0 },
        metadata: request.metadata,
    };
    Ok(Json(state.batches.create_batch(batch).map_err(storage_error)?))
}

async fn retrieve_batch(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Batch>, HttpError> {
    Ok(Json(state.batches.batch(&id).ok_or_else(|| no_batch(&id))?))
}

async fn list_batches(
    State(state): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ListPage<Batch>>, HttpError> {
    Ok(Json(list_query(query)?.page(state.batches.batches(), |b| &b.id)?))
}

/// A batch that has not started is cancelled at once; a running one is `cancelling` until its
/// request in flight stops, then `cancelled` with the results it has so far.
async fn cancel_batch(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Batch>, HttpError> {
    let mut refused = None;
    let batch = state
        .batches
        .update(&id, |b| match b.status {
            BatchStatus::Validating => {
                b.status = BatchStatus::Cancelled;
                b.cancelling_at = Some(unix_now());
                b.cancelled_at = b.cancelling_at;
            }
            BatchStatus::InProgress => {
                b.status = BatchStatus::Cancelling;
                b.cancelling_at = Some(unix_now());
            }
            BatchStatus::Cancelling | BatchStatus::Cancelled => {}
            status => refused = Some(status),
        })
        .map_err(storage_error)?
        .ok_or_else(|| no_batch(&id))?;
    if let Some(status) = refused {
        let status = serde_json::to_value(status).unwrap_or_default();
        return Err(ApiError::bad_request(
            format!("the batch `{id}` is {status} and can no longer be cancelled"),
            None,
        )
        .into());
    }
    state.batches.changed.notify_one();
    Ok(Json(batch))
}

fn no_batch(id: &str) -> ApiError {
    ApiError::not_found(format!("no batch `{id}`"))
}
