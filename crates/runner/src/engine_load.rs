//! What the engine counts for the server's `/metrics`: gauges of its load and counters of its
//! work, atomics the engine thread writes and any thread reads. A speculative round is counted
//! before the sequence can end in it, so a scrape after a response includes all its drafts.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Gauges and counters the server exports.
#[derive(Debug, Default)]
pub struct EngineLoad {
    pub waiting: AtomicUsize,
    pub active: AtomicUsize,
    /// Prompt positions read for requests whose client had gone (kept for a retry).
    pub orphan_prefill_tokens: AtomicUsize,
    /// Of those, positions later requests took from the prefix cache (each time they did).
    pub orphan_tokens_reused: AtomicUsize,
    /// Sequences sent back to the queue because the KV pool ran out.
    pub preemptions: AtomicUsize,
    /// KV blocks running sequences hold (shared ones once), and blocks in the pool.
    pub kv_blocks_used: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    /// Bytes of prefix-cache snapshots kept in memory.
    pub snapshot_bytes: AtomicUsize,
    /// KV blocks whose sliding-window layers' rows were given back to the OS.
    pub kv_window_released_blocks: AtomicUsize,
    /// Speculative rounds that drafted, the tokens they drafted, and those the model accepted.
    pub spec_drafts: AtomicUsize,
    pub spec_draft_tokens: AtomicUsize,
    pub spec_accepted_tokens: AtomicUsize,
    /// Per draft position (first, second, ...), how often it was accepted.
    pub spec_accepted_by_position: [AtomicUsize; MAX_DRAFT],
}

/// The most tokens a round may draft.
pub const MAX_DRAFT: usize = 16;

impl EngineLoad {
    /// Counts a round of `drafted` drafts, before any of them is decided.
    pub(crate) fn count_drafts(&self, drafted: usize) {
        if drafted > 0 {
            self.spec_drafts.fetch_add(1, Ordering::Relaxed);
            self.spec_draft_tokens.fetch_add(drafted, Ordering::Relaxed);
        }
    }

    /// Counts the round's draft at `position` as accepted (its drafts before it were).
    pub(crate) fn count_accepted(&self, position: usize) {
        self.spec_accepted_tokens.fetch_add(1, Ordering::Relaxed);
        if let Some(count) = self.spec_accepted_by_position.get(position) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}
