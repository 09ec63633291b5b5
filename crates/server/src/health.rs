//! Whether the server can answer: `GET /health` (and `GET /` for API clients), and the fault
//! of a loaded model's engine that the process exits on.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::drain;
use crate::state::AppState;

/// 200 while every loaded model's engine runs; 503 once a fault has stopped one, or while the
/// server drains (the process is on its way out: routers stop sending work here).
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let model = &state.config.model_id;
    if drain::draining(&state) {
        let body = json!({"status": "draining", "model": model});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    match engine_fault(&state) {
        None => Json(json!({"status": "ok", "model": model})).into_response(),
        Some(_) => {
            let body =
                json!({"status": "error", "model": model, "error": "the engine has stopped"});
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

/// Why a loaded model's engine stopped, if one has.
pub fn engine_fault(state: &AppState) -> Option<String> {
    let loaded = state.models.loaded();
    loaded.iter().find_map(|(_, model)| model.engine.health().borrow().clone())
}
