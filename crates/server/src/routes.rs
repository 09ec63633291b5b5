//! The route table, the layers around it (CORS, API key, body limit, request counting), and the
//! small endpoints: models, health, metrics, load, cancel. The chat page and `GET /` are in
//! `web`; tokenize, detokenize and render in `tokens`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{header, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use spindle_api::{ApiError, ModelCard, ModelList};
use tower_http::cors::CorsLayer;

use crate::batches;
use crate::chat::chat_completions;
use crate::completions::completions;
use crate::error::HttpError;
use crate::files;
use crate::health::health;
use crate::messages::{count_tokens, error_for_path, messages};
use crate::responses::{create_response, delete_response, retrieve_response};
use crate::sampling_defaults;
use crate::state::AppState;
use crate::tokens::{detokenize, render_chat, render_completion, tokenize};
use crate::web;

pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/chat/completions/{id}/cancel", post(cancel))
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/v1/completions", post(completions))
        .route("/v1/completions/render", post(render_completion))
        .route("/v1/models", get(models))
        .route("/v1/tokenize", post(tokenize))
        .route("/v1/detokenize", post(detokenize))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/responses", post(create_response))
        .route("/v1/responses/{id}", get(retrieve_response).delete(delete_response))
        .merge(files::routes(&state))
        .merge(batches::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .merge(web::routes())
        .route("/metrics", get(metrics))
        .route("/get_load", get(get_load))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        // Browser-based clients send a preflight OPTIONS first; it needs no key.
        .layer(CorsLayer::permissive())
        .with_state(state)
}

async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = &state.config.api_key else { return next.run(request).await };
    if request.method() == Method::OPTIONS {
        return next.run(request).await;
    }
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Anthropic's clients send the key as `x-api-key`.
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    if bearer == Some(key.as_str()) || x_api_key == Some(key.as_str()) {
        next.run(request).await
    } else {
        let error = ApiError::unauthorized(
            "a valid API key is required: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
        );
        error_for_path(request.uri().path(), error)
    }
}

async fn count_requests(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let matched = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string());
    // An unmatched path is logged as sent (to see what a client or router looks for) but
    // counted under one label, so stray paths cannot grow the metrics without bound.
    let unmatched_path = matched.is_none().then(|| request.uri().path().to_string());
    let endpoint = matched.unwrap_or_else(|| "unmatched".to_string());
    let method = request.method().clone();
    let response = next.run(request).await;
    let status = response.status();
    state.metrics.count_request(&endpoint, status.as_u16());
    // A generation that runs logs its own line when it ends (`request done`, with its tokens
    // and speeds); a refused request gets its line here, and the small endpoints (health
    // checks, metrics scrapes) only at debug level, so polling does not flood the log.
    if status.is_client_error() || status.is_server_error() {
        let path = unmatched_path.as_deref();
        tracing::info!(%method, endpoint, path, status = status.as_u16(), "request refused");
    } else {
        tracing::debug!(%method, endpoint, status = status.as_u16(), "request answered");
    }
    response
}

async fn not_found(request: Request) -> Response {
    let path = request.uri().path();
    error_for_path(path, ApiError::not_found(format!("no route for {} {path}", request.method())))
}

/// Each loaded model's series, labelled with its `model_name`.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let loaded = state.models.loaded();
    let engines: Vec<_> =
        loaded.iter().map(|(name, model)| (name.clone(), model.engine.load())).collect();
    let text = state.metrics.render(&engines, state.config.cache.block_size);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// `{"load": N}`: the sequences every loaded model's engine runs or keeps waiting, which
/// vllm-router's `power_of_two` policy polls to send a request to the less busy of two replicas.
async fn get_load(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let read = |gauge: &std::sync::atomic::AtomicUsize| gauge.load(Ordering::Relaxed);
    let loaded = state.models.loaded();
    let load: usize = loaded
        .iter()
        .map(|(_, model)| model.engine.load())
        .map(|load| read(&load.active) + read(&load.waiting))
        .sum();
    Json(json!({ "load": load }))
}

/// Every served model, whether it is loaded, and its sampling defaults (a loaded model's as its
/// files were read at load; another's as read at start).
async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    let loaded = state.models.loaded();
    let data = state.models.list().into_iter().map(|(entry, load_state)| {
        let model = loaded.iter().find(|(name, _)| *name == entry.name).map(|(_, m)| m);
        ModelCard {
            created: state.started,
            owned_by: "spindle".into(),
            // A model not loaded yet is read with the server's context.
            max_model_len: Some(model.map_or(state.config.ctx_size, |m| m.ctx_size)),
            sampling_defaults: Some(sampling_defaults::card(
                &state.config.sampling,
                model.map_or(&entry.sampling, |m| &m.model.sampling),
            )),
            status: Some(load_state.name().into()),
            id: entry.name,
        }
    });
    Json(ModelList { data: data.collect() })
}

async fn cancel(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, HttpError> {
    if state.admissions.cancel(&id) {
        Ok(Json(json!({"id": id, "object": "chat.completion.cancelled", "cancelled": true})))
    } else {
        Err(ApiError::not_found(format!("no request `{id}` is in flight")).into())
    }
}
