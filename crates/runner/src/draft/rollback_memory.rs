//! Memory for the states a hybrid model's linear-attention layers keep while a pass verifies
//! drafts: one whole recurrent state per drafted position, so that rejected drafts are
//! forgotten by taking the last accepted position's (`spindle_models::SequenceCache::truncate`).
//! On a Qwen3.5-35B-A3B shape that is ~60 MiB per drafted position, ~480 MiB for a sequence
//! drafting 8: too much to leave out of `--kv-cache-memory`. So it is taken out of it, as the
//! draft model's pool is ([`share_rollback_memory`]), and a sequence drafts only as many
//! tokens as it holds states for ([`RollbackStates`]). Attention-only models keep nothing.

use spindle_models::PagedKv;

use crate::prefix_cache::CacheConfig;
use crate::{ModelBundle, SpeculationConfig, MAX_DRAFT};

/// The states take at most a `KV_PARTS`th of the KV memory: speculation speeds decoding up,
/// the pool decides how much context and how many sequences fit, so it keeps most.
const KV_PARTS: usize = 8;

/// What the states of a hybrid model's verification passes take out of the KV memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollbackShare {
    /// Bytes of the states kept for one drafted position (every linear-attention layer's).
    pub position_bytes: usize,
    /// Drafted positions the share holds, over all sequences together.
    pub positions: usize,
}

impl RollbackShare {
    pub fn bytes(&self) -> usize {
        self.position_bytes * self.positions
    }

    /// The startup line: how many sequences can draft how far at once.
    pub fn summary(&self, max_draft: usize) -> String {
        let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
        if self.positions == 0 {
            return format!(
                "speculation on recurrent layers: off (a state of {:.1} MiB per drafted token is more than an eighth of the KV memory; raise --kv-cache-memory)",
                mib(self.position_bytes)
            );
        }
        let full = self.positions / max_draft.max(1);
        let reach = if full > 0 {
            format!("{full} sequences at once draft up to {max_draft} tokens")
        } else {
            format!("one sequence at a time drafts up to {} tokens", self.positions)
        };
        format!(
            "speculation on recurrent layers: {reach} ({:.0} MiB of the KV memory holds {} states of {:.1} MiB, one per drafted token)",
            mib(self.bytes()),
            self.positions,
            mib(self.position_bytes),
        )
    }
}

/// Moves the memory of the states `bundle`'s recurrent layers keep while verifying drafts out of
/// `cache.kv_bytes` into `cache.rollback_bytes`: enough for `max_active` sequences drafting
/// `speculation`'s most tokens, at most an eighth of the KV memory. `None` (and nothing moved)
/// for a model without recurrent layers, or when speculation is off.
pub fn share_rollback_memory(
    bundle: &ModelBundle,
    cache: &mut CacheConfig,
    max_active: usize,
    speculation: &SpeculationConfig,
) -> Option<RollbackShare> {
    let position_bytes = bundle.model.initial_recurrent_state().bytes();
    let max_draft = speculation.max_draft.min(MAX_DRAFT);
    if position_bytes == 0 || max_draft == 0 {
        return None;
    }
    let wanted = max_active.max(1) * max_draft;
    let positions = wanted.min(cache.kv_bytes / KV_PARTS / position_bytes);
    let share = RollbackShare { position_bytes, positions };
    // Whole blocks stay with the pool, the states take the rest.
    let block = PagedKv::block_bytes(&bundle.model.kv_shapes(), cache.kv_type, cache.block_size);
    let pool = cache.kv_bytes - share.bytes();
    cache.kv_bytes = pool - pool % block.max(1);
    cache.rollback_bytes = Some(share.bytes());
    Some(share)
}

/// The drafted positions whose states the sequences may hold, handed out as they draft and
/// given back when they end: a state slot, once a pass used it, stays with its sequence.
#[derive(Debug)]
pub struct RollbackStates {
    /// Positions not held by any sequence; `None` where nothing is counted (an attention-only
    /// model, or a cache configured without a share: one-sequence runs and tests).
    free: Option<usize>,
}

/// The states one sequence holds: the most tokens it drafted in one round so far.
#[derive(Debug, Default)]
pub struct RollbackHold(usize);

impl RollbackStates {
    /// All of `cache`'s share free, for `bundle`'s model.
    pub fn new(bundle: &ModelBundle, cache: &CacheConfig) -> Self {
        let position_bytes = bundle.model.initial_recurrent_state().bytes();
        let free = match cache.rollback_bytes {
            Some(bytes) if position_bytes > 0 => Some(bytes / position_bytes),
            _ => None,
        };
        Self { free }
    }

    /// Most tokens a sequence holding `hold` may draft this round.
    pub fn allowance(&self, hold: &RollbackHold) -> usize {
        self.free.map_or(usize::MAX, |free| hold.0 + free)
    }

    /// Lets `hold` draft `drafts` tokens (no more than [`Self::allowance`]).
    pub fn hold(&mut self, hold: &mut RollbackHold, drafts: usize) {
        if let Some(free) = &mut self.free {
            let more = drafts.saturating_sub(hold.0);
            debug_assert!(more <= *free, "drafts beyond the allowance");
            *free -= more.min(*free);
            hold.0 = hold.0.max(drafts);
        }
    }

    /// Takes back what an ended or preempted sequence held.
    pub fn release(&mut self, hold: &RollbackHold) {
        if let Some(free) = &mut self.free {
            *free += hold.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_holds_its_longest_round_until_it_gives_it_back() {
        let mut states = RollbackStates { free: Some(10) };
        let (mut a, mut b) = (RollbackHold::default(), RollbackHold::default());
        states.hold(&mut a, 4);
        states.hold(&mut a, 2);
        assert_eq!(states.allowance(&a), 10, "a shorter round takes nothing more");
        assert_eq!(states.allowance(&b), 6);
        states.hold(&mut b, 6);
        assert_eq!(states.allowance(&b), 6);
        assert_eq!(states.allowance(&RollbackHold::default()), 0, "all held");
        states.release(&a);
        assert_eq!(states.allowance(&RollbackHold::default()), 4);
    }

    #[test]
    fn nothing_is_counted_without_a_share() {
        let mut states = RollbackStates { free: None };
        let mut hold = RollbackHold::default();
        states.hold(&mut hold, 8);
        assert_eq!(states.allowance(&hold), usize::MAX);
    }

    #[test]
    fn the_summary_says_how_many_draft_how_far() {
        let share = RollbackShare { position_bytes: 60 << 20, positions: 16 };
        let line = share.summary(8);
        assert!(line.contains("2 sequences at once draft up to 8 tokens"), "{line}");
        assert!(line.contains("960 MiB"), "{line}");
        let small = RollbackShare { position_bytes: 60 << 20, positions: 3 };
        assert!(small.summary(8).contains("one sequence at a time drafts up to 3"));
        let none = RollbackShare { position_bytes: 60 << 20, positions: 0 };
        assert!(none.summary(8).contains("off"), "{}", none.summary(8));
    }
}
