//! The server's routes in-process, through `router(state)` with tower's `oneshot`, around a
//! [`ScriptedEngine`] instead of a model: no download, no socket, no model step. The tokenizer
//! and chat template are Qwen3's, from the chat crate's fixtures (thinking and Hermes tool
//! calls, as a real model's).

#[path = "../../shared/chat_stream.rs"]
mod chat_stream;
pub mod scripted;
pub use chat_stream::{parse_chat_stream, sse_data};

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{header, Request};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{json, Value};
use spindle_chat::{ChatTemplate, Tokenizer};
use spindle_server::{AppState, ServedModel, ServerConfig};
use tower::ServiceExt;

pub use scripted::{Gate, Reply, ScriptedEngine, Seen};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../chat/tests/data/qwen3");

/// Qwen3's tokenizer, read once per test process.
pub fn tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = std::path::Path::new(FIXTURES).join("tokenizer.json");
            Arc::new(Tokenizer::from_tokenizer_json(&path).unwrap())
        })
        .clone()
}

/// Qwen3's chat template: `<think>` blocks, a thinking switch, Hermes tool calls.
pub fn qwen3_template() -> ChatTemplate {
    let path = std::path::Path::new(FIXTURES).join("tokenizer_config.json");
    ChatTemplate::from_tokenizer_config(&path, &tokenizer()).unwrap().unwrap()
}

/// The id the test server serves.
pub const MODEL: &str = "scripted";

/// The configuration of `spindle serve` with small limits: 4 running, 16 waiting, 2,048
/// positions per sequence, 64 KiB bodies, and `--no-thinking` (so that a request for two
/// tokens needs no room to close a reasoning block).
pub fn config() -> ServerConfig {
    ServerConfig {
        model_id: MODEL.into(),
        api_key: None,
        max_concurrent: 4,
        max_queue: 16,
        ctx_size: 2048,
        thinking_default: false,
        thinking_budget: None,
        chat_template_kwargs: Default::default(),
        max_body_bytes: 64 * 1024,
        cache: Default::default(),
        tool_call_parser: None,
        guided_json: None,
        keep_alive: std::time::Duration::from_secs(15),
        orphan_prefill_tokens: usize::MAX,
        batch: spindle_server::BatchConfig::new(fresh_dir("batches")),
        speculation: Default::default(),
        sampling: Default::default(),
        shutdown_grace: std::time::Duration::from_secs(30),
    }
}

/// A folder path of its own under the system's temporary folder, not created yet.
pub fn fresh_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "spindle-routes-{name}-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ))
}

/// The routes around a scripted engine.
#[derive(Clone)]
pub struct TestServer {
    pub state: Arc<AppState>,
    pub engine: Arc<ScriptedEngine>,
}

/// A server whose engine answers every request by `script`, in the default configuration.
pub fn server(script: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> TestServer {
    server_with(script, |_, _| {})
}

/// A server that answers every request with `text`.
pub fn replying(text: &'static str) -> TestServer {
    server(move |_| Reply::text(text))
}

/// [`server`] with the configuration and the served model changed by `change`.
pub fn server_with(
    script: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    change: impl FnOnce(&mut ServerConfig, &mut ServedModel),
) -> TestServer {
    let mut config = config();
    let mut model = ServedModel {
        tokenizer: tokenizer(),
        template: qwen3_template(),
        max_positions: 32_768,
        kv_tokens: 1 << 16,
        sampling: Default::default(),
    };
    change(&mut config, &mut model);
    let engine = Arc::new(ScriptedEngine::new(tokenizer(), script));
    let state = spindle_server::start_with_engine(config, model, engine.clone()).unwrap();
    TestServer { state, engine }
}

impl TestServer {
    pub async fn send(&self, request: Request<Body>) -> Response {
        spindle_server::router(self.state.clone()).oneshot(request).await.unwrap()
    }

    /// Status and JSON body of a POST of `body`.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send_json(post_json(path, body)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send_json(Request::get(path).body(Body::empty()).unwrap()).await
    }

    pub async fn send_json(&self, request: Request<Body>) -> (u16, Value) {
        let response = self.send(request).await;
        let status = response.status().as_u16();
        let text = body_text(response).await;
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    }

    /// The `data:` payloads of a streamed response (`[DONE]` included), checking its status
    /// and content type.
    pub async fn post_stream(&self, path: &str, body: &Value) -> Vec<String> {
        let response = self.send(post_json(path, body)).await;
        assert_eq!(response.status(), 200);
        let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        sse_data(&body_text(response).await)
    }
}

pub fn post_json(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

pub async fn body_text(response: Response) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The next chunk of a streamed body as text; `None` at its end.
pub async fn next_chunk(body: &mut axum::body::BodyDataStream) -> Option<String> {
    let bytes = body.next().await?.unwrap();
    Some(String::from_utf8(bytes.to_vec()).unwrap())
}

/// A chat request for one user message.
pub fn chat_body(user: &str, max_tokens: u32) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": max_tokens,
    })
}
