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
    #[error("{path} uses quantization type {} (ggml type {code}), which is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K)", ggml_type_name(*.code))]
    UnsupportedQuant { path: PathBuf, code: u32 },
    #[error("model is missing tensor '{0}'")]
    MissingTensor(String),
    #[error("model metadata is missing '{0}'")]
    MissingMetadata(String),
    #[error("invalid model config: {0}")]
    BadConfig(String),
    #[error("prompt and generation need {needed} positions but the context holds {limit}")]
    ContextExceeded { needed: usize, limit: usize },
    #[error("tensor computation failed: {}", first_line(.0))]
    Candle(#[from] candle_core::Error),
    /// A model step on a GPU failed (the GPU crate's error, as text: this crate does not
    /// depend on it).
    #[error("GPU: {0}")]
    Gpu(String),
}

/// candle appends a backtrace to its messages when RUST_BACKTRACE is set; users get one line.
pub(crate) fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// Names of the ggml types candle cannot run, for error messages.
fn ggml_type_name(code: u32) -> &'static str {
    match code {
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;
