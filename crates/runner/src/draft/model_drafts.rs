//! Drafting with the draft model: each speculating sequence keeps the draft's cache of its
//! tokens, and a round runs the draft greedily from there. The draft follows what the target
//! decided, not what it proposed: at the next round the positions the target rejected are
//! forgotten (truncated, as the target's own cache forgets them) and the draft reads the tokens
//! it has not seen (the last accepted draft, the target's own token), so no accepted position
//! is computed twice.
//!
//! The draft's keys and values live in a paged pool of their own, with the target's block size
//! and number type, carved out of the same memory budget ([`DraftModel::share_kv_memory`]).
//! Not in the target's pool: its blocks are shaped for the target's layers. Nor in the prefix
//! cache: a cached block would hold valid draft rows only if every path that fills one (plain
//! requests, the disk tier, prompts read for clients that left) had run the draft as well,
//! which would charge the draft's prefill to requests that never speculate. A sequence reads
//! its prompt into the draft instead, [`CATCH_UP_TOKENS`] a step, decoding plainly meanwhile.

use std::sync::Arc;

use spindle_models::{PagedKv, SequenceCache};
use spindle_sched::{BlockId, BlockPool};

use super::draft_model::DraftModel;
use crate::prefix_cache::CacheConfig;
use crate::sampler::argmax;

/// Positions a sequence reads into the draft per step while it catches up (a prompt, or a run
/// of lookup drafts the draft did not see): a draft model a fraction of the target's size reads
/// them in a fraction of a prefill chunk's time, so the step stays short for everyone.
const CATCH_UP_TOKENS: usize = 512;

/// The draft model and the KV pool all sequences' drafts share; the engine owns it.
pub struct DraftPool {
    draft: Arc<DraftModel>,
    kv: Arc<PagedKv>,
    blocks: BlockPool,
}

/// One sequence's draft state: the draft's cache holds the sequence's first `followed` tokens,
/// then the drafts of the last round it ran.
pub struct ModelDraft {
    cache: SequenceCache,
    followed: usize,
    ran: Vec<u32>,
}

impl DraftPool {
    pub fn new(draft: Arc<DraftModel>, cache: &CacheConfig) -> Self {
        let blocks = draft.kv_blocks(cache);
        let shapes = draft.model.kv_shapes();
        let kv = Arc::new(PagedKv::new(&shapes, cache.kv_type, blocks, cache.block_size));
        Self { draft, kv, blocks: BlockPool::new(blocks, cache.block_size) }
    }

    /// An empty draft state for a sequence of at most `context` positions.
    pub fn start(&self, context: usize) -> ModelDraft {
        let limit = context.min(self.draft.model.config().max_position_embeddings);
        let recurrent = self.draft.model.initial_recurrent_state();
        let cache = SequenceCache::resume(self.kv.clone(), Vec::new(), 0, recurrent, limit);
        ModelDraft { cache, followed: 0, ran: Vec::new() }
    }

    /// Up to `want` tokens the draft model picks greedily after `history` (the sequence's
    /// prompt and decided tokens); empty while it catches up, when its pool is full, or on a
    /// failed step of the draft (drafts are optional: the sequence decodes plainly).
    pub fn propose(&mut self, state: &mut ModelDraft, history: &[u32], want: usize) -> Vec<u32> {
        let seen = &history[state.followed.min(history.len())..];
        let accepted = state.ran.iter().zip(seen).take_while(|(ran, token)| ran == token).count();
        state.followed += accepted;
        state.ran.clear();
        let beyond_reach = history.len() > state.cache.limit();
        if state.cache.truncate(state.followed).is_err() || beyond_reach {
            return Vec::new();
        }
        let unseen = &history[state.followed..];
        if unseen.is_empty() {
            return Vec::new();
        }
        if unseen.len() > CATCH_UP_TOKENS {
            let chunk = &unseen[..CATCH_UP_TOKENS];
            if self.reserve(&mut state.cache, chunk.len()) {
                self.run(state, chunk);
            }
            return Vec::new();
        }
        let want = want.min((state.cache.limit() + 1).saturating_sub(history.len()));
        if want == 0 || !self.reserve(&mut state.cache, unseen.len() + want - 1) {
            return Vec::new();
        }
        let Some(mut logits) = self.run(state, unseen) else { return Vec::new() };
        let mut drafts = vec![argmax(&logits).0];
        while drafts.len() < want {
            let last = *drafts.last().expect("one draft at least");
            match self.draft.model.forward(&[last], &mut state.cache) {
                Ok(next) => logits = next,
                Err(e) => return self.failed(state, &e),
            }
            state.ran.push(last);
            drafts.push(argmax(&logits).0);
        }
        drafts
    }

    /// Gives back the blocks of a sequence that ended or was preempted.
    pub fn release(&mut self, state: &ModelDraft) {
        let blocks: Vec<BlockId> = state.cache.blocks().iter().map(|&b| BlockId(b)).collect();
        self.blocks.release(&blocks);
    }

    /// Runs `tokens` (the next of the sequence's own) through the draft: the logits after them.
    fn run(&self, state: &mut ModelDraft, tokens: &[u32]) -> Option<Vec<f32>> {
        match self.draft.model.forward(tokens, &mut state.cache) {
            Ok(logits) => {
                state.followed += tokens.len();
                Some(logits)
            }
            Err(e) => {
                self.failed(state, &e);
                None
            }
        }
    }

    /// After a failed draft step the cache's last positions are unknown: the draft reads the
    /// sequence again from its start.
    fn failed(&self, state: &mut ModelDraft, error: &spindle_models::ModelError) -> Vec<u32> {
        tracing::warn!(draft = %self.draft.name, %error, "a draft model step failed");
        state.followed = 0;
        state.ran.clear();
        let _ = state.cache.truncate(0);
        Vec::new()
    }

    /// Adds the blocks `cache` needs for `positions` more; false when the pool is out of them.
    fn reserve(&mut self, cache: &mut SequenceCache, positions: usize) -> bool {
        let needed = cache.blocks_needed(positions);
        match self.blocks.allocate(needed) {
            Ok(blocks) => {
                cache.add_blocks(&blocks.iter().map(|b| b.0).collect::<Vec<_>>());
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use spindle_models::random_dense::{write_random_dense, DenseShape};

    use super::*;

    /// A pool over a tiny random model of 512 ids, holding 2,048 positions.
    fn pool() -> DraftPool {
        let dir = tempfile::tempdir().unwrap();
        write_random_dense(dir.path(), &DenseShape::tiny(512), 9, &[]).unwrap();
        let model = spindle_models::load_safetensors(dir.path()).unwrap();
        let draft = Arc::new(DraftModel::new(model, "random").unwrap());
        let cache = CacheConfig { draft_kv_bytes: 1 << 20, ..CacheConfig::default() };
        DraftPool::new(draft, &cache)
    }

    /// What a draft that reads `history` from scratch proposes.
    fn fresh(pool: &mut DraftPool, history: &[u32], want: usize) -> Vec<u32> {
        let mut state = pool.start(4096);
        let drafts = std::iter::repeat_with(|| pool.propose(&mut state, history, want))
            .find(|drafts| !drafts.is_empty())
            .unwrap();
        pool.release(&state);
        drafts
    }

    #[test]
    fn the_draft_follows_the_decided_tokens_as_if_it_had_read_them_afresh() {
        let mut pool = pool();
        let mut state = pool.start(4096);
        // Longer than a step's catch-up: read over two steps, drafting on the second.
        let mut history: Vec<u32> = (0..CATCH_UP_TOKENS as u32 + 40).map(|i| i * 7 % 512).collect();
        assert!(pool.propose(&mut state, &history, 4).is_empty(), "still catching up");
        let drafts = pool.propose(&mut state, &history, 4);
        assert_eq!(drafts, fresh(&mut pool, &history, 4));
        // The second draft rejected: the target's own token follows the first.
        history.extend([drafts[0], (drafts[1] + 1) % 512]);
        let drafts = pool.propose(&mut state, &history, 4);
        assert_eq!(drafts, fresh(&mut pool, &history, 4), "after a rejection");
        // Every draft accepted, then the target's next token.
        history.extend(&drafts);
        history.push(3);
        let drafts = pool.propose(&mut state, &history, 6);
        assert_eq!(drafts, fresh(&mut pool, &history, 6), "after a full acceptance");
        assert_eq!(state.cache.len(), history.len() + 5, "the last draft is not run");
        pool.release(&state);
        assert_eq!(pool.blocks.free_blocks(), pool.blocks.total_blocks());
    }
}
