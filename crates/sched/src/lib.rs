//! Scheduling without tensors: the KV block pool, the prefix tree that caches prompt prefixes
//! in it, and (next) the token-budget scheduler. Everything here is plain data, tested exactly.
//!
//! A prompt's way through the cache:
//! 1. [`PrefixTree::lookup`] lists the places it can resume from; the engine picks one and
//!    shares its blocks ([`BlockPool::share`]), copying a partial block into one of its own.
//! 2. The engine allocates blocks for the rest ([`PrefixTree::make_room`] first when the pool
//!    is short), computes them, and [`PrefixTree::insert`]s the prompt with an optional snapshot.
//! 3. When the sequence ends it releases its blocks; the tree keeps its own references until
//!    eviction.

mod block_pool;
mod prefix_tree;

pub use block_pool::{BlockId, BlockPool, PoolExhausted};
pub use prefix_tree::{CacheKind, Inserted, NodeId, NodeView, PrefixTree, ResumePoint, SnapshotId};
