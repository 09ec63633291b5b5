//! The batch worker: one task that runs the requests of unfinished batches, oldest batch
//! first, through the same pipeline as live requests, below them:
//!
//! - one batch request at a time, started only while the engine has a free slot and nobody
//!   waits for one (`waiting == 0`, `active < --max-concurrent`);
//! - batch requests are not counted against `--max-concurrent` + `--max-queue`, so batch work
//!   never turns a live request away with a 429;
//! - when a live request waits because every slot is taken, the batch request in flight is
//!   dropped (its prompt stays cached) and run again when there is room.
//!
//! A batch request already decoding shares the engine's steps with live ones: a live request
//! is never kept from starting by it, but its steps carry one more row.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use spindle_api::{
    ApiError, BatchError, BatchErrors, BatchInputLine, BatchLineError, BatchLineResponse,
    BatchOutputLine, BatchStatus, ChatCompletionRequest,
};

use crate::admission::Admission;
use crate::answer_parts::ResponseHead;
use crate::batch_store::ResultLog;
use crate::chat::answer::ChatAnswer;
use crate::chat::request::generation_request;
use crate::clock::unix_now;
use crate::engine::GenerationEngine;
use crate::error::parse_json_value;
use crate::pipeline::request::GenerationRequest;
use crate::pipeline::respond::whole;
use crate::pipeline::{start_on, Started};
use crate::state::AppState;

/// How often the worker looks at the engine's load while it waits or runs.
const POLL: Duration = Duration::from_millis(20);

/// Runs batches for the life of the server.
pub async fn run(state: Arc<AppState>) {
    loop {
        match state.batches.next_unfinished() {
            Some(id) => {
                if let Err(error) = run_batch(&state, &id).await {
                    // The disk failed under the batch; it fails rather than spin on it.
                    tracing::error!(batch = %id, %error, "batch failed");
                    let failure = BatchError {
                        code: "server_error".into(),
                        message: error.to_string(),
                        param: None,
                        line: None,
                    };
                    let failed = state.batches.update(&id, |b| {
                        b.status = BatchStatus::Failed;
                        b.failed_at = Some(unix_now());
                        b.errors = Some(BatchErrors { data: vec![failure] });
                    });
                    if failed.is_err() {
                        // Not even that can be written: stop, rather than retry forever.
                        return;
                    }
                }
            }
            None => state.batches.changed.notified().await,
        }
    }
}

async fn run_batch(state: &Arc<AppState>, id: &str) -> std::io::Result<()> {
    let store = &state.batches;
    let Some(batch) = store.batch(id) else { return Ok(()) };
    if matches!(batch.status, BatchStatus::Validating | BatchStatus::InProgress) {
        let lines = match store.read_input(&batch.input_file_id, state.config.batch.max_requests) {
            Ok(lines) => lines,
            Err(error) => return fail_input(state, id, &error),
        };
        let (answered, counts) = store.answered(id)?;
        store.update(id, |b| {
            if matches!(b.status, BatchStatus::Validating | BatchStatus::InProgress) {
                b.status = BatchStatus::InProgress;
                b.in_progress_at.get_or_insert(unix_now());
                b.request_counts.completed = counts.completed;
                b.request_counts.failed = counts.failed;
            }
        })?;
        for line in lines.iter().filter(|line| !answered.contains(&line.custom_id)) {
            let Some((log, result)) = run_line(state, id, line).await else { break };
            store.append_result(id, log, &result)?;
        }
    }
    finish(state, id)
}

/// Closes batch `id`: its logs become its output and error files, and it is `completed`, or
/// `cancelled` when it was being cancelled.
fn finish(state: &AppState, id: &str) -> std::io::Result<()> {
    let store = &state.batches;
    let closing = store.update(id, |b| {
        if matches!(b.status, BatchStatus::Validating | BatchStatus::InProgress) {
            b.status = BatchStatus::Finalizing;
            b.finalizing_at.get_or_insert(unix_now());
        }
    })?;
    let Some(batch) = closing.filter(|b| !b.status.is_final()) else { return Ok(()) };
    let output = store.publish_log(id, ResultLog::Output)?;
    let errors = store.publish_log(id, ResultLog::Errors)?;
    store.update(id, |b| {
        b.output_file_id = output;
        b.error_file_id = errors;
        if batch.status == BatchStatus::Cancelling {
            b.status = BatchStatus::Cancelled;
            b.cancelled_at = Some(unix_now());
        } else {
            b.status = BatchStatus::Completed;
            b.completed_at = Some(unix_now());
        }
    })?;
    Ok(())
}

/// An input file that can no longer be read (deleted since the batch was made) fails the batch.
fn fail_input(state: &AppState, id: &str, error: &ApiError) -> std::io::Result<()> {
    let failure = BatchError {
        code: "invalid_input_file".into(),
        message: error.message.clone(),
        param: error.param.clone(),
        line: None,
    };
    state.batches.update(id, |b| {
        b.status = BatchStatus::Failed;
        b.failed_at = Some(unix_now());
        b.errors = Some(BatchErrors { data: vec![failure] });
    })?;
    Ok(())
}

/// Runs one request when the engine has room, again if it had to give way to a live request;
/// `None` when the batch is being cancelled.
async fn run_line(
    state: &Arc<AppState>,
    id: &str,
    line: &BatchInputLine,
) -> Option<(ResultLog, BatchOutputLine)> {
    let request = match chat_request(line) {
        Ok(request) => request,
        Err(error) => {
            return Some(failure(
                line,
                &format!("batch_req_{:032x}", rand::random::<u128>()),
                &error,
            ))
        }
    };
    let refused = |error: &ApiError| {
        Some(failure(line, &format!("batch_req_{:032x}", rand::random::<u128>()), error))
    };
    loop {
        if let Err(error) = request.validate() {
            return refused(&error);
        }
        let model = match state.model(request.model.as_deref(), request.ttl).await {
            Ok(model) => model,
            Err(error) => return refused(&error),
        };
        let engine = model.engine.clone();
        wait_for_room(state, engine.as_ref(), id).await?;
        let head = ResponseHead::new(ResponseHead::fresh_id("chatcmpl"), &model.id);
        let Started { generation, tools, .. } =
            match start_on(state, model, &request, &head.id, Admission::Batch) {
                Ok(started) => started,
                Err(error) => return refused(&error),
            };
        let request_id = head.id.clone();
        let answer = ChatAnswer { head, tools, include_usage: false };
        tokio::select! {
            result = whole(generation, answer) => return Some(match result {
                Ok(completion) => {
                    let body = serde_json::to_value(&completion).unwrap_or(Value::Null);
                    (ResultLog::Output, output_line(line, request_id, 200, body, None))
                }
                Err(error) => failure(line, &request_id, &error),
            }),
            // Dropping the generation cancels it in the engine.
            () = must_give_way(state, engine.as_ref(), id) => {}
        }
    }
}

/// The line's body, a chat request, as a generation request; batches answer whole, never
/// streamed.
fn chat_request(line: &BatchInputLine) -> Result<GenerationRequest, ApiError> {
    let request: ChatCompletionRequest = parse_json_value(&Value::Object(line.body.clone()))?;
    if request.stream {
        return Err(ApiError::bad_request("a batch request cannot stream", Some("stream")));
    }
    request.validate()?;
    generation_request(&request)
}

fn failure(
    line: &BatchInputLine,
    request_id: &str,
    error: &ApiError,
) -> (ResultLog, BatchOutputLine) {
    let body = serde_json::to_value(error.to_response_body()).unwrap_or(Value::Null);
    let code = error.code.clone().unwrap_or_else(|| error.kind.as_str().to_string());
    let detail = BatchLineError { code, message: error.message.clone() };
    (ResultLog::Errors, output_line(line, request_id.to_string(), error.status, body, Some(detail)))
}

fn output_line(
    line: &BatchInputLine,
    request_id: String,
    status_code: u16,
    body: Value,
    error: Option<BatchLineError>,
) -> BatchOutputLine {
    BatchOutputLine {
        id: format!("batch_req_{:032x}", rand::random::<u128>()),
        custom_id: line.custom_id.clone(),
        response: BatchLineResponse { status_code, request_id, body },
        error,
    }
}

/// Waits until `engine` has a free slot nobody is waiting for; `None` when the batch is being
/// cancelled.
async fn wait_for_room(state: &AppState, engine: &dyn GenerationEngine, id: &str) -> Option<()> {
    loop {
        if cancelling(state, id) {
            return None;
        }
        let load = engine.load();
        if load.waiting.load(Ordering::Relaxed) == 0
            && load.active.load(Ordering::Relaxed) < state.config.max_concurrent
        {
            return Some(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Resolves when the batch request in flight must stop: every slot is taken and a request
/// waits for one, or the batch is being cancelled.
async fn must_give_way(state: &AppState, engine: &dyn GenerationEngine, id: &str) {
    loop {
        tokio::time::sleep(POLL).await;
        let load = engine.load();
        let full = load.active.load(Ordering::Relaxed) >= state.config.max_concurrent;
        if (full && load.waiting.load(Ordering::Relaxed) > 0) || cancelling(state, id) {
            return;
        }
    }
}

/// The batch is no longer running (cancelled, or cancelled before it started).
fn cancelling(state: &AppState, id: &str) -> bool {
    state.batches.batch(id).is_none_or(|b| b.status != BatchStatus::InProgress)
}
