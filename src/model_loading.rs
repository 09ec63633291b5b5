//! How a served model is loaded from the command line: its bundle (with `--chat-template`), the
//! context fitted to its training and KV pool, its startup lines, the checks that fail at load
//! rather than per request, and the id clients call it by. `serve` loads the first model with
//! it, the registry every later one.

use std::sync::Arc;

use anyhow::Context;
use spindle_models::KvType;
use spindle_runner::model_sampling::ThinkingMode;
use spindle_runner::{CacheConfig, DraftModel, ModelBundle};
use spindle_server::{LoadedModel, ServerConfig};

use crate::byte_size::human_bytes;
use crate::device_flag::{load_on_gpu, plan_placement};
use crate::kv_memory::KvMemory;
use crate::kv_on_gpu::DeviceRoom;
use crate::placement_flags::placement_line;

/// `sampling defaults: temperature 0.7 (generation_config.json), …`, and the thinking preset's
/// in a line of its own where it differs.
pub fn sampling_summary(config: &ServerConfig, model: &LoadedModel) -> Vec<String> {
    let source = model.model.sampling.source.unwrap_or("model");
    let plain = model.sampling_defaults(&config.sampling, ThinkingMode::NonThinking);
    let thinking = model.sampling_defaults(&config.sampling, ThinkingMode::Thinking);
    let mut lines = vec![format!("sampling defaults: {}", plain.summary(source))];
    if thinking != plain {
        lines.push(format!("sampling defaults when thinking: {}", thinking.summary(source)));
    }
    lines
}

/// Refuses a `--guided-json` schema the model's grammar compiler cannot enforce: it fails at
/// start (or at the model's load), not on every request.
pub fn check_guided_json(config: &ServerConfig, model: &LoadedModel) -> anyhow::Result<()> {
    if let Some(schema) = &config.guided_json {
        let grammars = model.grammars().map_err(anyhow::Error::msg)?;
        grammars
            .compile(spindle_constrain::grammar::json_schema(schema))
            .map_err(|e| anyhow::anyhow!("--guided-json can't be enforced: {e}"))?;
    }
    Ok(())
}

/// What loading a model takes from the command line, for every model served.
#[derive(Clone)]
pub struct Loading {
    /// `--chat-template`: replaces each model's own.
    pub chat_template: Option<std::path::PathBuf>,
    pub kv_memory: KvMemory,
    pub kv_type: KvType,
    /// `--ctx-size`.
    pub ctx_size: Option<usize>,
    /// `--device gpu`: the model's steps run there.
    pub gpu: Option<Arc<spindle_gpu::Gpu>>,
    /// Where on the GPU a hybrid's routed experts go (`--cpu-moe`, `--n-cpu-moe`, `--fit`, …).
    pub placement: spindle_gpu::PlacementRequest,
}

/// A model's context, fitted to its training and the KV pool.
pub struct Fitted {
    pub ctx_size: usize,
    trained: usize,
    kv_tokens: usize,
}

impl Loading {
    /// Loads `files` (with `--chat-template` in place of the model's own), refusing a KV cache
    /// type its attention heads cannot use; on the GPU, with the startup line of a hybrid's
    /// placement.
    pub fn bundle(
        &self,
        files: &spindle_hub::ModelFiles,
    ) -> anyhow::Result<(ModelBundle, Option<String>)> {
        let placement = match &self.gpu {
            Some(gpu) => plan_placement(gpu, files, &self.placement)?,
            None => None,
        };
        let mut bundle = crate::memory::returning_freed_memory(|| match &self.gpu {
            Some(gpu) => {
                ModelBundle::load_with(files, |files| load_on_gpu(gpu, files, placement.as_ref()))
            }
            None => ModelBundle::load(files),
        })?;
        if let Some(path) = &self.chat_template {
            let source = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            bundle.template = spindle_chat::ChatTemplate::new(
                &source,
                bundle.tokenizer.bos_token(),
                bundle.tokenizer.eos_token(),
            )?;
        }
        let head_dims =
            bundle.model.kv_shapes().iter().flatten().map(|s| s.head_dim).collect::<Vec<_>>();
        if let Some(d) = head_dims.into_iter().find(|&d| !self.kv_type.fits(d)) {
            anyhow::bail!(
                "--kv-cache-type {} needs attention heads a multiple of 32 wide; this model's are {d}",
                self.kv_type
            );
        }
        let line = placement.map(|p| placement_line(&p));
        Ok((bundle, line))
    }

    /// With `--device gpu` and `--kv-cache-memory auto`, the KV pool for the model of `files`
    /// as [`DeviceRoom`] sizes it on the device (no more than `cache` holds already), in
    /// `cache` and the placement request.
    pub fn size_kv_on_gpu(
        &mut self,
        files: &spindle_hub::ModelFiles,
        cache: &mut CacheConfig,
    ) -> anyhow::Result<()> {
        let (Some(gpu), KvMemory::Auto) = (&self.gpu, self.kv_memory) else { return Ok(()) };
        let room = DeviceRoom::of(gpu, files, &self.placement)?;
        cache.kv_bytes = room.auto_bytes().min(cache.kv_bytes);
        self.placement.kv_bytes = cache.kv_bytes as u64;
        Ok(())
    }

    /// With `--device gpu`, refuses a pool (`cache`, every share taken from it) whose layers
    /// the device cannot bind (see [`crate::kv_on_gpu::check_binds`]).
    pub fn check_kv_binds(&self, bundle: &ModelBundle, cache: &CacheConfig) -> anyhow::Result<()> {
        let Some(gpu) = &self.gpu else { return Ok(()) };
        let given = match self.kv_memory {
            KvMemory::Bytes(bytes) => bytes,
            KvMemory::Auto => cache.kv_bytes,
        };
        crate::kv_on_gpu::check_binds(gpu, bundle, cache, given)
    }

    /// The context: `--ctx-size`, else what the model was trained for, capped by what the KV
    /// pool holds.
    pub fn fit(&self, bundle: &ModelBundle, cache: &CacheConfig) -> Fitted {
        let trained = bundle.model.config().max_position_embeddings;
        let kv_tokens = cache.kv_tokens(bundle);
        Fitted { ctx_size: self.ctx_size.unwrap_or(trained.min(kv_tokens)), trained, kv_tokens }
    }

    /// The startup line of model `id`; warns when `--ctx-size` is more than the pool holds.
    pub fn summary(
        &self,
        id: &str,
        fitted: &Fitted,
        bundle: &ModelBundle,
        cache: &CacheConfig,
    ) -> String {
        let (ctx_size, trained, kv_tokens) = (fitted.ctx_size, fitted.trained, fitted.kv_tokens);
        let auto = if self.kv_memory == KvMemory::Auto { " (auto)" } else { "" };
        if ctx_size > kv_tokens {
            tracing::warn!("--ctx-size {ctx_size} is more than the KV cache holds ({kv_tokens}); raise --kv-cache-memory");
        }
        format!(
            "model {id} ({:?}): context {ctx_size} tokens (trained for {trained}); KV cache {} of {} holds {kv_tokens} tokens, {:.1} KiB per token",
            bundle.model.config().architecture,
            human_bytes(cache.kv_bytes) + auto,
            cache.kv_type,
            cache.block_bytes(bundle) as f64 / cache.block_size as f64 / 1024.0,
        )
    }
}

/// Loads `--draft-model spec` (resolved as `--model` is) to draft for `target`, served as
/// `target_id`, and gives it its share of `cache`'s KV memory.
pub fn load_draft(
    spec: &str,
    target: &ModelBundle,
    target_id: &str,
    cache: &mut CacheConfig,
) -> anyhow::Result<DraftModel> {
    let home = spindle_hub::spindle_home();
    let files = spindle_hub::resolve(spec, &home, spindle_hub::WhenMissing::Download)?;
    let load = || DraftModel::load(&files, &model_id(spec), target, target_id);
    let draft = crate::memory::returning_freed_memory(load)?;
    draft.share_kv_memory(cache, target)?;
    Ok(draft)
}

/// The name clients use: the catalogue name, or a path's file or folder name, or a hub id's
/// last part. Never with a `/`: agents' model settings reject one.
pub fn model_id(spec: &str) -> String {
    let path = std::path::Path::new(spec);
    if path.exists() {
        if let Some(name) = path.file_stem().and_then(|n| n.to_str()) {
            return name.to_string();
        }
    }
    spec.trim_end_matches('/').rsplit('/').next().unwrap_or(spec).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn model_ids_have_no_slash() {
        assert_eq!(
            super::model_id("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"),
            "Qwen2.5-Coder-0.5B-Instruct-GGUF"
        );
        assert_eq!(super::model_id("smollm2-135m"), "smollm2-135m");
    }
}
