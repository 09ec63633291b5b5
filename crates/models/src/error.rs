//! The one error type of the models crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("cannot read model file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid GGUF file: {reason}")]
    BadGguf { path: PathBuf, reason: String },
    #[error("unsupported architecture '{0}' (supported: llama, qwen2, gemma3)")]
    UnknownArchitecture(String),
    #[error("tensor '{name}' uses quantization type {dtype}, which is not supported")]
    UnsupportedQuant { name: String, dtype: String },
    #[error("model is missing tensor '{0}'")]
    MissingTensor(String),
    #[error("model metadata is missing '{0}'")]
    MissingMetadata(String),
    #[error("invalid model config: {0}")]
    BadConfig(String),
    #[error("prompt and generation need {needed} positions but the context holds {limit}")]
    ContextExceeded { needed: usize, limit: usize },
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;
