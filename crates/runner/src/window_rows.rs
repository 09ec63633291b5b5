//! Which blocks still hold their rows in sliding-window layers. A query in such a layer sees
//! only the last `window` positions, so once every sequence holding a block is more than a
//! window past it, nobody reads its rows there again — unless a prompt resumes from the
//! prefix cache within a window after it. Those rows are given back to the OS (Gemma 3 keeps
//! 5 of every 6 layers' keys for only 512–1,024 positions), except in the window before each
//! cached snapshot, which is pinned so that shared system prompts and conversations still
//! resume; a resume anywhere else first checks that its window is intact.

use std::collections::{HashMap, HashSet};

use spindle_models::SequenceCache;
use spindle_sched::BlockId;

pub(crate) struct WindowRows {
    window: usize,
    block_size: usize,
    /// Blocks whose windowed rows are gone (until the pool hands the block out again).
    released: HashSet<BlockId>,
    /// Per block, the cached snapshots that may resume within a window after it.
    pins: HashMap<BlockId, usize>,
    /// Each running sequence's first block and how many blocks it was a window past, at the
    /// last scan: nothing new can be released until that changes. (A snapshot's pins going
    /// waits for the next change.)
    scanned: Vec<(Option<u32>, usize)>,
}

impl WindowRows {
    /// Tracking for a model whose widest sliding window is `window` (none: nothing to track).
    pub fn new(window: Option<usize>, block_size: usize) -> Option<Self> {
        Some(Self {
            window: window?,
            block_size,
            released: HashSet::new(),
            pins: HashMap::new(),
            scanned: Vec::new(),
        })
    }

    pub fn window(&self) -> usize {
        self.window
    }

    /// The blocks, of those holding positions `0..len`, that a prompt resuming at `len` reads
    /// in the windowed layers.
    fn window_before<'b>(&self, blocks: &'b [BlockId], len: usize) -> &'b [BlockId] {
        let first = len.saturating_sub(self.window) / self.block_size;
        &blocks[first.min(blocks.len())..]
    }

    /// Whether a prompt can resume at `len` on `blocks` (those holding `0..len`).
    pub fn intact(&self, blocks: &[BlockId], len: usize) -> bool {
        self.window_before(blocks, len).iter().all(|b| !self.released.contains(b))
    }

    /// Keeps the rows a resume at `len` needs; returns what to [`unpin`](Self::unpin) when
    /// the snapshot there goes.
    pub fn pin(&mut self, blocks: &[BlockId], len: usize) -> Vec<BlockId> {
        let pinned = self.window_before(blocks, len).to_vec();
        for &block in &pinned {
            *self.pins.entry(block).or_default() += 1;
        }
        pinned
    }

    pub fn unpin(&mut self, pinned: &[BlockId]) {
        for block in pinned {
            if let Some(count) = self.pins.get_mut(block) {
                *count -= 1;
                if *count == 0 {
                    self.pins.remove(block);
                }
            }
        }
    }

    /// `block` was handed out anew: whoever takes it writes its rows first.
    pub fn reallocated(&mut self, block: BlockId) {
        self.released.remove(&block);
    }

    /// Records that the windowed rows of `blocks` are gone or not to be trusted.
    pub fn mark_released(&mut self, blocks: &[BlockId]) {
        self.released.extend(blocks);
    }

    /// The blocks whose windowed rows can go now: every running sequence holding one is more
    /// than a window past its end, and no snapshot pins it. They are counted as released.
    pub fn releasable<'c>(&mut self, running: impl Iterator<Item = &'c SequenceCache>) -> Vec<u32> {
        let running: Vec<&SequenceCache> = running.collect();
        let behind =
            |cache: &SequenceCache| cache.len().saturating_sub(self.window) / self.block_size;
        let mut scanned: Vec<_> =
            running.iter().map(|c| (c.blocks().first().copied(), behind(c))).collect();
        scanned.sort_unstable();
        if scanned == self.scanned {
            return Vec::new();
        }
        self.scanned = scanned;
        // Per block: whether every holder is a window past it.
        let mut passed: HashMap<u32, bool> = HashMap::new();
        for cache in running {
            let behind = behind(cache);
            for (index, &block) in cache.blocks().iter().enumerate() {
                *passed.entry(block).or_insert(true) &= index < behind;
            }
        }
        let mut release: Vec<u32> = passed
            .into_iter()
            .filter(|&(block, passed)| {
                let id = BlockId(block);
                passed && !self.released.contains(&id) && !self.pins.contains_key(&id)
            })
            .map(|(block, _)| block)
            .collect();
        release.sort_unstable();
        self.released.extend(release.iter().map(|&b| BlockId(b)));
        release
    }

    /// Blocks whose windowed rows are gone.
    pub fn released(&self) -> usize {
        self.released.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use spindle_models::{KvShape, KvType, PagedKv, RecurrentState};

    use super::*;

    fn ids(blocks: &[u32]) -> Vec<BlockId> {
        blocks.iter().map(|&b| BlockId(b)).collect()
    }

    #[test]
    fn a_resume_needs_the_window_before_it() {
        let mut rows = WindowRows::new(Some(8), 4).unwrap();
        assert!(WindowRows::new(None, 4).is_none());
        let blocks = ids(&[10, 11, 12, 13, 14]);
        // Resuming at 18 reads positions 10..18: blocks 2..=4.
        assert_eq!(rows.window_before(&blocks, 18), &blocks[2..]);
        assert_eq!(rows.window_before(&blocks, 5), &blocks[..]);
        rows.mark_released(&ids(&[11]));
        assert!(rows.intact(&blocks, 18));
        assert!(!rows.intact(&blocks[..4], 13), "13 reads from position 5, in block 11");
        rows.reallocated(BlockId(11));
        assert!(rows.intact(&blocks[..4], 13));
        assert_eq!(rows.released(), 0);
    }

    #[test]
    fn pins_are_counted() {
        let mut rows = WindowRows::new(Some(8), 4).unwrap();
        let blocks = ids(&[1, 2, 3, 4]);
        let a = rows.pin(&blocks, 16);
        let b = rows.pin(&blocks[..3], 12);
        assert_eq!((a, b.clone()), (ids(&[3, 4]), ids(&[2, 3])));
        assert_eq!(rows.pins[&BlockId(3)], 2);
        rows.unpin(&b);
        assert_eq!(rows.pins.get(&BlockId(2)), None);
        assert_eq!(rows.pins[&BlockId(3)], 1);
    }

    #[test]
    fn blocks_go_once_every_holder_is_a_window_past_them_and_no_snapshot_pins_them() {
        let shape = KvShape { kv_heads: 1, head_dim: 32, window: Some(8) };
        let kv = Arc::new(PagedKv::new(&[Some(shape)], KvType::F32, 16, 4));
        let cache = |blocks: &[u32], len| {
            SequenceCache::resume(kv.clone(), blocks.to_vec(), len, RecurrentState::none(1), 64)
        };
        let mut rows = WindowRows::new(Some(8), 4).unwrap();
        // `a` is a window past blocks 0, 1, 2; `b`, sharing 0 and 1, past none.
        let (a, b) = (cache(&[0, 1, 2, 3, 4], 20), cache(&[0, 1, 5], 10));
        let pinned = rows.pin(&ids(&[0, 1, 2]), 12);
        assert_eq!(rows.releasable([&a, &b].into_iter()), [] as [u32; 0], "2 is pinned");
        rows.unpin(&pinned);
        assert_eq!(rows.releasable([&a, &b].into_iter()), [] as [u32; 0], "nothing moved");
        let a = cache(&[0, 1, 2, 3, 4], 24);
        assert_eq!(rows.releasable([&a, &b].into_iter()), [2, 3]);
        assert_eq!(rows.releasable([&b, &a].into_iter()), [] as [u32; 0], "already gone");
        // `b` ended: its blocks are `a`'s alone.
        assert_eq!(rows.releasable([&a].into_iter()), [0, 1]);
        assert_eq!(rows.released(), 4);
        assert!(!rows.intact(&ids(&[0, 1, 2]), 12) && rows.intact(&ids(&[0, 1, 2, 3, 4]), 24));
    }
}
