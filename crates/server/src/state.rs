//! What every handler shares: the configuration, the served models (each loaded one with its
//! engine, tokenizer, template, limits and chat profile), the metrics, and the in-flight
//! requests that can be cancelled.

use std::sync::Arc;

use spindle_api::ApiError;

use crate::admission::Admissions;
use crate::batch_store::BatchStore;
use crate::clock::unix_now;
use crate::config::ServerConfig;
use crate::loaded_model::{LoadedModel, ModelLease};
use crate::metrics::Metrics;
use crate::model_registry::{Acquisition, ModelRegistry, RegistryError};
use crate::response_store::ResponseStore;

pub struct AppState {
    pub config: ServerConfig,
    /// The served models and which of them are loaded.
    pub models: Arc<ModelRegistry<LoadedModel>>,
    pub metrics: Metrics,
    /// Finished Responses API responses kept for `GET` and `previous_response_id`.
    pub responses: ResponseStore,
    /// Uploaded files and batches, on disk.
    pub batches: BatchStore,
    /// Unix time the server started; reported as the model's `created`.
    pub started: u64,
    /// The requests in flight, each cancellable by id.
    pub admissions: Arc<Admissions>,
}

impl AppState {
    pub fn new(config: ServerConfig, models: Arc<ModelRegistry<LoadedModel>>) -> Self {
        let batches = BatchStore::open(&config.batch.dir);
        let admissions = Arc::new(Admissions::new(config.max_concurrent + config.max_queue));
        Self {
            config,
            models,
            metrics: Metrics::default(),
            responses: ResponseStore::default(),
            batches,
            started: unix_now(),
            admissions,
        }
    }

    /// The served model `requested` names (absent or empty: the first), loading it first when
    /// it is not loaded, and from now on unloaded once idle `ttl_seconds` (0: never; `None`: as
    /// before): 404 `model_not_found` for a model not served, 503 when memory for it cannot be
    /// freed now, 500 when its load fails.
    pub async fn model(
        &self,
        requested: Option<&str>,
        ttl_seconds: Option<u64>,
    ) -> Result<ModelLease, ApiError> {
        self.models.acquire(requested, ttl(ttl_seconds)).await.map_err(registry_error)
    }

    /// [`model`](Self::model) up to the wait: the lease when the model is loaded, the load to
    /// wait for when not; refused now with 404 or 503 as there.
    pub fn begin_model(
        &self,
        requested: Option<&str>,
        ttl_seconds: Option<u64>,
    ) -> Result<Acquisition<LoadedModel>, ApiError> {
        self.models.begin(requested, ttl(ttl_seconds)).map_err(registry_error)
    }
}

/// A request's `ttl` in seconds as the registry takes it: 0 is never.
fn ttl(seconds: Option<u64>) -> Option<Option<std::time::Duration>> {
    seconds.map(|s| (s > 0).then(|| std::time::Duration::from_secs(s)))
}

/// A registry refusal as the API answers it.
pub(crate) fn registry_error(error: RegistryError) -> ApiError {
    match &error {
        RegistryError::NotFound { .. } => ApiError {
            code: Some("model_not_found".into()),
            ..ApiError::not_found(error.to_string())
        },
        RegistryError::NoRoom { .. } => ApiError::unavailable(error.to_string()),
        RegistryError::LoadFailed { .. } => ApiError::internal(error.to_string()),
    }
}
