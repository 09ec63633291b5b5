//! Scheduling without tensors: the KV block pool, the prefix tree that caches prompt prefixes
//! in it, and the token-budget scheduler that decides what each model step runs. Everything
//! here is plain data, tested exactly.
//!
//! A request's way through the engine:
//! 1. [`Scheduler::enqueue`] queues it; [`Scheduler::admit`] lets it in once the engine's
//!    admission check finds cache room.
//! 2. [`PrefixTree::lookup`] lists the places its prompt can resume from; the engine picks one
//!    and shares its blocks ([`BlockPool::share`]), copying a partial block into one of its own,
//!    then allocates blocks for the rest ([`PrefixTree::make_room`] first when the pool is short)
//!    and hands the uncached part's chunks to [`Scheduler::start`].
//! 3. Each [`Scheduler::plan`] says which chunks and decode tokens the next model step runs.
//!    Once the prompt is in, the engine [`PrefixTree::insert`]s it with an optional snapshot.
//! 4. When the sequence ends, [`Scheduler::remove`] forgets it and it releases its blocks; the
//!    tree keeps its own references until eviction.

mod block_pool;
mod prefill_plan;
mod prefix_tree;
mod scheduler;

pub use block_pool::{BlockId, BlockPool, PoolExhausted};
pub use prefill_plan::PrefillPlan;
pub use prefix_tree::{
    BlockChange, CacheKind, Inserted, NodeId, NodeView, PrefixTree, ResumePoint, SnapshotId,
};
pub use scheduler::{Scheduler, SchedulerConfig, SeqId, StepPlan};
