//! The chat page: a browser asking for `/` (its `Accept` names `text/html`) gets the page, and
//! every other client the health JSON it always had. The page's files (under `web/`) are built
//! into the binary, so it needs no network and no install; it speaks only the public API, like
//! any other client.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use spindle_api::ApiError;

use crate::error::HttpError;
use crate::health::health;
use crate::state::AppState;

/// One file of the page: its name under `/ui/`, its type, and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const INDEX: &str = include_str!("../web/index.html");

const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

const ASSETS: &[Asset] = &[
    Asset { name: "app.js", content_type: JAVASCRIPT, body: include_bytes!("../web/app.js") },
    Asset { name: "store.js", content_type: JAVASCRIPT, body: include_bytes!("../web/store.js") },
    Asset { name: "stream.js", content_type: JAVASCRIPT, body: include_bytes!("../web/stream.js") },
    Asset {
        name: "markdown.js",
        content_type: JAVASCRIPT,
        body: include_bytes!("../web/markdown.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../web/style.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../web/icon.svg"),
    },
    Asset {
        name: "manifest.json",
        content_type: "application/manifest+json",
        body: include_bytes!("../web/manifest.json"),
    },
];

/// `GET /` and the page's files. Neither needs the API key: the page asks for it and sends it
/// with its API calls.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/", get(root)).route("/ui/{name}", get(asset))
}

/// The page for a browser; the health JSON for everyone else (Claude Code probes `HEAD /`,
/// scripts read `GET /`).
async fn root(state: State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let wants_html = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("text/html"));
    if !wants_html {
        return health(state).await;
    }
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
            // A new server version brings a new page: the browser must ask again each time.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        INDEX,
    )
        .into_response()
}

async fn asset(Path(name): Path<String>) -> Response {
    let Some(asset) = ASSETS.iter().find(|asset| asset.name == name) else {
        return HttpError::from(ApiError::not_found(format!("no page file `{name}`")))
            .into_response();
    };
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        asset.body,
    )
        .into_response()
}
