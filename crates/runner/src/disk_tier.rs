//! The prefix cache's disk tier: snapshots that outlive the process. Each snapshot the memory
//! tier keeps is also written, whole, to `<dir>/<model fingerprint>/<name>.snap`, where the name
//! hashes the prompt prefix and its chunking key; after a restart a prompt whose prefix is on
//! disk loads it back instead of prefilling it.
//!
//! A file is trusted only after it proves itself: magic and version, a length that matches its
//! header, a trailing sha256 over everything before it, and a header that names the same model,
//! build, KV cache type, block layout, tokens and key as the lookup. Anything else is logged, deleted and
//! treated as a miss, so a bad file costs one prefill, never wrong output.
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
//! prompt reads the very bits it wrote. The KV type is also in the file name: servers run with
//! different types share the model's folder without replacing each other's files.
//!
//! Writes happen on one background thread, so the engine never waits on the disk: it writes
//! `<name>.tmp`, syncs it and renames it, so a crash never leaves a partial file under a real
//! name. Loads happen on the engine thread, when a prompt is admitted. One server at a time
//! should use a folder: opening it removes `.tmp` leftovers.

use std::fs;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"SPNDSNAP";
const VERSION: u32 = 2;
const DIGEST: usize = 32;
const SNAPSHOT_EXT: &str = "snap";
const TMP_EXT: &str = "tmp";
/// Snapshot bytes waiting for the writer beyond which new saves are dropped: a slow disk must
/// not make copies of the KV pile up in memory.
const MAX_PENDING_BYTES: usize = 512 << 20;
/// How often a waiting writer looks whether the engine went idle.
const IDLE_POLL: Duration = Duration::from_millis(5);

/// Where the disk tier lives and how large it may grow.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// Root folder; each model gets a subfolder named by its fingerprint.
    pub dir: PathBuf,
    /// Bytes of snapshot files kept per model; the least recently used go first.
    pub bytes: usize,
}

/// What every file of one directory must agree on besides its tokens and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// [`crate::ModelBundle::fingerprint`]: also stored in each file, so a file moved between
    /// model folders is still refused.
    pub fingerprint: String,
    /// [`build_id`]: another build of spindle may round differently, and a resumed prompt must
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
    fn payload_bytes(&self) -> usize {
        let blocks: usize = self.blocks.iter().map(Vec::len).sum();
        blocks
            + 4 * (self.recurrent.len()
                + self.logits.as_ref().map_or(0, Vec::len)
                + self.tokens.len())
    }
}

/// A model's folder of snapshot files, and the thread that writes them.
pub(crate) struct DiskTier {
    dir: PathBuf,
    layout: Layout,
    pending: Arc<AtomicUsize>,
    /// Set while the engine runs sequences: the writer waits (see [`DiskTier::set_busy`]).
    busy: Arc<AtomicBool>,
    /// `None` only while dropping: closing the channel ends the writer.
    jobs: Option<mpsc::Sender<StoredSnapshot>>,
    writer: Option<JoinHandle<()>>,
}

impl DiskTier {
    /// Opens (creating it) `<root>/<fingerprint>/` and starts its writer thread.
    pub fn open(config: &DiskConfig, layout: Layout) -> io::Result<Self> {
        let dir = config.dir.join(&layout.fingerprint);
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == TMP_EXT) {
                // Left by a crash mid-write: never renamed, so never trusted, only in the way.
                let _ = fs::remove_file(&path);
            }
        }
        let (jobs, inbox) = mpsc::channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let busy = Arc::new(AtomicBool::new(false));
        let writer = Writer {
            dir: dir.clone(),
            layout: layout.clone(),
            cap: config.bytes,
            pending: pending.clone(),
            busy: busy.clone(),
        };
        let writer = std::thread::Builder::new()
            .name("spindle-disk-cache".into())
            .spawn(move || writer.run(inbox));
        let writer = writer?;
        Ok(Self { dir, layout, pending, busy, jobs: Some(jobs), writer: Some(writer) })
    }

    /// While busy, queued snapshots wait: encoding and writing tens of megabytes beside a
    /// batch took its memory bandwidth and cores (a burst of 8 decoded at 100 instead of 62 ms
    /// a step). An agent's turn leaves gaps between calls; a full queue drops new snapshots.
    pub fn set_busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::Release);
    }

    /// Queues `snapshot` for writing and returns at once; dropped when the writer is too far
    /// behind (the memory tier still has it).
    pub fn save(&self, snapshot: StoredSnapshot) {
        let bytes = snapshot.payload_bytes();
        let fits = |pending: usize| {
            (pending == 0 || pending + bytes <= MAX_PENDING_BYTES).then_some(pending + bytes)
        };
        let accepted = self.pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, fits).is_ok();
        if !accepted {
            tracing::debug!(
                tokens = snapshot.tokens.len(),
                "the disk cache writer is behind; a snapshot is not written"
            );
            return;
        }
        if let Some(jobs) = &self.jobs {
            // Only fails once the writer has died, which it logged.
            let _ = jobs.send(snapshot);
        }
    }

    /// The snapshot saved for exactly `tokens` and `key`, if a sound file holds it. A file that
    /// is corrupt or written for something else is logged and deleted.
    pub fn load(&self, tokens: &[u32], key: u64) -> Option<StoredSnapshot> {
        let path = self.dir.join(file_name(tokens, key, &self.layout.kv_type));
        let mut file = match fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot open a prefix-cache file");
                return None;
            }
        };
        let mut bytes = Vec::new();
        let decoded = match file.read_to_end(&mut bytes) {
            Ok(_) => decode(&bytes, &self.layout).and_then(|s| check_identity(s, tokens, key)),
            Err(e) => Err(Rejected::Unreadable(e)),
        };
        match decoded {
            Ok(snapshot) => {
                // Eviction goes by modification time: a hit makes the file recent again.
                let _ = file.set_modified(SystemTime::now());
                Some(snapshot)
            }
            Err(why) => {
                tracing::warn!(file = %path.display(), %why, "ignoring and deleting a prefix-cache file");
                let _ = fs::remove_file(&path);
                None
            }
        }
    }
}

impl Drop for DiskTier {
    /// Waits for queued snapshots to be written, so a clean shutdown loses none.
    fn drop(&mut self) {
        self.busy.store(false, Ordering::Release);
        self.jobs.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// Why a file was not trusted.
#[derive(Debug, thiserror::Error)]
enum Rejected {
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

/// The file name for a prefix and key; the file's header is checked too, since names collide in
/// principle and files can be copied around.
fn file_name(tokens: &[u32], key: u64, kv_type: &str) -> String {
    let mut hash = Sha256::new();
    for t in tokens {
        hash.update(t.to_le_bytes());
    }
    hash.update(key.to_le_bytes());
    hash.update(kv_type.as_bytes());
    format!("{}.{SNAPSHOT_EXT}", hex(&hash.finalize()))
}

/// Names the running executable by its size and modification time, which change with every
/// rebuild (content hashing would read the whole binary at each start).
pub(crate) fn build_id() -> String {
    let Ok(meta) = std::env::current_exe().and_then(fs::metadata) else { return String::new() };
    let modified = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    format!("{}-{}", meta.len(), modified.map_or(0, |d| d.as_nanos()))
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn encode(layout: &Layout, s: &StoredSnapshot) -> Vec<u8> {
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
fn holds_logits(path: &std::path::Path) -> bool {
    let mut head = Vec::new();
    let read = fs::File::open(path).and_then(|file| file.take(64 << 10).read_to_end(&mut head));
    read.is_ok()
        && Header::read(&mut Cursor { bytes: &head, at: 0 }).is_ok_and(|h| h.logits.is_some())
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
fn decode(bytes: &[u8], layout: &Layout) -> Result<StoredSnapshot, Rejected> {
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

fn check_identity(
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

/// The writer thread's side.
struct Writer {
    dir: PathBuf,
    layout: Layout,
    cap: usize,
    pending: Arc<AtomicUsize>,
    busy: Arc<AtomicBool>,
}

impl Writer {
    fn run(self, inbox: mpsc::Receiver<StoredSnapshot>) {
        yield_to_inference();
        for snapshot in inbox {
            while self.busy.load(Ordering::Acquire) {
                std::thread::sleep(IDLE_POLL);
            }
            if let Err(e) = self.write(&snapshot) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot write a prefix-cache file");
            }
            self.pending.fetch_sub(snapshot.payload_bytes(), Ordering::AcqRel);
        }
    }

    fn write(&self, snapshot: &StoredSnapshot) -> io::Result<()> {
        let path = self.dir.join(file_name(&snapshot.tokens, snapshot.key, &self.layout.kv_type));
        // The same prefix under the same chunking holds the same bits; only logits can be new
        // (the memory tier added them to a snapshot that had none).
        if path.exists() && (snapshot.logits.is_none() || holds_logits(&path)) {
            return Ok(());
        }
        let bytes = encode(&self.layout, snapshot);
        if bytes.len() > self.cap {
            return Ok(());
        }
        let tmp = path.with_extension(TMP_EXT);
        let mut file = fs::File::create(&tmp)?;
        io::Write::write_all(&mut file, &bytes)?;
        // Durable before it gets its real name: a power cut must not leave an empty file there.
        file.sync_data()?;
        fs::rename(&tmp, &path)?;
        self.evict()
    }

    /// Deletes the least recently modified snapshot files until the folder fits the cap.
    fn evict(&self) -> io::Result<()> {
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            // `load` deletes bad files meanwhile; one that vanished simply doesn't count.
            let Ok(meta) = entry.metadata() else { continue };
            if path.extension().is_some_and(|e| e == SNAPSHOT_EXT) {
                files.push((meta.modified()?, path, meta.len()));
            }
        }
        files.sort();
        let mut total: u64 = files.iter().map(|f| f.2).sum();
        for (_, path, len) in files {
            if total <= self.cap as u64 {
                break;
            }
            // Gone already (deleted by `load`) is as good as deleted.
            let _ = fs::remove_file(&path);
            total -= len;
        }
        Ok(())
    }
}

/// Lowers the calling thread's scheduling priority: hashing and writing tens of megabytes per
/// snapshot is background work and should not take a core from the model when cores are few.
fn yield_to_inference() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread (on Linux `setpriority` with who = 0 and
    // PRIO_PROCESS applies to the calling thread only).
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 15);
    }
}

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    fn layout(fingerprint: &str) -> Layout {
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
    fn snapshot(tokens: &[u32], key: u64, seed: f32, logits: bool) -> StoredSnapshot {
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

    fn open(root: &Path, layout: Layout) -> DiskTier {
        DiskTier::open(&DiskConfig { dir: root.to_path_buf(), bytes: 1 << 30 }, layout).unwrap()
    }

    /// Saves `snapshot` and waits until it is written (dropping a tier flushes its writer).
    fn save(root: &Path, snapshot: &StoredSnapshot) -> PathBuf {
        let tier = open(root, layout("m"));
        tier.save(snapshot.clone());
        let path = tier.dir.join(file_name(&snapshot.tokens, snapshot.key, "f16"));
        drop(tier);
        assert!(path.exists());
        path
    }

    fn snapshot_files(dir: &Path) -> usize {
        let paths = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
        paths.filter(|p| p.extension().is_some_and(|x| x == SNAPSHOT_EXT)).count()
    }

    #[test]
    fn a_saved_snapshot_loads_back_bit_for_bit() {
        let root = tempfile::tempdir().unwrap();
        let with_logits = snapshot(&[1, 2, 3, 4, 5, 6], 77, 1.5, true);
        let without = snapshot(&[1, 2, 3], 78, -2.0, false);
        save(root.path(), &with_logits);
        save(root.path(), &without);
        let tier = open(root.path(), layout("m"));
        let loaded = tier.load(&with_logits.tokens, 77).unwrap();
        assert_eq!(loaded, with_logits);
        // -0.0 == 0.0 as floats: compare the bits too.
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(loaded.logits.as_ref().unwrap()),
            bits(with_logits.logits.as_ref().unwrap())
        );
        assert_eq!(tier.load(&without.tokens, 78), Some(without));
        assert_eq!(tier.load(&[1, 2, 3, 4], 77), None, "never saved");
    }

    #[test]
    fn snapshots_wait_while_the_engine_is_busy_and_a_drop_writes_them() {
        let root = tempfile::tempdir().unwrap();
        let (first, second) =
            (snapshot(&[4, 5, 6], 3, 0.5, true), snapshot(&[4, 5], 4, 0.25, false));
        let tier = open(root.path(), layout("m"));
        let path = |s: &StoredSnapshot| tier.dir.join(file_name(&s.tokens, s.key, "f16"));
        tier.set_busy(true);
        tier.save(first.clone());
        std::thread::sleep(Duration::from_millis(200));
        assert!(!path(&first).exists(), "written while busy");
        tier.set_busy(false);
        let written = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            path(&first).exists()
        });
        assert!(written, "not written once idle");
        // Still busy at shutdown: the queue is written anyway.
        tier.set_busy(true);
        tier.save(second.clone());
        let second_path = path(&second);
        drop(tier);
        assert!(second_path.exists());
    }

    #[test]
    fn an_existing_file_is_not_rewritten() {
        let root = tempfile::tempdir().unwrap();
        let first = snapshot(&[9, 8, 7], 1, 1.0, true);
        save(root.path(), &first);
        save(root.path(), &snapshot(&[9, 8, 7], 1, 5.0, true));
        save(root.path(), &snapshot(&[9, 8, 7], 1, 6.0, false));
        assert_eq!(open(root.path(), layout("m")).load(&[9, 8, 7], 1), Some(first));
    }

    #[test]
    fn a_file_without_logits_is_replaced_by_one_with() {
        let root = tempfile::tempdir().unwrap();
        let without = snapshot(&[9, 8, 7], 1, 1.0, false);
        let path = save(root.path(), &without);
        assert!(!holds_logits(&path));
        save(root.path(), &snapshot(&[9, 8, 7], 1, 5.0, false));
        assert_eq!(open(root.path(), layout("m")).load(&[9, 8, 7], 1), Some(without));
        let with = snapshot(&[9, 8, 7], 1, 1.0, true);
        save(root.path(), &with);
        assert!(holds_logits(&path));
        assert_eq!(open(root.path(), layout("m")).load(&[9, 8, 7], 1), Some(with));
        assert_eq!(snapshot_files(path.parent().unwrap()), 1);
    }

    /// Saves a snapshot, spoils its file with `spoil`, and checks that decoding names the
    /// expected reason and that loading ignores and deletes the file.
    fn check_rejected(spoil: impl FnOnce(&mut Vec<u8>), reason: fn(&Rejected) -> bool) {
        let root = tempfile::tempdir().unwrap();
        let s = snapshot(&[5, 6, 7, 8, 9], 3, 0.5, true);
        let path = save(root.path(), &s);
        let mut bytes = fs::read(&path).unwrap();
        spoil(&mut bytes);
        fs::write(&path, &bytes).unwrap();
        let why = decode(&bytes, &layout("m")).unwrap_err();
        assert!(reason(&why), "rejected for another reason: {why}");
        assert_eq!(open(root.path(), layout("m")).load(&s.tokens, 3), None);
        assert!(!path.exists(), "a bad file is deleted");
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

    #[test]
    fn a_file_for_other_tokens_or_another_key_is_rejected() {
        let root = tempfile::tempdir().unwrap();
        let s = snapshot(&[1, 2, 3], 10, 1.0, false);
        let path = save(root.path(), &s);
        let tier = open(root.path(), layout("m"));
        // The file under the name of another prefix, then of another key: the header decides.
        let other_tokens = tier.dir.join(file_name(&[1, 2, 4], 10, "f16"));
        fs::copy(&path, &other_tokens).unwrap();
        assert_eq!(tier.load(&[1, 2, 4], 10), None);
        assert!(!other_tokens.exists());
        let other_key = tier.dir.join(file_name(&[1, 2, 3], 11, "f16"));
        fs::copy(&path, &other_key).unwrap();
        assert_eq!(tier.load(&[1, 2, 3], 11), None);
        assert!(!other_key.exists());
        assert_eq!(tier.load(&[1, 2, 3], 10), Some(s), "the original is untouched");
    }

    #[test]
    fn a_file_from_another_model_build_or_layout_is_rejected() {
        let root = tempfile::tempdir().unwrap();
        let s = snapshot(&[4, 4, 4, 4, 4], 2, 3.0, true);
        let path = save(root.path(), &s);
        let others = [
            Layout { fingerprint: "other".into(), ..layout("m") },
            Layout { build: "other build".into(), ..layout("m") },
            Layout { block_bytes: 7, ..layout("m") },
            Layout { block_size: 8, ..layout("m") },
            Layout { recurrent_floats: 2, ..layout("m") },
        ];
        for other in others {
            // Moved into the folder the other layout reads, under the right name.
            let tier = open(root.path(), other.clone());
            let moved = tier.dir.join(path.file_name().unwrap());
            if moved != path {
                fs::copy(&path, &moved).unwrap();
            }
            assert_eq!(tier.load(&s.tokens, 2), None, "{other:?}");
            assert!(!moved.exists(), "{other:?}");
            if moved == path {
                save(root.path(), &s);
            }
        }
    }

    #[test]
    fn a_file_of_another_kv_type_is_never_read_as_this_one() {
        let root = tempfile::tempdir().unwrap();
        let s = snapshot(&[3, 1, 4, 1], 6, 2.0, true);
        let path = save(root.path(), &s);
        let q8_0 = Layout { kv_type: "q8_0".into(), ..layout("m") };
        let tier = open(root.path(), q8_0);
        // Another name: not found, and the f16 server's file stays.
        assert_eq!(tier.load(&s.tokens, 6), None);
        assert!(path.exists());
        // Under this type's name anyway: the header refuses it.
        let renamed = tier.dir.join(file_name(&s.tokens, 6, "q8_0"));
        fs::copy(&path, &renamed).unwrap();
        let bytes = fs::read(&renamed).unwrap();
        assert!(matches!(decode(&bytes, &tier.layout), Err(Rejected::Mismatch("KV cache type"))));
        assert_eq!(tier.load(&s.tokens, 6), None);
        assert!(!renamed.exists());
        assert_eq!(open(root.path(), layout("m")).load(&s.tokens, 6), Some(s));
    }

    #[test]
    fn a_leftover_tmp_file_is_never_loaded_and_is_cleared() {
        let root = tempfile::tempdir().unwrap();
        let s = snapshot(&[1, 1, 2], 5, 1.0, true);
        let path = save(root.path(), &s);
        let tmp = path.with_extension(TMP_EXT);
        fs::rename(&path, &tmp).unwrap();
        let tier = open(root.path(), layout("m"));
        assert!(!tmp.exists(), "opening clears what a crash left");
        assert_eq!(tier.load(&s.tokens, 5), None);
    }

    #[test]
    fn the_size_cap_deletes_the_least_recently_used_files() {
        let root = tempfile::tempdir().unwrap();
        let snaps: Vec<_> =
            (0..4).map(|i| snapshot(&[i, i + 1, i + 2], 0, i as f32, true)).collect();
        let file_bytes = encode(&layout("m"), &snaps[0]).len();
        let config =
            DiskConfig { dir: root.path().to_path_buf(), bytes: 2 * file_bytes + file_bytes / 2 };
        let now = SystemTime::now();
        let age = |path: &Path, seconds: u64| {
            let file = fs::File::options().write(true).open(path).unwrap();
            file.set_modified(now - Duration::from_secs(seconds)).unwrap();
        };
        let save = |s: &StoredSnapshot| {
            // Dropping the tier waits for its writer.
            DiskTier::open(&config, layout("m")).unwrap().save(s.clone());
        };
        let paths: Vec<PathBuf> = snaps
            .iter()
            .map(|s| root.path().join("m").join(file_name(&s.tokens, s.key, "f16")))
            .collect();
        save(&snaps[0]);
        age(&paths[0], 300);
        save(&snaps[1]);
        age(&paths[1], 200);
        save(&snaps[2]);
        // Three files over a cap of two and a half: the oldest goes.
        assert!(!paths[0].exists() && paths[1].exists() && paths[2].exists());
        age(&paths[2], 100);
        // A hit makes a file recent: the older of the others goes next.
        assert!(DiskTier::open(&config, layout("m")).unwrap().load(&snaps[1].tokens, 0).is_some());
        save(&snaps[3]);
        assert!(paths[1].exists() && !paths[2].exists() && paths[3].exists());
        assert_eq!(snapshot_files(&root.path().join("m")), 2);
    }

    #[test]
    fn a_snapshot_larger_than_the_cap_is_not_written() {
        let root = tempfile::tempdir().unwrap();
        let tier =
            DiskTier::open(&DiskConfig { dir: root.path().to_path_buf(), bytes: 16 }, layout("m"))
                .unwrap();
        tier.save(snapshot(&[1, 2], 0, 1.0, true));
        let dir = tier.dir.clone();
        drop(tier);
        assert_eq!(snapshot_files(&dir), 0);
    }
}
