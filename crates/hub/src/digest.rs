//! sha256 helpers: hashing a file on disk, and a writer that hashes what passes through it so a
//! download or an assembly is hashed while it is written, without a second read.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::HubError;

/// Lowercase hex sha256 of a whole file, read in a streaming fashion.
pub(crate) fn sha256_file(path: &Path) -> Result<String, HubError> {
    let mut file = File::open(path).map_err(HubError::io(path))?;
    let mut hasher = HashingWriter::new(io::sink());
    io::copy(&mut file, &mut hasher).map_err(HubError::io(path))?;
    Ok(hasher.finish().1)
}

/// Passes writes on to `inner` and hashes every byte that was accepted.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self { inner, hasher: Sha256::new() }
    }

    /// Feeds bytes that are already in the destination (a partial file being resumed).
    pub(crate) fn seed(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// Returns the inner writer and the lowercase hex digest of everything written.
    pub(crate) fn finish(self) -> (W, String) {
        (self.inner, hex(&self.hasher.finalize()))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn hashes_written_and_seeded_bytes() {
        let mut w = HashingWriter::new(Vec::new());
        w.seed(b"a");
        w.write_all(b"bc").unwrap();
        let (inner, digest) = w.finish();
        assert_eq!(inner, b"bc");
        assert_eq!(digest, ABC);
    }

    #[test]
    fn hashes_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(sha256_file(&path).unwrap(), ABC);
    }
}
