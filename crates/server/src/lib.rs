//! The OpenAI-compatible HTTP server: routes, authentication, CORS, body limits and metrics
//! around the engine. Handlers never touch the model: they render and tokenize, hand the
//! request to the engine thread, and turn what comes back into JSON or server-sent events.

mod batch_store;
mod batch_worker;
mod batches;
mod chat;
mod chat_answer;
mod completions;
mod error;
mod files;
mod generation;
mod messages;
mod messages_events;
mod messages_request;
mod metrics;
mod request;
mod respond;
mod response_store;
mod responses;
mod responses_input;
mod responses_output;
mod routes;
mod sse;
mod state;
mod structured;
mod tool_output;

#[cfg(test)]
mod fuzz_tests;

use std::net::SocketAddr;
use std::sync::Arc;

use spindle_chat::{ChatError, ModelProfile};
use spindle_runner::{Engine, EngineConfig, ModelBundle};

pub use batch_store::BatchConfig;
pub use routes::router;
pub use state::{AppState, ServerConfig};

/// Starts the engine thread for `bundle` and the state the routes share. Fails only where the
/// tokenizer cannot encode the reasoning block's closing tag.
pub fn start(config: ServerConfig, bundle: ModelBundle) -> Result<Arc<AppState>, ChatError> {
    let profile = ModelProfile::new(&bundle.template, &bundle.tokenizer, config.tool_call_parser)?;
    let caps = profile.capabilities;
    tracing::info!(
        reasoning = ?profile.reasoning.as_ref().map(|r| format!("{}…{}", r.open, r.close)),
        tool_calls = profile.tool_call_format.name(),
        template_tools = caps.tools,
        template_system_role = caps.system_role,
        template_thinking_toggle = caps.thinking_toggle,
        "chat profile"
    );
    let bundle = Arc::new(bundle);
    let engine_config = EngineConfig {
        orphan_prefill_tokens: config.orphan_prefill_tokens,
        ..EngineConfig::new(config.max_concurrent, config.cache.clone())
    };
    let engine = Engine::start(bundle.clone(), engine_config);
    Ok(Arc::new(AppState::new(config, bundle, profile, engine)))
}

/// Serves on `listener` until the process ends (or until `shutdown` resolves), and runs the
/// batches left unfinished in the batch folder and those created meanwhile.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let address: SocketAddr = listener.local_addr()?;
    tracing::info!(%address, model = %state.config.model_id, "serving the OpenAI API");
    let worker = tokio::spawn(batch_worker::run(state.clone()));
    let served = axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await;
    worker.abort();
    served
}
