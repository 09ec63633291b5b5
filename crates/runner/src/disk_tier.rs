//! The prefix cache's disk tier: snapshots that outlive the process. Each snapshot the memory
//! tier keeps is also written, whole, to `<dir>/<model fingerprint>/<name>.snap`, where the name
//! hashes the prompt prefix and its chunking key; after a restart a prompt whose prefix is on
//! disk loads it back instead of prefilling it.
//!
//! A file is trusted only once it proves to be the one asked for (`snapshot_file` says how);
//! anything else is logged, deleted and treated as a miss, so a bad file costs one prefill,
//! never wrong output. The KV type is also in the file name: servers run with different types
//! share the model's folder without replacing each other's files.
//!
//! Writes happen on one background thread, so the engine never waits on the disk: it writes
//! `<name>.tmp`, syncs it and renames it, so a crash never leaves a partial file under a real
//! name. Loads happen on the engine thread, when a prompt is admitted. One server at a time
//! should use a folder: opening it removes `.tmp` leftovers. With KV-cache events on, the
//! writer also announces the files' blocks (`disk_blocks`).

use std::fs;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use disk_blocks::DiskBlocks;
use snapshot_file::{
    check_identity, decode, encode, holds_logits, Layout, Rejected, StoredSnapshot,
};

use crate::kv_events::KvEventsOut;

mod disk_blocks;
pub(crate) mod snapshot_file;

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

/// A model's folder of snapshot files, and the thread that writes them.
pub(crate) struct DiskTier {
    dir: PathBuf,
    layout: Layout,
    pending: Arc<AtomicUsize>,
    /// Set while the engine runs sequences: the writer waits (see [`DiskTier::set_busy`]).
    busy: Arc<AtomicBool>,
    /// `None` only while dropping: closing the channel ends the writer.
    jobs: Option<mpsc::Sender<Job>>,
    writer: Option<JoinHandle<()>>,
}

impl DiskTier {
    /// Opens (creating it) `<root>/<fingerprint>/` and starts its writer thread, which first
    /// announces the files already there when `events` has somewhere to publish.
    pub fn open(
        config: &DiskConfig,
        layout: Layout,
        events: Option<KvEventsOut>,
    ) -> io::Result<Self> {
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
            events: events.map(|out| (out, DiskBlocks::new(layout.block_size))),
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
        self.send(Job::Write(snapshot));
    }

    fn send(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            // Only fails once the writer has died, which it logged.
            let _ = jobs.send(job);
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
                self.send(Job::Forget(path));
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

/// What the writer thread is asked to do.
enum Job {
    Write(StoredSnapshot),
    /// The engine deleted this file (it was bad): its blocks are no longer on disk.
    Forget(PathBuf),
}

/// The writer thread's side.
struct Writer {
    dir: PathBuf,
    layout: Layout,
    cap: usize,
    pending: Arc<AtomicUsize>,
    busy: Arc<AtomicBool>,
    /// Where the files' blocks are announced, and which blocks the files hold.
    events: Option<(KvEventsOut, DiskBlocks)>,
}

impl Writer {
    fn run(mut self, inbox: mpsc::Receiver<Job>) {
        yield_to_inference();
        if let Some((out, blocks)) = &mut self.events {
            publish(out, blocks.scan(&self.dir, &self.layout));
        }
        for job in inbox {
            let snapshot = match job {
                Job::Write(snapshot) => snapshot,
                Job::Forget(path) => {
                    self.announce(|blocks| blocks.removed(&path));
                    continue;
                }
            };
            while self.busy.load(Ordering::Acquire) {
                std::thread::sleep(IDLE_POLL);
            }
            if let Err(e) = self.write(&snapshot) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot write a prefix-cache file");
            }
            self.pending.fetch_sub(snapshot.payload_bytes(), Ordering::AcqRel);
        }
    }

    /// Publishes the events `change` makes of the files' blocks, when events are on.
    fn announce(
        &mut self,
        change: impl FnOnce(&mut DiskBlocks) -> Vec<spindle_kv_events::KvEvent>,
    ) {
        if let Some((out, blocks)) = &mut self.events {
            publish(out, change(blocks));
        }
    }

    fn write(&mut self, snapshot: &StoredSnapshot) -> io::Result<()> {
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
        self.announce(|blocks| blocks.written(path, &snapshot.tokens));
        self.evict()
    }

    /// Deletes the least recently modified snapshot files until the folder fits the cap.
    fn evict(&mut self) -> io::Result<()> {
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
            self.announce(|blocks| blocks.removed(&path));
            total -= len;
        }
        Ok(())
    }
}

fn publish(out: &KvEventsOut, events: Vec<spindle_kv_events::KvEvent>) {
    if !events.is_empty() {
        out.publisher.publish(&out.topic, events);
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

    use super::snapshot_file::tests::{layout, snapshot};
    use super::*;

    fn open(root: &Path, layout: Layout) -> DiskTier {
        DiskTier::open(&DiskConfig { dir: root.to_path_buf(), bytes: 1 << 30 }, layout, None)
            .unwrap()
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

    #[test]
    fn a_damaged_file_is_ignored_and_deleted() {
        let root = tempfile::tempdir().unwrap();
        let s = snapshot(&[5, 6, 7, 8, 9], 3, 0.5, true);
        let path = save(root.path(), &s);
        let mut bytes = fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(open(root.path(), layout("m")).load(&s.tokens, 3), None);
        assert!(!path.exists(), "a bad file is deleted");
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
            DiskTier::open(&config, layout("m"), None).unwrap().save(s.clone());
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
        assert!(DiskTier::open(&config, layout("m"), None)
            .unwrap()
            .load(&snaps[1].tokens, 0)
            .is_some());
        save(&snaps[3]);
        assert!(paths[1].exists() && !paths[2].exists() && paths[3].exists());
        assert_eq!(snapshot_files(&root.path().join("m")), 2);
    }

    #[test]
    fn a_snapshot_larger_than_the_cap_is_not_written() {
        let root = tempfile::tempdir().unwrap();
        let tier = DiskTier::open(
            &DiskConfig { dir: root.path().to_path_buf(), bytes: 16 },
            layout("m"),
            None,
        )
        .unwrap();
        tier.save(snapshot(&[1, 2], 0, 1.0, true));
        let dir = tier.dir.clone();
        drop(tier);
        assert_eq!(snapshot_files(&dir), 0);
    }
}
