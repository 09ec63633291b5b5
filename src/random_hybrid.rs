//! The random-weight Qwen3.5-MoE files of the benchmarks (`spindle_models::random_hybrid`),
//! written once under `$SPINDLE_HOME/bench/` with the default model's tokenizer and chat
//! template.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use candle_core::quantized::gguf_file::{self, Value};
use spindle_models::random_hybrid::{write_random_hybrid, HybridShape};

/// The 35B-A3B-shaped file for `blocks` blocks of (3 linear-attention + 1 full-attention) layers.
pub fn path(blocks: usize) -> anyhow::Result<PathBuf> {
    shape_path(&HybridShape::QWEN35_35B_A3B, blocks)
}

/// The file of `shape` with `blocks` blocks, written on first use.
pub fn shape_path(shape: &HybridShape, blocks: usize) -> anyhow::Result<PathBuf> {
    let dir = spindle_hub::spindle_home().join("bench");
    let path = dir.join(shape.file_name(blocks));
    if !path.exists() {
        std::fs::create_dir_all(&dir)?;
        let tokenizer = default_model_tokenizer()?;
        eprintln!("writing {} (once)…", path.display());
        let partial = path.with_extension("partial");
        let mut file = std::fs::File::create(&partial)
            .with_context(|| format!("cannot create {}", partial.display()))?;
        write_random_hybrid(&mut file, shape, blocks, tokenizer)?;
        std::fs::rename(&partial, &path)?;
    }
    Ok(path)
}

/// The `tokenizer.*` metadata of the default model's GGUF (pulled if missing).
fn default_model_tokenizer() -> anyhow::Result<HashMap<String, Value>> {
    let files = spindle_hub::resolve(
        spindle_hub::DEFAULT_MODEL,
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )?;
    let spindle_hub::ModelFiles::Gguf(source) = files else {
        anyhow::bail!("the default model is not a GGUF file; its tokenizer cannot be copied");
    };
    let mut file = std::fs::File::open(&source)
        .with_context(|| format!("cannot open {}", source.display()))?;
    let content = gguf_file::Content::read(&mut file)?;
    Ok(content.metadata.into_iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect())
}
