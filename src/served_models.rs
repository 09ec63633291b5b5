//! `spindle serve` with several models (`--model A --model B`, `--models-dir DIR`): the served
//! list, the memory each takes, and the loader the server's model registry calls on a model's
//! first request (load the files, size the context, start its engine).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use spindle_hub::{ModelFiles, WhenMissing};
use spindle_runner::model_sampling::ModelSampling;
use spindle_runner::share_rollback_memory;
use spindle_server::model_registry::UnloadHook;
use spindle_server::{LoadedModel, Loader, ModelEntry, ModelRegistry, ServerConfig, SystemClock};

use crate::kv_memory::{shared_bytes, KvMemory};
use crate::model_loading::{check_guided_json, model_id, sampling_summary, Loading};

#[derive(Args)]
pub struct ModelsArgs {
    /// Serve every .gguf file and every safetensors folder in this folder, and the catalogue's
    /// models, each loaded on its first request.
    #[arg(long)]
    pub models_dir: Option<PathBuf>,
    /// Memory the loaded models may take together (weights, KV pool and snapshots each), e.g.
    /// 16GiB, or `auto`: 70% of the memory available at start. A load that would not fit
    /// unloads the least recently used idle model first.
    #[arg(long, default_value = "auto", value_parser = str::parse::<KvMemory>)]
    pub models_memory: KvMemory,
    /// Seconds a model may stay idle before it is unloaded; 0: never.
    #[arg(long, default_value_t = 3600)]
    pub model_ttl: u64,
}

/// The models to serve, in order: each `--model`, then what `--models-dir` holds (in name
/// order) and the catalogue; the default model when there is neither.
pub fn specs(models: &[String], dir: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let mut specs = models.to_vec();
    if let Some(dir) = dir {
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read --models-dir {}", dir.display()))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|e| e == "gguf") || p.join("config.json").is_file()
            })
            .collect();
        found.sort();
        specs.extend(found.iter().map(|p| p.display().to_string()));
        specs.extend(spindle_hub::catalogue().iter().map(|e| e.name.to_string()));
    }
    if specs.is_empty() {
        specs.push(spindle_hub::DEFAULT_MODEL.to_string());
    }
    let mut seen = std::collections::HashSet::new();
    specs.retain(|spec| seen.insert(model_id(spec)));
    Ok(specs)
}

/// A registry of `specs` within `budget` bytes: a model counts its weights' files, its KV pool
/// and its snapshot memory; with `--kv-cache-memory auto`, each pool is an even share of what
/// the budget leaves once every model's weights and snapshots are counted, so that all of them
/// can be loaded at once. A catalogue model not cached yet is downloaded at its first load.
pub fn registry(
    specs: &[String],
    config: &ServerConfig,
    loading: Loading,
    budget: u64,
    ttl: Option<Duration>,
) -> anyhow::Result<Arc<ModelRegistry<LoadedModel>>> {
    let home = spindle_hub::spindle_home();
    let mut weights = Vec::new();
    let mut samplings = Vec::new();
    for spec in specs {
        // Catalogue names come before same-named paths, as `spindle_hub::resolve` reads them.
        let listed = spindle_hub::catalogue().iter().find(|e| e.name == spec.as_str());
        let (bytes, files) = match (listed, spindle_hub::resolve(spec, &home, WhenMissing::Refuse))
        {
            // A catalogue model not downloaded yet publishes its settings once loaded.
            (Some(entry), files) => (entry.size, files.ok()),
            (None, files) => {
                let files = files?;
                (weight_bytes(&files)?, Some(files))
            }
        };
        weights.push(bytes);
        samplings.push(match files {
            Some(files) => ModelSampling::read(&files)
                .with_context(|| format!("cannot read the sampling settings of {spec}"))?,
            None => ModelSampling::default(),
        });
    }
    let mut config = config.clone();
    if loading.kv_memory == KvMemory::Auto {
        // Each model's pool sized as if it were alone would fill the budget by itself.
        let share = shared_bytes(budget, &weights, config.cache.snapshot_bytes);
        config.cache.kv_bytes = config.cache.kv_bytes.min(share);
    }
    let pools = (config.cache.kv_bytes + config.cache.snapshot_bytes) as u64;
    let entries = specs
        .iter()
        .zip(&weights)
        .zip(samplings)
        .map(|((spec, weights), sampling)| ModelEntry {
            name: model_id(spec),
            source: spec.clone(),
            bytes: weights + pools,
            sampling,
        })
        .collect();
    let loader: Loader<LoadedModel> = Arc::new(move |entry: &ModelEntry| {
        load(&config, &loading, entry).map_err(|e| format!("{e:#}"))
    });
    let clock = Arc::new(SystemClock::default());
    let unloaded: UnloadHook = Arc::new(crate::memory::return_freed_memory);
    Ok(ModelRegistry::with_unload_hook(entries, budget, ttl, loader, clock, unloaded))
}

/// Loads `entry` and starts its engine; logs its summary as the single model's startup does.
fn load(
    config: &ServerConfig,
    loading: &Loading,
    entry: &ModelEntry,
) -> anyhow::Result<LoadedModel> {
    let home = spindle_hub::spindle_home();
    let files = spindle_hub::resolve(&entry.source, &home, WhenMissing::Download)?;
    let (mut config, mut loading) = (config.clone(), loading.clone());
    loading.size_kv_on_gpu(&files, &mut config.cache)?;
    let (bundle, placement) = loading.bundle(&files)?;
    let (max_active, speculation) = (config.max_concurrent, &config.speculation);
    let rollback = share_rollback_memory(&bundle, &mut config.cache, max_active, speculation);
    loading.check_kv_binds(&bundle, &config.cache)?;
    let fitted = loading.fit(&bundle, &config.cache);
    let summary = loading.summary(&entry.name, &fitted, &bundle, &config.cache);
    let model = LoadedModel::start(entry.name.clone(), fitted.ctx_size, &config, bundle)?;
    check_guided_json(&config, &model)?;
    tracing::info!("{summary}");
    if let Some(placement) = placement {
        tracing::info!("{placement}");
    }
    if let Some(share) = rollback {
        tracing::info!("{}", share.summary(config.speculation.max_draft));
    }
    for line in sampling_summary(&config, &model) {
        tracing::info!("{line}");
    }
    Ok(model)
}

/// Bytes of a model's weight files.
fn weight_bytes(files: &ModelFiles) -> anyhow::Result<u64> {
    let size = |path: &Path| -> anyhow::Result<u64> {
        Ok(std::fs::metadata(path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .len())
    };
    match files {
        ModelFiles::Gguf(path) => size(path),
        ModelFiles::Safetensors { dir } => {
            let mut total = 0;
            for entry in std::fs::read_dir(dir)? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "safetensors") {
                    total += size(&path)?;
                }
            }
            Ok(total)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_models_dir_adds_its_gguf_files_and_model_folders_then_the_catalogue() {
        let dir = tempfile::tempdir().unwrap();
        for file in ["b.gguf", "a.gguf", "notes.txt"] {
            std::fs::write(dir.path().join(file), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("st")).unwrap();
        std::fs::write(dir.path().join("st/config.json"), "{}").unwrap();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        let named = ["smollm2-135m".to_string(), dir.path().join("b.gguf").display().to_string()];
        let specs = specs(&named, Some(dir.path())).unwrap();
        let ids: Vec<String> = specs.iter().map(|s| model_id(s)).collect();
        let mut expected = vec!["smollm2-135m", "b", "a", "st"];
        // The catalogue's other models; SmolLM2 is named already, `b.gguf` found twice.
        expected.extend(
            spindle_hub::catalogue().iter().map(|e| e.name).filter(|n| *n != "smollm2-135m"),
        );
        assert_eq!(ids, expected);
    }

    #[test]
    fn without_models_the_default_one_is_served() {
        assert_eq!(specs(&[], None).unwrap(), [spindle_hub::DEFAULT_MODEL]);
    }
}
