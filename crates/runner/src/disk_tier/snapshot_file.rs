//! The file format of the disk tier's snapshots: encoding, and decoding that trusts a file only
//! after it proves itself: magic and version, a length that matches its header, a trailing
//! sha256 over everything before it, and a header that names the same model, build, KV cache
//! type, block layout, tokens and key as the lookup.
//!
//! File layout (little-endian):
//!
//! ```text
//! magic "SPNDSNAP" | version u32 | fingerprint: len u32, bytes | build: len u32, bytes |
//! KV type: len u32, bytes | key u64 | block_size u64 | block_bytes u64 | recurrent_floats u64 |
//! tokens u64 | logits u64 (u64::MAX: none) | tokens × u32 | blocks × block_bytes |
//! recurrent_floats × f32 | logits × f32 | sha256 of all the above
//! ```
//!
//! Blocks are kept as the KV cache stores them (f32, f16, bf16 or q8_0 bytes), so a resumed
//! prompt reads the very bits it wrote.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"SPNDSNAP";
const VERSION: u32 = 2;
pub(crate) const DIGEST: usize = 32;

/// What every file of one directory must agree on besides its tokens and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// [`crate::ModelBundle::fingerprint`]: also stored in each file, so a file moved between
    /// model folders is still refused.
    pub fingerprint: String,
    /// `disk_tier::build_id`: another build of spindle may round differently, and a resumed prompt must
    /// give the bits a cold run of this build gives.
    pub build: String,
    /// `KvType::name` of the blocks.
    pub kv_type: String,
    pub block_size: usize,
    /// `PagedKv::bytes_per_block`.
    pub block_bytes: usize,
    /// Numbers in the model's recurrent state (0 for attention-only models).
    pub recurrent_floats: usize,
}

/// A snapshot in transferable form: the KV blocks of positions `0..tokens.len()` (the last
/// may be partly filled) and the state after them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StoredSnapshot {
    pub tokens: Vec<u32>,
    /// The chunking key ([`spindle_sched::PrefillPlan::key`]) at `tokens.len()`.
    pub key: u64,
    /// `PagedKv::read_block` of each block, in order.
    pub blocks: Vec<Vec<u8>>,
    /// `RecurrentState::to_floats`.
    pub recurrent: Vec<f32>,
    /// The logits after the last token, when the snapshot ends a prompt.
    pub logits: Option<Vec<f32>>,
}

impl StoredSnapshot {
    pub(crate) fn payload_bytes(&self) -> usize {
        let blocks: usize = self.blocks.iter().map(Vec::len).sum();
        blocks
            + 4 * (self.recurrent.len()
                + self.logits.as_ref().map_or(0, Vec::len)
                + self.tokens.len())
    }
}

/// Why a file was not trusted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Rejected {
    #[error("cannot read it: {0}")]
    Unreadable(io::Error),
    #[error("not a snapshot file (bad magic)")]
    Magic,
    #[error("format version {0}, expected {VERSION}")]
    Version(u32),
    #[error("truncated: {actual} bytes where the header promises {expected}")]
    Truncated { actual: usize, expected: usize },
    #[error("{0} bytes after the end")]
    Trailing(usize),
    #[error("checksum mismatch")]
    Checksum,
    #[error("written for another {0}")]
    Mismatch(&'static str),
}

/// The file's bytes for `s`, written under `layout`.
pub(crate) fn encode(layout: &Layout, s: &StoredSnapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + s.payload_bytes() + DIGEST);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    for text in [&layout.fingerprint, &layout.build, &layout.kv_type] {
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    debug_assert!(s.blocks.iter().all(|b| b.len() == layout.block_bytes));
    out.extend_from_slice(&s.key.to_le_bytes());
    let logits = s.logits.as_ref().map_or(usize::MAX, Vec::len);
    for size in [layout.block_size, layout.block_bytes, s.recurrent.len(), s.tokens.len(), logits] {
        out.extend_from_slice(&(size as u64).to_le_bytes());
    }
    for t in &s.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for block in &s.blocks {
        out.extend_from_slice(block);
    }
    for floats in [s.recurrent.as_slice(), s.logits.as_deref().unwrap_or(&[])] {
        for f in floats {
            out.extend_from_slice(&f.to_le_bytes());
        }
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

/// Whether the snapshot file at `path` has logits, by its header alone (false when that cannot
/// be read: the file is better replaced).
pub(crate) fn holds_logits(path: &Path) -> bool {
    let mut head = Vec::new();
    let read = fs::File::open(path).and_then(|file| file.take(64 << 10).read_to_end(&mut head));
    read.is_ok()
        && Header::read(&mut Cursor { bytes: &head, at: 0 }).is_ok_and(|h| h.logits.is_some())
}

/// The tokens of the snapshot `path` holds, read from its header alone (not checksummed: the
/// caller only announces them, and a bad file is still refused when it is loaded); `None`
/// when the file is unreadable or was written for another layout.
pub(crate) fn read_tokens(path: &Path, layout: &Layout) -> Option<Vec<u32>> {
    let mut file = fs::File::open(path).ok()?;
    let mut head = Vec::new();
    (&mut file).take(64 << 10).read_to_end(&mut head).ok()?;
    let mut c = Cursor { bytes: &head, at: 0 };
    let header = Header::read(&mut c).ok()?;
    header.check(layout).ok()?;
    let (start, tokens) = (c.at, header.tokens);
    let end = start.checked_add(tokens.checked_mul(4)?)?;
    if end > head.len() {
        file.take((end - head.len()) as u64).read_to_end(&mut head).ok()?;
    }
    let bytes = head.get(start..end)?;
    Some(
        bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect(),
    )
}

/// Reads a file's fields in order; running out of bytes means the file was cut short.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Rejected> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or(Rejected::Truncated {
            actual: self.bytes.len(),
            expected: self.at.saturating_add(n),
        })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, Rejected> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, Rejected> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, Rejected> {
        Ok(self
            .take(n * 4)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    }
}

/// The fields before the payload, sizes in numbers of items.
struct Header<'a> {
    fingerprint: &'a [u8],
    build: &'a [u8],
    kv_type: &'a [u8],
    key: u64,
    block_size: usize,
    block_bytes: usize,
    recurrent_floats: usize,
    tokens: usize,
    logits: Option<usize>,
}

impl<'a> Header<'a> {
    fn read(c: &mut Cursor<'a>) -> Result<Self, Rejected> {
        if c.take(MAGIC.len()).map_err(|_| Rejected::Magic)? != MAGIC {
            return Err(Rejected::Magic);
        }
        let version = c.u32()?;
        if version != VERSION {
            return Err(Rejected::Version(version));
        }
        let fingerprint_len = c.u32()? as usize;
        let fingerprint = c.take(fingerprint_len)?;
        let build_len = c.u32()? as usize;
        let build = c.take(build_len)?;
        let kv_type_len = c.u32()? as usize;
        let kv_type = c.take(kv_type_len)?;
        let key = c.u64()?;
        let mut size = || c.u64().map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let (block_size, block_bytes, recurrent_floats, tokens, logits) =
            (size()?, size()?, size()?, size()?, size()?);
        let logits = (logits != usize::MAX).then_some(logits);
        Ok(Self {
            fingerprint,
            build,
            kv_type,
            key,
            block_size,
            block_bytes,
            recurrent_floats,
            tokens,
            logits,
        })
    }

    fn blocks(&self) -> usize {
        self.tokens.div_ceil(self.block_size.max(1))
    }

    /// Bytes of the payload this header announces (`usize::MAX` when that overflows).
    fn payload_bytes(&self) -> usize {
        let blocks = self.blocks().checked_mul(self.block_bytes);
        let words = [self.recurrent_floats, self.logits.unwrap_or(0), self.tokens]
            .into_iter()
            .try_fold(0, usize::checked_add);
        words
            .and_then(|w| w.checked_mul(4))
            .zip(blocks)
            .and_then(|(w, b)| w.checked_add(b))
            .unwrap_or(usize::MAX)
    }

    fn check(&self, layout: &Layout) -> Result<(), Rejected> {
        let checks = [
            (self.fingerprint == layout.fingerprint.as_bytes(), "model"),
            (self.build == layout.build.as_bytes(), "build of spindle"),
            (self.kv_type == layout.kv_type.as_bytes(), "KV cache type"),
            (self.block_size == layout.block_size, "block size"),
            (self.block_bytes == layout.block_bytes, "KV layout"),
            (self.recurrent_floats == layout.recurrent_floats, "recurrent state layout"),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, what)) => Err(Rejected::Mismatch(what)),
            None => Ok(()),
        }
    }
}

/// Parses a whole file, trusting its sizes only once they match its length and its checksum
/// matches its contents.
pub(crate) fn decode(bytes: &[u8], layout: &Layout) -> Result<StoredSnapshot, Rejected> {
    let mut c = Cursor { bytes, at: 0 };
    let header = Header::read(&mut c)?;
    let expected = header.payload_bytes().saturating_add(c.at + DIGEST);
    match bytes.len() {
        actual if actual < expected => return Err(Rejected::Truncated { actual, expected }),
        actual if actual > expected => return Err(Rejected::Trailing(actual - expected)),
        _ => {}
    }
    let (body, digest) = bytes.split_at(expected - DIGEST);
    if Sha256::digest(body).as_slice() != digest {
        return Err(Rejected::Checksum);
    }
    header.check(layout)?;
    let tokens = c
        .take(header.tokens * 4)?
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    let tokens = tokens.collect();
    let blocks = (0..header.blocks())
        .map(|_| c.take(header.block_bytes).map(<[u8]>::to_vec))
        .collect::<Result<_, _>>()?;
    let recurrent = c.f32s(header.recurrent_floats)?;
    let logits = header.logits.map(|n| c.f32s(n)).transpose()?;
    Ok(StoredSnapshot { tokens, key: header.key, blocks, recurrent, logits })
}

/// `snapshot`, if it is the one saved for `tokens` and `key`.
pub(crate) fn check_identity(
    snapshot: StoredSnapshot,
    tokens: &[u32],
    key: u64,
) -> Result<StoredSnapshot, Rejected> {
    if snapshot.tokens != tokens {
        return Err(Rejected::Mismatch("prompt"));
    }
    if snapshot.key != key {
        return Err(Rejected::Mismatch("chunking"));
    }
    Ok(snapshot)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn layout(fingerprint: &str) -> Layout {
        Layout {
            fingerprint: fingerprint.into(),
            build: "test".into(),
            kv_type: "f16".into(),
            block_size: 4,
            block_bytes: 6,
            recurrent_floats: 3,
        }
    }

    /// A snapshot of `tokens` whose numbers all derive from `seed`.
    pub fn snapshot(tokens: &[u32], key: u64, seed: f32, logits: bool) -> StoredSnapshot {
        let layout = layout("m");
        let blocks = (0..tokens.len().div_ceil(layout.block_size))
            .map(|b| {
                (0..layout.block_bytes).map(|i| (seed * 8.0) as u8 ^ (b * 10 + i) as u8).collect()
            })
            .collect();
        StoredSnapshot {
            tokens: tokens.to_vec(),
            key,
            blocks,
            recurrent: vec![seed, -seed, f32::MIN_POSITIVE],
            logits: logits.then(|| vec![seed * 2.0, f32::NEG_INFINITY, -0.0]),
        }
    }

    /// Encodes a snapshot, spoils its bytes with `spoil`, and checks that decoding refuses them
    /// for the expected reason.
    fn check_rejected(spoil: impl FnOnce(&mut Vec<u8>), reason: fn(&Rejected) -> bool) {
        let mut bytes = encode(&layout("m"), &snapshot(&[5, 6, 7, 8, 9], 3, 0.5, true));
        spoil(&mut bytes);
        let why = decode(&bytes, &layout("m")).unwrap_err();
        assert!(reason(&why), "rejected for another reason: {why}");
    }

    #[test]
    fn a_flipped_byte_is_caught_by_the_checksum() {
        let checksum = |r: &Rejected| matches!(r, Rejected::Checksum);
        check_rejected(
            |b| {
                let middle = b.len() / 2;
                b[middle] ^= 0x10;
            },
            checksum,
        );
        // In the header and in the digest as well.
        check_rejected(|b| b[MAGIC.len() + 4 + 4] ^= 1, checksum);
        check_rejected(|b| *b.last_mut().unwrap() ^= 1, checksum);
    }

    #[test]
    fn truncated_and_overlong_files_are_rejected() {
        let truncated = |r: &Rejected| matches!(r, Rejected::Truncated { .. });
        check_rejected(|b| b.truncate(b.len() - 1), truncated);
        check_rejected(|b| b.truncate(b.len() / 2), truncated);
        check_rejected(|b| b.truncate(20), truncated);
        check_rejected(|b| b.truncate(5), |r| matches!(r, Rejected::Magic));
        check_rejected(Vec::clear, |r| matches!(r, Rejected::Magic));
        check_rejected(|b| b.push(0), |r| matches!(r, Rejected::Trailing(1)));
    }

    #[test]
    fn a_wrong_magic_or_version_is_rejected() {
        check_rejected(|b| b[0] = b'X', |r| matches!(r, Rejected::Magic));
        check_rejected(|b| b[MAGIC.len()] = 1, |r| matches!(r, Rejected::Version(1)));
    }
}
