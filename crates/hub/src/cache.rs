//! The on-disk cache: `<home>/models/<name>/<file>`, plus a `<file>.sha256-ok` marker written once
//! the file's sha256 matched the catalogue, so later starts skip rehashing hundreds of MB.
//!
//! The marker holds the hash and the file size; it only counts while both still match, so a
//! truncated or replaced file is hashed again. Files are moved into place by rename only after
//! their hash was checked, so a half-written file never sits under the final name.

use std::fs;
use std::path::{Path, PathBuf};

use tracing::info;

use crate::catalogue::CatalogueEntry;
use crate::digest::sha256_file;
use crate::error::HubError;

/// What the cache holds for a catalogue entry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cached {
    Missing,
    Verified(PathBuf),
    /// The file is there but its sha256 is `actual`, not the pinned one.
    Corrupt {
        path: PathBuf,
        actual: String,
    },
}

/// `<home>/models/<name>`.
pub(crate) fn model_dir(home: &Path, entry: &CatalogueEntry) -> PathBuf {
    home.join("models").join(entry.name)
}

/// `<home>/models/<name>/<file>`.
pub(crate) fn model_path(home: &Path, entry: &CatalogueEntry) -> PathBuf {
    model_dir(home, entry).join(entry.file)
}

/// A sibling of the model file with `suffix` appended to its name.
pub(crate) fn sibling(home: &Path, entry: &CatalogueEntry, suffix: &str) -> PathBuf {
    model_dir(home, entry).join(format!("{}{suffix}", entry.file))
}

fn marker_path(home: &Path, entry: &CatalogueEntry) -> PathBuf {
    sibling(home, entry, ".sha256-ok")
}

fn marker_text(sha256: &str, size: u64) -> String {
    format!("{sha256} {size}\n")
}

/// Looks the entry up in the cache, hashing the file only if no valid marker vouches for it.
pub(crate) fn check(home: &Path, entry: &CatalogueEntry) -> Result<Cached, HubError> {
    let path = model_path(home, entry);
    let Ok(meta) = fs::metadata(&path) else {
        return Ok(Cached::Missing);
    };
    let marker = marker_path(home, entry);
    if fs::read_to_string(&marker).is_ok_and(|m| m == marker_text(entry.sha256, meta.len())) {
        return Ok(Cached::Verified(path));
    }
    info!("verifying sha256 of {}", path.display());
    let actual = sha256_file(&path)?;
    if actual != entry.sha256 {
        return Ok(Cached::Corrupt { path, actual });
    }
    write_marker(home, entry, meta.len())?;
    Ok(Cached::Verified(path))
}

/// Checks `digest` (the sha256 of `tmp`, computed while writing it) against the catalogue and
/// moves `tmp` into place; a mismatching `tmp` is deleted. `what` names the source in errors.
pub(crate) fn install(
    home: &Path,
    entry: &CatalogueEntry,
    tmp: &Path,
    digest: String,
    what: &str,
) -> Result<PathBuf, HubError> {
    if digest != entry.sha256 {
        fs::remove_file(tmp).map_err(HubError::io(tmp))?;
        return Err(HubError::ChecksumMismatch {
            what: what.to_string(),
            expected: entry.sha256.to_string(),
            actual: digest,
        });
    }
    let path = model_path(home, entry);
    fs::rename(tmp, &path).map_err(HubError::io(&path))?;
    let size = fs::metadata(&path).map_err(HubError::io(&path))?.len();
    write_marker(home, entry, size)?;
    info!("{} ready at {}", entry.name, path.display());
    Ok(path)
}

/// Deletes a model file that failed verification, and its marker.
pub(crate) fn evict(home: &Path, entry: &CatalogueEntry) -> Result<(), HubError> {
    for path in [model_path(home, entry), marker_path(home, entry)] {
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(HubError::io(path)(e))
            }
            _ => {}
        }
    }
    Ok(())
}

fn write_marker(home: &Path, entry: &CatalogueEntry, size: u64) -> Result<(), HubError> {
    let marker = marker_path(home, entry);
    fs::write(&marker, marker_text(entry.sha256, size)).map_err(HubError::io(marker))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{fake_entry, sha256_hex};

    #[test]
    fn marker_skips_rehash_until_the_file_changes() {
        let home = tempfile::tempdir().unwrap();
        let entry = fake_entry("m", "m.gguf", &sha256_hex(b"weights"), &[("p", "m")]);
        assert_eq!(check(home.path(), entry).unwrap(), Cached::Missing);

        fs::create_dir_all(model_dir(home.path(), entry)).unwrap();
        let path = model_path(home.path(), entry);
        fs::write(&path, b"weights").unwrap();
        assert_eq!(check(home.path(), entry).unwrap(), Cached::Verified(path.clone()));
        let marker = fs::read_to_string(marker_path(home.path(), entry)).unwrap();
        assert_eq!(marker, format!("{} 7\n", entry.sha256));

        fs::write(&path, b"weights, truncated?").unwrap();
        let actual = sha256_hex(b"weights, truncated?");
        assert_eq!(check(home.path(), entry).unwrap(), Cached::Corrupt { path, actual });
    }
}
