//! What every handler shares: the configuration, the served models (each loaded one with its
//! engine, tokenizer, template, limits and chat profile), the metrics, and the in-flight
//! requests that can be cancelled.

use std::sync::Arc;

use serde_json::{Map, Value};
use spindle_api::ApiError;
use spindle_chat::{ChatTemplate, Tokenizer, ToolCallFormat};
use spindle_runner::model_sampling::{ModelSampling, SamplingPreset};
use spindle_runner::{CacheConfig, SpeculationConfig};

use crate::admission::Admissions;
use crate::batch_store::{BatchConfig, BatchStore};
use crate::clock::unix_now;
use crate::loaded_model::{LoadedModel, ModelLease};
use crate::metrics::Metrics;
use crate::model_registry::{Acquisition, ModelRegistry, RegistryError};
use crate::response_store::ResponseStore;

/// How the server was started.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The id clients use in `model` (and see in `/v1/models`); with several models, the
    /// first's, which answers requests that name none.
    pub model_id: String,
    /// When set, every `/v1` request needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Sequences generating at once.
    pub max_concurrent: usize,
    /// Requests allowed to wait beyond those; more get 429.
    pub max_queue: usize,
    /// Positions per sequence (prompt + completion) of the model loaded at start; with
    /// several models each is sized at its load (`--ctx-size`, else what it and its pool hold).
    pub ctx_size: usize,
    /// `--no-thinking`: thinking is off unless a request turns it on.
    pub thinking_default: bool,
    /// Default reasoning-token budget when a request names none.
    pub thinking_budget: Option<usize>,
    /// Template variables applied to every request (a request's own kwargs win).
    pub chat_template_kwargs: Map<String, Value>,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// KV storage and prefix-cache sizes, and the prefix cache's folder on disk if any.
    pub cache: CacheConfig,
    /// `--tool-call-parser`: the tool-call syntax, when not the one the chat template uses.
    pub tool_call_parser: Option<ToolCallFormat>,
    /// `--guided-json`: the schema every answer follows unless a request sets `response_format`.
    pub guided_json: Option<Value>,
    /// Quiet time after which a stream sends a keep-alive (while its prompt waits or is read).
    pub keep_alive: std::time::Duration,
    /// `--orphan-prefill-tokens`: how much of a prompt whose client left is still read while
    /// the engine is idle (0: none).
    pub orphan_prefill_tokens: usize,
    /// `--batch-dir` and the Batch API's size limits.
    pub batch: BatchConfig,
    /// `--no-speculate` and `--draft-max`: whether requests decode speculatively unless they
    /// say, and how far.
    pub speculation: SpeculationConfig,
    /// `--temperature`, `--top-k`, `--top-p`, `--min-p`, `--repeat-penalty`: the defaults of a
    /// request that leaves them out, over the model's own.
    pub sampling: SamplingPreset,
}

/// What the handlers know of the served model: its text side and its limits. The weights stay
/// with the engine.
pub struct ServedModel {
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// Positions the model was trained for; the served context is at most this.
    pub max_positions: usize,
    /// Positions the KV pool holds over all sequences: no longer prompt can ever run.
    pub kv_tokens: usize,
    /// The sampling settings the model's files publish.
    pub sampling: ModelSampling,
}

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
