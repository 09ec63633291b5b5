//! The OpenAI-compatible HTTP server: routes, authentication, CORS, body limits and metrics
//! around the engine. Handlers never touch the model: each protocol's adapter converts its
//! request for the one request `pipeline` (which renders, tokenizes, plans, admits and hands it
//! to the engine thread), and turns the events that come back into its JSON or server-sent
//! events.

mod admission;
mod answer_parts;
mod batch_store;
mod batch_worker;
mod batches;
mod chat;
mod clock;
mod completions;
mod engine;
mod error;
mod files;
mod messages;
mod metrics;
pub mod model_registry;
mod pipeline;
mod response_store;
mod responses;
mod routes;
pub mod sampling_defaults;
mod sse;
mod state;

#[cfg(test)]
mod fuzz_tests;

use std::net::SocketAddr;
use std::sync::Arc;

use spindle_chat::{ChatError, ModelProfile};
use spindle_runner::{Engine, EngineConfig, ModelBundle};

pub use batch_store::BatchConfig;
pub use engine::GenerationEngine;
pub use routes::router;
pub use state::{AppState, ServedModel, ServerConfig};

/// Starts the engine thread for `bundle` and the state the routes share. Fails only where the
/// tokenizer cannot encode the reasoning block's closing tag.
pub fn start(config: ServerConfig, bundle: ModelBundle) -> Result<Arc<AppState>, ChatError> {
    let model = ServedModel {
        tokenizer: bundle.tokenizer.clone(),
        template: bundle.template.clone(),
        max_positions: bundle.model.config().max_position_embeddings,
        kv_tokens: config.cache.kv_tokens(&bundle),
        sampling: bundle.sampling.clone(),
    };
    // Checked before the engine starts: a model the server cannot serve loads no KV pool.
    let profile = ModelProfile::new(&model.template, &model.tokenizer, config.tool_call_parser)?;
    let engine_config = EngineConfig {
        orphan_prefill_tokens: config.orphan_prefill_tokens,
        speculation: config.speculation.clone(),
        ..EngineConfig::new(config.max_concurrent, config.cache.clone())
    };
    let engine = Engine::start(Arc::new(bundle), engine_config);
    Ok(with_profile(config, model, profile, Arc::new(engine)))
}

/// The state the routes share around any engine serving `model` (tests give a scripted one).
/// Fails only where the tokenizer cannot encode the reasoning block's closing tag.
pub fn start_with_engine(
    config: ServerConfig,
    model: ServedModel,
    engine: Arc<dyn GenerationEngine>,
) -> Result<Arc<AppState>, ChatError> {
    let profile = ModelProfile::new(&model.template, &model.tokenizer, config.tool_call_parser)?;
    Ok(with_profile(config, model, profile, engine))
}

fn with_profile(
    config: ServerConfig,
    model: ServedModel,
    profile: ModelProfile,
    engine: Arc<dyn GenerationEngine>,
) -> Arc<AppState> {
    let caps = profile.capabilities;
    tracing::info!(
        reasoning = ?profile.reasoning.as_ref().map(|r| format!("{}…{}", r.open, r.close)),
        tool_calls = profile.tool_call_format.name(),
        template_tools = caps.tools,
        template_system_role = caps.system_role,
        template_thinking_toggle = caps.thinking_toggle,
        "chat profile"
    );
    Arc::new(AppState::new(config, model, profile, engine))
}

/// Serves on `listener` until the process ends (or until `shutdown` resolves), and runs the
/// batches left unfinished in the batch folder and those created meanwhile. Returns an error
/// when a fault stops the engine: the process should exit and be restarted.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let address: SocketAddr = listener.local_addr()?;
    tracing::info!(%address, model = %state.config.model_id, "serving the OpenAI API");
    let worker = tokio::spawn(batch_worker::run(state.clone()));
    let mut health = state.engine.health();
    let served = axum::serve(listener, router(state)).with_graceful_shutdown(shutdown);
    let result = tokio::select! {
        served = served => served,
        Ok(reason) = health.wait_for(Option::is_some) => {
            let reason = reason.clone().unwrap_or_default();
            Err(std::io::Error::other(format!("the engine stopped on a fault: {reason}")))
        }
    };
    worker.abort();
    result
}
