//! One loaded model as the handlers use it: its name, its text side (tokenizer, template, chat
//! profile), its limits, its engine, and the grammar compiler for its vocabulary. Each loaded
//! model has its own engine thread, KV pool and prefix cache; the model registry decides which
//! are loaded.

use std::sync::{Arc, OnceLock};

use spindle_chat::{ChatError, ChatTemplate, ModelProfile, Tokenizer, ToolCallFormat};
use spindle_constrain::Grammars;
use spindle_runner::model_sampling::{ModelSampling, SamplingPreset, ThinkingMode};
use spindle_runner::{CacheConfig, Engine, EngineConfig, ModelBundle};

use crate::config::ServerConfig;
use crate::engine::GenerationEngine;
use crate::model_registry::Lease;
use crate::sampling_defaults::SamplingDefaults;

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

impl ServedModel {
    /// What the server keeps of `bundle`, whose engine has `cache`.
    pub fn of(bundle: &ModelBundle, cache: &CacheConfig) -> Self {
        Self {
            tokenizer: bundle.tokenizer.clone(),
            template: bundle.template.clone(),
            max_positions: bundle.model.config().max_position_embeddings,
            kv_tokens: cache.kv_tokens(bundle),
            sampling: bundle.sampling.clone(),
        }
    }
}

/// A model ready to serve.
pub struct LoadedModel {
    /// The name clients use in `model`.
    pub id: String,
    /// Positions per sequence (prompt + completion).
    pub ctx_size: usize,
    pub model: ServedModel,
    /// Read off the template and tokenizer at load, so no request searches or probes them.
    pub profile: ModelProfile,
    pub engine: Arc<dyn GenerationEngine>,
    /// Built on the first constrained request: a large vocabulary takes a moment.
    grammars: OnceLock<Result<Grammars, String>>,
}

/// A loaded model held by one request: it is not unloaded while the lease lives.
pub type ModelLease = Lease<LoadedModel>;

impl LoadedModel {
    /// `model` served by `engine`. Fails only where the tokenizer cannot encode the reasoning
    /// block's closing tag.
    pub fn new(
        id: String,
        ctx_size: usize,
        model: ServedModel,
        engine: Arc<dyn GenerationEngine>,
        tool_call_parser: Option<ToolCallFormat>,
    ) -> Result<Self, ChatError> {
        let profile = ModelProfile::new(&model.template, &model.tokenizer, tool_call_parser)?;
        Ok(Self::with_profile(id, ctx_size, model, profile, engine))
    }

    /// Starts an engine thread for `bundle` with `config`'s limits and caches. The profile is
    /// checked before the engine starts: a model the server cannot serve loads no KV pool.
    pub fn start(
        id: String,
        ctx_size: usize,
        config: &ServerConfig,
        bundle: ModelBundle,
    ) -> Result<Self, ChatError> {
        let model = ServedModel::of(&bundle, &config.cache);
        let profile =
            ModelProfile::new(&model.template, &model.tokenizer, config.tool_call_parser)?;
        let mut cache = config.cache.clone();
        // Each model's blocks under its own topic, as llm-d tells models apart.
        cache.events = cache.events.map(|events| events.for_model(&id));
        let engine_config = EngineConfig {
            orphan_prefill_tokens: config.orphan_prefill_tokens,
            speculation: config.speculation.clone(),
            ..EngineConfig::new(config.max_concurrent, cache)
        };
        let engine = Arc::new(Engine::start(Arc::new(bundle), engine_config));
        Ok(Self::with_profile(id, ctx_size, model, profile, engine))
    }

    fn with_profile(
        id: String,
        ctx_size: usize,
        model: ServedModel,
        profile: ModelProfile,
        engine: Arc<dyn GenerationEngine>,
    ) -> Self {
        let caps = profile.capabilities;
        tracing::info!(
            model = %id,
            reasoning = ?profile.reasoning.as_ref().map(|r| format!("{}…{}", r.open, r.close)),
            tool_calls = profile.tool_call_format.name(),
            template_tools = caps.tools,
            template_system_role = caps.system_role,
            template_thinking_toggle = caps.thinking_toggle,
            "chat profile"
        );
        Self { id, ctx_size, model, profile, engine, grammars: OnceLock::new() }
    }

    /// What a request answered in `mode` gets for each sampling parameter it leaves out, under
    /// the server's `flags`.
    pub fn sampling_defaults(
        &self,
        flags: &SamplingPreset,
        mode: ThinkingMode,
    ) -> SamplingDefaults {
        SamplingDefaults::resolve(flags, &self.model.sampling, mode)
    }

    /// The grammar compiler for the model's vocabulary.
    pub fn grammars(&self) -> Result<&Grammars, String> {
        let grammars = self
            .grammars
            .get_or_init(|| Grammars::new(&self.model.tokenizer).map_err(|e| e.to_string()));
        grammars.as_ref().map_err(Clone::clone)
    }
}
