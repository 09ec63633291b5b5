//! The KV storage of all sequences and the prefix cache over it. Sequences take blocks from
//! one pool; when a prompt reaches one of its snapshot positions (end of a chat message, end of
//! the prompt) its blocks so far go into the prefix tree together with a snapshot: the
//! recurrent state there (hybrid models) and, at the end of a prompt, the logits that follow.
//! A later prompt with the same tokens up to such a position starts from it: the tree's blocks
//! are shared, the partly filled last block is copied, and only the rest is prefilled.
//!
//! On a hybrid model every block goes into the tree under the chunking key of the prompt that
//! computed it ([`PrefillPlan::block_key`]), since other cuts round differently: a prompt only
//! ever resumes on blocks it would have computed bit for bit itself. On an attention-only model
//! the cuts change nothing, so a prompt resumes at the last position it shares with any cached
//! prompt, and a finished reply stays cached after its prompt (see [`PrefillPlan`]).
//!
//! With a disk tier every snapshot kept in memory is also written to disk, and a prompt whose
//! deepest usable snapshot is only on disk (after a restart, or after eviction) loads it into the
//! tree first and then resumes from it like from any other.

use std::collections::HashMap;
use std::sync::Arc;

use spindle_models::{KvType, PagedKv, RecurrentState, SequenceCache};
use spindle_sched::{
    BlockId, BlockPool, CacheKind, PoolExhausted, PrefillPlan, PrefixTree, ResumePoint, SnapshotId,
};

use crate::bundle::ModelBundle;
use crate::disk_tier::snapshot_file::{Layout, StoredSnapshot};
use crate::disk_tier::{self, DiskConfig, DiskTier};
use crate::kv_events::{BlockEvents, KvEventsOut};
use crate::window_rows::WindowRows;

/// Sizes of the KV storage and of the snapshot store.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Bytes of key/value blocks, shared by running sequences and the prefix cache.
    pub kv_bytes: usize,
    /// Bytes of the draft model's key/value blocks, taken out of the KV memory budget by
    /// [`crate::DraftModel::share_kv_memory`]; 0 without a draft model.
    pub draft_kv_bytes: usize,
    /// Bytes of the states a hybrid model's recurrent layers keep while verifying drafts, taken
    /// out of the KV memory budget by [`crate::share_rollback_memory`]; `None`: not counted
    /// (one-sequence runs and tests, whose drafts are few).
    pub rollback_bytes: Option<usize>,
    /// Bytes of snapshots (recurrent states, logits) the prefix cache may keep.
    pub snapshot_bytes: usize,
    /// Positions per block.
    pub block_size: usize,
    /// The number type keys and values are stored in.
    pub kv_type: KvType,
    /// Also keep snapshots on disk, across restarts.
    pub disk: Option<DiskConfig>,
    /// Give the memory of sliding-window layers' rows that no query will see again back to
    /// the OS (see `window_rows`); off keeps every layer's rows, to compare.
    pub release_window_rows: bool,
    /// Publish the blocks entering and leaving the prefix cache as KV-cache events.
    pub events: Option<KvEventsOut>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            kv_bytes: 1 << 30,
            draft_kv_bytes: 0,
            rollback_bytes: None,
            snapshot_bytes: 1 << 30,
            block_size: 16,
            kv_type: KvType::default(),
            disk: None,
            release_window_rows: true,
            events: None,
        }
    }
}

impl CacheConfig {
    /// Bytes one block of `bundle`'s model takes (keys and values of every layer, as `kv_type`).
    pub fn block_bytes(&self, bundle: &ModelBundle) -> usize {
        PagedKv::block_bytes(&bundle.model.kv_shapes(), self.kv_type, self.block_size)
    }

    /// Key/value blocks `kv_bytes` holds for `bundle`'s model (at least one).
    pub fn kv_blocks(&self, bundle: &ModelBundle) -> usize {
        (self.kv_bytes / self.block_bytes(bundle).max(1)).max(1)
    }

    /// This configuration with `kv_bytes` just enough for `positions` of `bundle`'s model.
    pub fn holding(self, bundle: &ModelBundle, positions: usize) -> Self {
        Self {
            kv_bytes: self.block_bytes(bundle) * positions.div_ceil(self.block_size).max(1),
            ..self
        }
    }

    /// Positions whose keys and values fit in `kv_bytes`, over all sequences together.
    pub fn kv_tokens(&self, bundle: &ModelBundle) -> usize {
        self.kv_blocks(bundle) * self.block_size
    }
}

/// What a position's snapshot holds besides the blocks before it.
struct Snapshot {
    /// The chunking that led here ([`PrefillPlan::key`]).
    key: u64,
    recurrent: RecurrentState,
    /// The logits for the next token, kept at the end of a prompt.
    logits: Option<Vec<f32>>,
    /// The blocks whose sliding-window rows a resume here needs.
    pinned: Vec<BlockId>,
}

impl Snapshot {
    /// What it counts against the snapshot budget.
    fn bytes(&self) -> usize {
        self.recurrent.bytes()
            + self.logits.as_ref().map_or(0, |l| l.len() * std::mem::size_of::<f32>())
    }
}

/// Where a snapshot is kept.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tiers {
    Memory,
    MemoryAndDisk,
}

/// A new sequence's cache, and how much of its prompt the prefix cache covered.
pub struct Started {
    pub cache: SequenceCache,
    /// Prompt positions taken from the cache.
    pub cached: usize,
    /// The logits after the whole prompt, when the cache covered all of it.
    pub logits: Option<Vec<f32>>,
}

pub struct PrefixCache {
    kv: Arc<PagedKv>,
    pool: BlockPool,
    tree: PrefixTree,
    snapshots: HashMap<SnapshotId, Snapshot>,
    next_snapshot: u64,
    initial: RecurrentState,
    disk: Option<DiskTier>,
    /// Per block, the positions in it (`start..end` within the block) that were read for a
    /// request whose client had gone; cleared when the block is allocated anew.
    orphan_reads: HashMap<BlockId, (usize, usize)>,
    /// Prompt positions a resume took from the cache that a dropped request had read.
    orphan_tokens_reused: usize,
    /// For models with sliding-window layers: which blocks still hold their rows there.
    window_rows: Option<WindowRows>,
    /// The blocks entering and leaving the tree, told to routers.
    events: BlockEvents,
}

impl PrefixCache {
    /// Starts afresh, as [`Self::new`] makes a cache, after a fault left this one in an unknown
    /// state. The old storage and disk tier go first (the disk tier's queued writes done), so
    /// two pools are never allocated at once and the folder has one owner.
    pub fn rebuild(&mut self, bundle: &ModelBundle, config: &CacheConfig) {
        self.disk = None;
        self.kv = Arc::new(PagedKv::new(&[], config.kv_type, 0, config.block_size));
        *self = Self::new(bundle, config);
        self.events.cleared();
    }

    /// Publishes the blocks that entered and left the tree since the last call: one batch per
    /// engine step.
    pub fn publish_events(&mut self) {
        let changes = self.tree.take_changes();
        self.events.publish(changes);
    }

    pub fn new(bundle: &ModelBundle, config: &CacheConfig) -> Self {
        let shapes = bundle.model.kv_shapes();
        let blocks = config.kv_blocks(bundle);
        let initial = bundle.model.initial_recurrent_state();
        let kind = if initial.is_empty() { CacheKind::AttentionOnly } else { CacheKind::Hybrid };
        let kv = Arc::new(PagedKv::new(&shapes, config.kv_type, blocks, config.block_size));
        let disk = config.disk.as_ref().and_then(|disk| {
            let layout = Layout {
                fingerprint: bundle.fingerprint.clone(),
                build: disk_tier::build_id(),
                kv_type: config.kv_type.name().into(),
                block_size: config.block_size,
                block_bytes: kv.bytes_per_block(),
                recurrent_floats: initial.bytes() / std::mem::size_of::<f32>(),
            };
            // The memory tier works without it; a server should not refuse to start over it.
            DiskTier::open(disk, layout, config.events.clone())
                .inspect_err(|e| tracing::error!(dir = %disk.dir.display(), error = %e, "the prefix cache's disk tier is off"))
                .ok()
        });
        let window = kv.widest_window().filter(|_| config.release_window_rows);
        let mut tree = PrefixTree::new(config.block_size, kind, config.snapshot_bytes);
        if config.events.is_some() {
            tree.journal_changes();
        }
        Self {
            window_rows: WindowRows::new(window, config.block_size),
            kv,
            pool: BlockPool::new(blocks, config.block_size),
            tree,
            snapshots: HashMap::new(),
            next_snapshot: 0,
            initial,
            disk,
            orphan_reads: HashMap::new(),
            orphan_tokens_reused: 0,
            events: BlockEvents::new(config.events.clone(), config.block_size),
        }
    }

    /// Whether the model has recurrent state, which decides where prompts can resume.
    pub fn kind(&self) -> CacheKind {
        self.tree.kind()
    }

    /// How a prompt of `len` tokens with snapshots at `snapshots` is cut into `chunk`-sized
    /// prefill chunks on this model.
    pub fn plan(&self, len: usize, snapshots: &[usize], chunk: usize) -> PrefillPlan {
        PrefillPlan::for_model(self.kind(), len, snapshots, chunk)
    }

    pub fn total_blocks(&self) -> usize {
        self.pool.total_blocks()
    }

    /// Bytes of the snapshots kept in memory.
    pub fn snapshot_bytes(&self) -> usize {
        self.tree.snapshot_bytes()
    }

    /// Blocks `positions` positions take.
    pub fn blocks_for(&self, positions: usize) -> usize {
        self.pool.blocks_for(positions)
    }

    /// Frees cached blocks nobody runs on until `blocks` are free; false if that is impossible.
    pub fn make_room(&mut self, blocks: usize) -> bool {
        if self.pool.free_blocks() < blocks {
            for dropped in self.tree.make_room(&mut self.pool, blocks) {
                self.forget(dropped);
            }
        }
        self.pool.free_blocks() >= blocks
    }

    /// A cache for `prompt`, resumed from the deepest snapshot `plan` can continue exactly, in
    /// memory or on disk.
    pub fn start(
        &mut self,
        prompt: &[u32],
        plan: &PrefillPlan,
        limit: usize,
    ) -> Result<Started, PoolExhausted> {
        if self.disk.is_some() {
            let in_memory = self.resume_point(prompt, plan).map_or(0, |point| point.position);
            self.import_deeper(prompt, plan, in_memory);
        }
        let Some(point) = self.resume_point(prompt, plan) else {
            let cache =
                SequenceCache::resume(self.kv.clone(), Vec::new(), 0, self.initial.clone(), limit);
            return Ok(Started { cache, cached: 0, logits: None });
        };
        let (recurrent, logits) = match point.snapshot {
            Some(id) => (self.snapshots[&id].recurrent.clone(), self.snapshots[&id].logits.clone()),
            // A cut without a snapshot: attention only, and short of the prompt's end.
            None => (self.initial.clone(), None),
        };
        let mut blocks = point.blocks.clone();
        if let Some(partial) = point.partial {
            // Others may write past the cached positions of this block: take a copy.
            self.pool.share(&blocks);
            let copy = match self.allocate(1) {
                Ok(copy) => copy[0],
                Err(e) => {
                    self.pool.release(&blocks);
                    return Err(e);
                }
            };
            self.kv
                .copy_positions(partial.0, copy.0, point.position % self.pool.block_size())
                .expect("pool blocks");
            blocks.push(copy);
        } else {
            self.pool.share(&blocks);
        }
        self.count_orphan_reuse(&point);
        let ids = blocks.iter().map(|b| b.0).collect();
        let cache = SequenceCache::resume(self.kv.clone(), ids, point.position, recurrent, limit);
        let logits = logits.filter(|_| point.position == prompt.len());
        Ok(Started { cache, cached: point.position, logits })
    }

    /// The deepest point of the tree that `plan` continues exactly: a snapshot written under the
    /// same chunking, holding the logits if it is the end of the prompt; or, for a model without
    /// recurrent state, the longest cached match (short of the prompt's end).
    fn resume_point(&mut self, prompt: &[u32], plan: &PrefillPlan) -> Option<ResumePoint> {
        let points = self.tree.lookup(prompt, |end| plan.block_key(end));
        let at_snapshot = points.iter().find(|point| {
            let Some(snapshot) = point.snapshot.and_then(|id| self.snapshots.get(&id)) else {
                return false;
            };
            plan.key(point.position) == Some(snapshot.key)
                && (point.position < prompt.len() || snapshot.logits.is_some())
                && self.window_intact(point)
        });
        let at_cut = match self.tree.kind() {
            // Every point's blocks matched under this plan's keys; the first is the deepest.
            CacheKind::AttentionOnly => points
                .first()
                .and_then(|deepest| self.cut_within(deepest, plan))
                .filter(|cut| self.window_intact(cut)),
            CacheKind::Hybrid => None,
        };
        match (at_snapshot, at_cut) {
            (Some(snapshot), Some(cut)) if cut.position > snapshot.position => Some(cut),
            (Some(snapshot), _) => Some(snapshot.clone()),
            (None, cut) => cut,
        }
    }

    /// Whether the sliding-window rows a resume at `point` reads are all there.
    fn window_intact(&self, point: &ResumePoint) -> bool {
        self.window_rows.as_ref().is_none_or(|rows| {
            let blocks: Vec<BlockId> = point.blocks.iter().copied().chain(point.partial).collect();
            rows.intact(&blocks, point.position)
        })
    }

    /// `longest` cut back to the last place within it and before the prompt's end (which would
    /// need the logits) where `plan` can resume. Attention keys and values are all a resume
    /// needs, and they are the bits a cold prefill computes under any cuts; the prompt then goes
    /// on with its own next chunk.
    fn cut_within(&self, longest: &ResumePoint, plan: &PrefillPlan) -> Option<ResumePoint> {
        let position =
            plan.last_cut_before(longest.position.min(plan.len().saturating_sub(1)) + 1)?;
        let bs = self.pool.block_size();
        let full = position / bs;
        let partial = match position % bs {
            0 => None,
            _ if full < longest.blocks.len() => Some(longest.blocks[full]),
            _ => longest.partial,
        };
        Some(ResumePoint {
            position,
            blocks: longest.blocks[..full].to_vec(),
            partial,
            snapshot: None,
        })
    }

    /// Loads into the tree the deepest snapshot of `plan` past position `known` that the disk
    /// holds, if any.
    fn import_deeper(&mut self, prompt: &[u32], plan: &PrefillPlan, known: usize) {
        let Some(disk) = &self.disk else { return };
        let found =
            plan.snapshots().iter().rev().filter(|&&p| p > known && p <= prompt.len()).find_map(
                |&p| {
                    let stored = disk.load(&prompt[..p], plan.key(p)?)?;
                    (p < prompt.len() || stored.logits.is_some()).then_some(stored)
                },
            );
        if let Some(stored) = found {
            self.import(stored, plan);
        }
    }

    /// Copies a snapshot from disk into fresh blocks and the tree, under the block keys of
    /// `plan` (whose key at the snapshot's position is the file's: it cuts the prefix alike). On
    /// failure nothing is left allocated.
    fn import(&mut self, stored: StoredSnapshot, plan: &PrefillPlan) {
        debug_assert_eq!(
            plan.key(stored.tokens.len()),
            Some(stored.key),
            "loaded under the plan's key"
        );
        let recurrent = match self.initial.with_floats(&stored.recurrent) {
            Ok(recurrent) => recurrent,
            Err(e) => {
                tracing::warn!(error = %e, "a prefix-cache file does not fit the model");
                return;
            }
        };
        // No room without evicting running work: prefill instead.
        let Ok(blocks) = self.allocate(stored.blocks.len()) else { return };
        for (block, data) in blocks.iter().zip(&stored.blocks) {
            if let Err(e) = self.kv.write_block(block.0, data) {
                tracing::warn!(error = %e, "a prefix-cache file does not fit the model");
                self.pool.release(&blocks);
                return;
            }
        }
        let snapshot =
            Snapshot { key: stored.key, recurrent, logits: stored.logits, pinned: Vec::new() };
        let keys = plan.block_keys(stored.tokens.len(), self.pool.block_size());
        self.insert(&stored.tokens, &keys, &blocks, snapshot);
        // The file may hold released rows (zeros) before the snapshot's window: never read.
        if let Some(rows) = &mut self.window_rows {
            let behind = stored.tokens.len().saturating_sub(rows.window()) / self.pool.block_size();
            let unread = &blocks[..behind.min(blocks.len())];
            rows.mark_released(unread);
            let ids: Vec<u32> = unread.iter().map(|b| b.0).collect();
            self.kv.release_window_rows(&ids).expect("pool blocks");
        }
        // The tree holds its own references to what it kept.
        self.pool.release(&blocks);
    }

    /// Adds the blocks `cache` needs for `new_tokens` more positions, evicting cached prefixes
    /// nobody uses if the pool runs short.
    pub fn reserve(
        &mut self,
        cache: &mut SequenceCache,
        new_tokens: usize,
    ) -> Result<(), PoolExhausted> {
        let needed = cache.blocks_needed(new_tokens);
        if needed > 0 {
            let blocks = self.allocate(needed)?;
            cache.add_blocks(&blocks.iter().map(|b| b.0).collect::<Vec<_>>());
        }
        Ok(())
    }

    fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, PoolExhausted> {
        self.make_room(n);
        let blocks = self.pool.allocate(n)?;
        for block in &blocks {
            self.orphan_reads.remove(block);
            if let Some(rows) = &mut self.window_rows {
                rows.reallocated(*block);
            }
        }
        Ok(blocks)
    }

    /// Records that `cache` read positions `start..end` for a request whose client had gone.
    pub fn note_orphan_read(&mut self, cache: &SequenceCache, start: usize, end: usize) {
        let bs = self.pool.block_size();
        for (index, &block) in
            cache.blocks().iter().enumerate().take(end.div_ceil(bs)).skip(start / bs)
        {
            let base = index * bs;
            let (from, to) = (start.max(base) - base, end.min(base + bs) - base);
            let range = self.orphan_reads.entry(BlockId(block)).or_insert((from, to));
            *range = (range.0.min(from), range.1.max(to));
        }
    }

    /// Prompt positions resumes took from the cache that dropped requests had read.
    pub fn orphan_tokens_reused(&self) -> usize {
        self.orphan_tokens_reused
    }

    /// Adds the positions of `point` that a dropped request had read to the reuse count.
    fn count_orphan_reuse(&mut self, point: &ResumePoint) {
        let bs = self.pool.block_size();
        let within = |block: &BlockId, end: usize| {
            self.orphan_reads.get(block).map_or(0, |&(from, to)| to.min(end).saturating_sub(from))
        };
        let full: usize = point.blocks.iter().map(|block| within(block, bs)).sum();
        let partial = point.partial.map_or(0, |block| within(&block, point.position % bs));
        self.orphan_tokens_reused += full + partial;
    }

    /// Keeps the prefix `tokens` (all `cache` has processed, a cut of `plan`) with
    /// a snapshot of its state, in memory and, when the memory tier took it, on disk.
    pub fn store(
        &mut self,
        tokens: &[u32],
        cache: &SequenceCache,
        plan: &PrefillPlan,
        logits: Option<&[f32]>,
    ) {
        self.store_in(Tiers::MemoryAndDisk, tokens, cache, plan, logits);
    }

    /// [`Self::store`] in memory only: for a reply, which a client may send back soon but
    /// which is not worth another whole copy of its prefix on disk.
    pub fn store_in_memory(&mut self, tokens: &[u32], cache: &SequenceCache, plan: &PrefillPlan) {
        self.store_in(Tiers::Memory, tokens, cache, plan, None);
    }

    fn store_in(
        &mut self,
        tiers: Tiers,
        tokens: &[u32],
        cache: &SequenceCache,
        plan: &PrefillPlan,
        logits: Option<&[f32]>,
    ) {
        debug_assert_eq!(tokens.len(), cache.len());
        let key = plan.key(tokens.len()).expect("snapshots are stored at cuts");
        let snapshot = Snapshot {
            key,
            recurrent: cache.recurrent().clone(),
            logits: logits.map(<[f32]>::to_vec),
            pinned: Vec::new(),
        };
        let blocks: Vec<BlockId> = cache.blocks()[..self.pool.blocks_for(tokens.len())]
            .iter()
            .map(|&b| BlockId(b))
            .collect();
        let keys = plan.block_keys(tokens.len(), self.pool.block_size());
        let Some(id) = self.insert(tokens, &keys, &blocks, snapshot) else { return };
        let Some(disk) = self.disk.as_ref().filter(|_| tiers == Tiers::MemoryAndDisk) else {
            return;
        };
        let snapshot = &self.snapshots[&id];
        disk.save(StoredSnapshot {
            tokens: tokens.to_vec(),
            key,
            blocks: blocks.iter().map(|b| self.kv.read_block(b.0).expect("pool blocks")).collect(),
            recurrent: snapshot.recurrent.to_floats(),
            logits: snapshot.logits.clone(),
        });
    }

    /// Offers the tree `blocks` holding `tokens`, computed under the chunking `keys`, and a
    /// snapshot after them. Returns the id of the snapshot that changed: the new one if the
    /// tree kept it, or the one already there if it lacked the new one's logits and took them.
    fn insert(
        &mut self,
        tokens: &[u32],
        keys: &[u64],
        blocks: &[BlockId],
        snapshot: Snapshot,
    ) -> Option<SnapshotId> {
        let id = SnapshotId(self.next_snapshot);
        self.next_snapshot += 1;
        let inserted =
            self.tree.insert(tokens, keys, blocks, Some((id, snapshot.bytes())), &mut self.pool);
        for dropped in inserted.dropped_snapshots {
            self.forget(dropped);
        }
        if inserted.snapshot_stored {
            let pinned = self.pin_window(tokens, keys, id);
            self.snapshots.insert(id, Snapshot { pinned, ..snapshot });
            return Some(id);
        }
        // A longer prompt left a snapshot here without logits (its prompt went on): the same
        // state under the same chunking, so the logits of this one, which ends here, complete it.
        let existing = inserted.existing?;
        let old = self.snapshots.get(&existing)?;
        let logits = snapshot.logits.filter(|_| old.logits.is_none() && old.key == snapshot.key)?;
        let bytes = old.bytes() + logits.len() * std::mem::size_of::<f32>();
        for dropped in self.tree.resize_snapshot(existing, bytes, &mut self.pool)? {
            self.forget(dropped);
        }
        self.snapshots.get_mut(&existing).expect("the tree kept it").logits = Some(logits);
        Some(existing)
    }

    /// Pins the sliding-window rows before the new snapshot `id` at the end of `tokens`: those
    /// of the blocks the tree holds there, which may be older ones than the offered.
    fn pin_window(&mut self, tokens: &[u32], keys: &[u64], id: SnapshotId) -> Vec<BlockId> {
        let Some(rows) = &mut self.window_rows else { return Vec::new() };
        let bs = self.pool.block_size();
        let points = self.tree.lookup(tokens, |end| keys[(end - 1) / bs]);
        let Some(point) = points.into_iter().find(|p| p.snapshot == Some(id)) else {
            return Vec::new();
        };
        let blocks: Vec<BlockId> = point.blocks.into_iter().chain(point.partial).collect();
        rows.pin(&blocks, point.position)
    }

    /// Drops the payload of a snapshot the tree let go, and its pins.
    fn forget(&mut self, id: SnapshotId) {
        if let Some(snapshot) = self.snapshots.remove(&id) {
            if let Some(rows) = &mut self.window_rows {
                rows.unpin(&snapshot.pinned);
            }
        }
    }

    /// Gives back the sliding-window rows that `running` sequences and cached snapshots no
    /// longer need.
    pub fn release_window_rows<'c>(&mut self, running: impl Iterator<Item = &'c SequenceCache>) {
        let Some(rows) = &mut self.window_rows else { return };
        let blocks = rows.releasable(running);
        if !blocks.is_empty() {
            self.kv.release_window_rows(&blocks).expect("pool blocks");
        }
    }

    /// Blocks whose sliding-window rows were given back.
    pub fn window_released_blocks(&self) -> usize {
        self.window_rows.as_ref().map_or(0, WindowRows::released)
    }

    /// Whether sequences are running: the disk tier writes only in between.
    pub fn set_busy(&self, busy: bool) {
        if let Some(disk) = &self.disk {
            disk.set_busy(busy);
        }
    }

    /// Gives back a finished sequence's blocks (those the tree also holds stay cached).
    pub fn release(&mut self, cache: &SequenceCache) {
        let blocks: Vec<BlockId> = cache.blocks().iter().map(|&b| BlockId(b)).collect();
        self.pool.release(&blocks);
    }
}
