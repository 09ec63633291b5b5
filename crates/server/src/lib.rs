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
mod config;
mod drain;
mod engine;
mod error;
mod files;
mod health;
mod loaded_model;
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
mod tokens;
mod web;

#[cfg(test)]
mod fuzz_tests;

use std::net::SocketAddr;
use std::sync::Arc;

use spindle_chat::ChatError;
use spindle_runner::ModelBundle;

pub use batch_store::BatchConfig;
pub use config::ServerConfig;
pub use engine::GenerationEngine;
pub use loaded_model::{LoadedModel, ModelLease, ServedModel};
pub use model_registry::{Clock, Loader, ModelEntry, ModelRegistry, SystemClock};
pub use routes::router;
pub use state::AppState;

/// Starts the engine thread for `bundle` and the state the routes share, serving that one
/// model. Fails only where the tokenizer cannot encode the reasoning block's closing tag.
pub fn start(config: ServerConfig, bundle: ModelBundle) -> Result<Arc<AppState>, ChatError> {
    let model = LoadedModel::start(config.model_id.clone(), config.ctx_size, &config, bundle)?;
    Ok(with_one_model(config, model))
}

/// The state the routes share around any engine serving `model` (tests give a scripted one).
/// Fails only where the tokenizer cannot encode the reasoning block's closing tag.
pub fn start_with_engine(
    config: ServerConfig,
    model: ServedModel,
    engine: Arc<dyn GenerationEngine>,
) -> Result<Arc<AppState>, ChatError> {
    let (id, parser) = (config.model_id.clone(), config.tool_call_parser);
    let model = LoadedModel::new(id, config.ctx_size, model, engine, parser)?;
    Ok(with_one_model(config, model))
}

/// The state the routes share around several models, loaded as requests name them.
pub fn start_with_registry(
    config: ServerConfig,
    models: Arc<ModelRegistry<LoadedModel>>,
) -> Arc<AppState> {
    Arc::new(AppState::new(config, models))
}

/// One model, loaded before the server starts and never unloaded: the registry has nothing to
/// load, so its loader only says so.
fn with_one_model(config: ServerConfig, model: LoadedModel) -> Arc<AppState> {
    let entry = ModelEntry {
        name: model.id.clone(),
        source: model.id.clone(),
        bytes: 0,
        sampling: model.model.sampling.clone(),
    };
    let loader: Loader<LoadedModel> = Arc::new(|entry: &ModelEntry| {
        Err(format!("`{}` is loaded at start and never unloaded", entry.name))
    });
    let clock = Arc::new(SystemClock::default());
    let models = ModelRegistry::new(vec![entry], u64::MAX, None, loader, clock);
    models.preload(0, model);
    start_with_registry(config, models)
}

/// Serves on `listener`, and runs the batches left unfinished in the batch folder and those
/// created meanwhile, until `shutdown` resolves; then drains (see [`drain`]: nothing more is
/// admitted, the requests in flight end within `config.shutdown_grace`) and returns. Returns
/// an error when a fault stops an engine: the process should exit and be restarted.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let address: SocketAddr = listener.local_addr()?;
    tracing::info!(%address, model = %state.config.model_id, "serving the OpenAI API");
    let worker = tokio::spawn(batch_worker::run(state.clone()));
    let (drained, stop_listening) = tokio::sync::oneshot::channel::<()>();
    let draining = {
        let (state, batch_work) = (state.clone(), worker.abort_handle());
        async move {
            shutdown.await;
            // Batch work is not worth holding the exit for: unanswered requests run again.
            batch_work.abort();
            drain::drain(&state, state.config.shutdown_grace).await;
            let _ = drained.send(());
        }
    };
    let drain_task = tokio::spawn(draining);
    let served = axum::serve(listener, router(state.clone())).with_graceful_shutdown(async {
        let _ = stop_listening.await;
    });
    let result = tokio::select! {
        served = served => served,
        reason = housekeeping(&state) => {
            Err(std::io::Error::other(format!("the engine stopped on a fault: {reason}")))
        }
    };
    drain_task.abort();
    worker.abort();
    result
}

/// Once a second: unloads the models idle past their time-to-live, and checks the loaded
/// models' engines; returns the reason once one has stopped on a fault.
async fn housekeeping(state: &AppState) -> String {
    let mut ticks = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        ticks.tick().await;
        state.models.unload_expired();
        if let Some(reason) = health::engine_fault(state) {
            return reason;
        }
    }
}
