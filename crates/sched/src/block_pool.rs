//! Fixed-size KV blocks handed out by reference count. A sequence holds the blocks of its
//! positions; the prefix cache and other sequences with the same prefix hold the same blocks
//! again instead of copying them. A block returns to the free list when its last holder lets go.
//!
//! Free blocks are reused lowest id first, so allocation order is deterministic (and so are the
//! tests and any placement that depends on it).

use std::collections::BTreeSet;

/// Index of a block in the pool's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u32);

/// Not enough free blocks for a request; nothing was allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the KV cache needs {needed} more blocks but only {free} are free")]
pub struct PoolExhausted {
    pub needed: usize,
    pub free: usize,
}

pub struct BlockPool {
    block_size: usize,
    /// Holders of each block; 0 means free.
    refs: Vec<u32>,
    free: BTreeSet<u32>,
}

impl BlockPool {
    /// A pool of `blocks` blocks of `block_size` positions each.
    pub fn new(blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "blocks hold at least one position");
        Self { block_size, refs: vec![0; blocks], free: (0..blocks as u32).collect() }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks needed to hold `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size)
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn total_blocks(&self) -> usize {
        self.refs.len()
    }

    /// `n` fresh blocks, each with one holder, lowest ids first; all or nothing.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, PoolExhausted> {
        if n > self.free.len() {
            return Err(PoolExhausted { needed: n, free: self.free.len() });
        }
        let ids: Vec<u32> = self.free.iter().take(n).copied().collect();
        for &id in &ids {
            self.free.remove(&id);
            self.refs[id as usize] = 1;
        }
        Ok(ids.into_iter().map(BlockId).collect())
    }

    /// One more holder of each of `blocks` (a sequence reusing a cached prefix).
    ///
    /// # Panics
    /// If a block is free: sharing a block nobody holds is a bookkeeping bug.
    pub fn share(&mut self, blocks: &[BlockId]) {
        for b in blocks {
            let refs = &mut self.refs[b.0 as usize];
            assert!(*refs > 0, "sharing free block {}", b.0);
            *refs += 1;
        }
    }

    /// One holder fewer for each of `blocks`; blocks nobody holds any more become free.
    ///
    /// # Panics
    /// If a block is already free (a double release).
    pub fn release(&mut self, blocks: &[BlockId]) {
        for b in blocks {
            let refs = &mut self.refs[b.0 as usize];
            assert!(*refs > 0, "releasing free block {}", b.0);
            *refs -= 1;
            if *refs == 0 {
                self.free.insert(b.0);
            }
        }
    }

    /// Current holders of `block`.
    pub fn holders(&self, block: BlockId) -> u32 {
        self.refs[block.0 as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<BlockId> {
        v.iter().map(|&i| BlockId(i)).collect()
    }

    #[test]
    fn allocation_takes_the_lowest_free_ids_all_or_nothing() {
        let mut pool = BlockPool::new(4, 16);
        assert_eq!(pool.blocks_for(0), 0);
        assert_eq!(pool.blocks_for(16), 1);
        assert_eq!(pool.blocks_for(17), 2);
        assert_eq!(pool.allocate(3).unwrap(), ids(&[0, 1, 2]));
        assert_eq!(pool.allocate(2), Err(PoolExhausted { needed: 2, free: 1 }));
        assert_eq!(pool.free_blocks(), 1, "a refused allocation takes nothing");
        pool.release(&ids(&[1]));
        assert_eq!(pool.allocate(2).unwrap(), ids(&[1, 3]));
        assert_eq!(pool.free_blocks(), 0);
    }

    #[test]
    fn shared_blocks_are_freed_by_their_last_holder() {
        let mut pool = BlockPool::new(3, 8);
        let prefix = pool.allocate(2).unwrap();
        pool.share(&prefix); // a second sequence reuses the prefix
        assert_eq!(pool.holders(prefix[0]), 2);
        pool.release(&prefix); // the first sequence ends
        assert_eq!(pool.free_blocks(), 1, "still held by the second");
        assert_eq!(pool.holders(prefix[1]), 1);
        pool.release(&prefix);
        assert_eq!(pool.free_blocks(), 3);
        assert_eq!(pool.holders(prefix[0]), 0);
        assert_eq!(pool.total_blocks(), 3);
    }

    #[test]
    #[should_panic(expected = "releasing free block 0")]
    fn a_double_release_is_caught() {
        let mut pool = BlockPool::new(1, 8);
        let b = pool.allocate(1).unwrap();
        pool.release(&b);
        pool.release(&b);
    }

    #[test]
    #[should_panic(expected = "sharing free block 0")]
    fn sharing_a_free_block_is_caught() {
        let mut pool = BlockPool::new(1, 8);
        pool.share(&ids(&[0]));
    }
}
