//! The KV storage of all sequences and the prefix cache over it. Sequences take blocks from
//! one pool; when a prompt reaches one of its snapshot positions (end of a chat message, end of
//! the prompt) its blocks so far go into the prefix tree together with a snapshot: the
//! recurrent state there (hybrid models) and, at the end of a prompt, the logits that follow.
//! A later prompt with the same tokens and the same chunking up to such a position starts from
//! it: the tree's blocks are shared, the partly filled last block is copied, and only the rest
//! is prefilled.

use std::collections::HashMap;
use std::sync::Arc;

use spindle_models::{CausalLm, PagedKv, RecurrentState, SequenceCache};
use spindle_sched::{BlockId, BlockPool, CacheKind, PoolExhausted, PrefillPlan, PrefixTree, SnapshotId};

/// Sizes of the KV storage and of the snapshot store.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Bytes of key/value blocks, shared by running sequences and the prefix cache.
    pub kv_bytes: usize,
    /// Bytes of snapshots (recurrent states, logits) the prefix cache may keep.
    pub snapshot_bytes: usize,
    /// Positions per block.
    pub block_size: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self { kv_bytes: 1 << 30, snapshot_bytes: 1 << 30, block_size: 16 }
    }
}

/// What a position's snapshot holds besides the blocks before it.
struct Snapshot {
    /// The chunking that led here ([`PrefillPlan::key`]).
    key: u64,
    recurrent: RecurrentState,
    /// The logits for the next token, kept at the end of a prompt.
    logits: Option<Vec<f32>>,
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
}

impl PrefixCache {
    pub fn new(model: &dyn CausalLm, config: &CacheConfig) -> Self {
        let shapes = model.kv_shapes();
        let block_bytes = PagedKv::block_bytes(&shapes, config.block_size).max(1);
        let blocks = (config.kv_bytes / block_bytes).max(1);
        let initial = model.initial_recurrent_state();
        let kind = if initial.is_empty() { CacheKind::AttentionOnly } else { CacheKind::Hybrid };
        Self {
            kv: Arc::new(PagedKv::new(&shapes, blocks, config.block_size)),
            pool: BlockPool::new(blocks, config.block_size),
            tree: PrefixTree::new(config.block_size, kind, config.snapshot_bytes),
            snapshots: HashMap::new(),
            next_snapshot: 0,
            initial,
        }
    }

    pub fn total_blocks(&self) -> usize {
        self.pool.total_blocks()
    }

    /// Blocks `positions` positions take.
    pub fn blocks_for(&self, positions: usize) -> usize {
        self.pool.blocks_for(positions)
    }

    /// Frees cached blocks nobody runs on until `blocks` are free; false if that is impossible.
    pub fn make_room(&mut self, blocks: usize) -> bool {
        if self.pool.free_blocks() < blocks {
            for dropped in self.tree.make_room(&mut self.pool, blocks) {
                self.snapshots.remove(&dropped);
            }
        }
        self.pool.free_blocks() >= blocks
    }

    /// A cache for `prompt`, resumed from the deepest snapshot `plan` can continue exactly.
    pub fn start(&mut self, prompt: &[u32], plan: &PrefillPlan, limit: usize) -> Result<Started, PoolExhausted> {
        for point in self.tree.lookup(prompt) {
            let Some(snapshot) = point.snapshot.and_then(|id| self.snapshots.get(&id)) else { continue };
            if plan.key(point.position) != Some(snapshot.key) || (point.position == prompt.len() && snapshot.logits.is_none()) {
                continue;
            }
            let (recurrent, logits) = (snapshot.recurrent.clone(), snapshot.logits.clone());
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
                self.kv.copy_positions(partial.0, copy.0, point.position % self.pool.block_size()).expect("pool blocks");
                blocks.push(copy);
            } else {
                self.pool.share(&blocks);
            }
            let ids = blocks.iter().map(|b| b.0).collect();
            let cache = SequenceCache::resume(self.kv.clone(), ids, point.position, recurrent, limit);
            let logits = logits.filter(|_| point.position == prompt.len());
            return Ok(Started { cache, cached: point.position, logits });
        }
        let cache = SequenceCache::resume(self.kv.clone(), Vec::new(), 0, self.initial.clone(), limit);
        Ok(Started { cache, cached: 0, logits: None })
    }

    /// Adds the blocks `cache` needs for `new_tokens` more positions, evicting cached prefixes
    /// nobody uses if the pool runs short.
    pub fn reserve(&mut self, cache: &mut SequenceCache, new_tokens: usize) -> Result<(), PoolExhausted> {
        let needed = cache.blocks_needed(new_tokens);
        if needed > 0 {
            let blocks = self.allocate(needed)?;
            cache.add_blocks(&blocks.iter().map(|b| b.0).collect::<Vec<_>>());
        }
        Ok(())
    }

    fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, PoolExhausted> {
        self.make_room(n);
        self.pool.allocate(n)
    }

    /// Keeps the prefix `tokens` (all `cache` has processed) with a snapshot of its state.
    pub fn store(&mut self, tokens: &[u32], cache: &SequenceCache, key: u64, logits: Option<&[f32]>) {
        debug_assert_eq!(tokens.len(), cache.len());
        let id = SnapshotId(self.next_snapshot);
        self.next_snapshot += 1;
        let snapshot = Snapshot { key, recurrent: cache.recurrent().clone(), logits: logits.map(<[f32]>::to_vec) };
        let bytes = snapshot.recurrent.bytes() + snapshot.logits.as_ref().map_or(0, |l| l.len() * 4);
        let blocks: Vec<BlockId> = cache.blocks()[..self.pool.blocks_for(tokens.len())].iter().map(|&b| BlockId(b)).collect();
        let inserted = self.tree.insert(tokens, &blocks, Some((id, bytes)), &mut self.pool);
        if inserted.snapshot_stored {
            self.snapshots.insert(id, snapshot);
        }
        for dropped in inserted.dropped_snapshots {
            self.snapshots.remove(&dropped);
        }
    }

    /// Gives back a finished sequence's blocks (those the tree also holds stay cached).
    pub fn release(&mut self, cache: &SequenceCache) {
        let blocks: Vec<BlockId> = cache.blocks().iter().map(|&b| BlockId(b)).collect();
        self.pool.release(&blocks);
    }
}
