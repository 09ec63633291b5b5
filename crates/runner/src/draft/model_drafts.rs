//! Drafting with the draft model: each speculating sequence keeps the draft's cache of its
//! tokens, and a round runs the draft greedily from there, every sequence that asks in one
//! batched pass per drafted position. The draft follows what the target
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

use std::ops::Range;
use std::sync::Arc;

use spindle_models::{BatchEntry, PagedKv, SequenceCache};
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

/// One sequence's part of a draft round.
pub struct DraftRound<'a> {
    pub state: &'a mut ModelDraft,
    /// The sequence's prompt and decided tokens.
    pub history: &'a [u32],
    /// Most tokens to draft.
    pub want: usize,
}

/// What a sequence reads into the draft first in a round.
struct Read {
    /// Positions of its history.
    range: Range<usize>,
    /// Whether it drafts after them (not while it catches up).
    drafts: bool,
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

    /// For each round, up to its `want` tokens the draft model picks greedily after its
    /// `history`, all sequences in one batched pass of the draft per drafted position; empty
    /// for a sequence that is catching up or whose blocks ran out, and for every sequence of a
    /// pass that failed (drafts are optional: those sequences decode plainly).
    pub fn propose(&mut self, rounds: &mut [DraftRound<'_>]) -> Vec<Vec<u32>> {
        let reads: Vec<Option<Read>> = rounds.iter_mut().map(|round| self.prepare(round)).collect();
        let mut drafts = vec![Vec::new(); rounds.len()];
        let reading: Vec<usize> = (0..rounds.len()).filter(|&i| reads[i].is_some()).collect();
        let unseen: Vec<&[u32]> = (reading.iter())
            .map(|&i| {
                let history = rounds[i].history;
                &history[reads[i].as_ref().expect("reading").range.clone()]
            })
            .collect();
        let Some(logits) = self.pass(rounds, &reading, &unseen) else { return drafts };
        let mut drafting = Vec::new();
        for (&i, logits) in reading.iter().zip(logits) {
            let read = reads[i].as_ref().expect("reading");
            rounds[i].state.followed += read.range.len();
            if read.drafts {
                drafts[i].push(argmax(&logits).0);
                drafting.push(i);
            }
        }
        loop {
            drafting.retain(|&i| drafts[i].len() < rounds[i].want);
            if drafting.is_empty() {
                return drafts;
            }
            let lasts: Vec<[u32; 1]> =
                drafting.iter().map(|&i| [*drafts[i].last().expect("drafted")]).collect();
            let tokens: Vec<&[u32]> = lasts.iter().map(|last| last.as_slice()).collect();
            let Some(logits) = self.pass(rounds, &drafting, &tokens) else {
                drafting.iter().for_each(|&i| drafts[i].clear());
                return drafts;
            };
            for ((&i, last), logits) in drafting.iter().zip(&lasts).zip(logits) {
                rounds[i].state.ran.push(last[0]);
                drafts[i].push(argmax(&logits).0);
            }
        }
    }

    /// Gives back the blocks of a sequence that ended or was preempted.
    pub fn release(&mut self, state: &ModelDraft) {
        let blocks: Vec<BlockId> = state.cache.blocks().iter().map(|&b| BlockId(b)).collect();
        self.blocks.release(&blocks);
    }

    /// Brings `round`'s draft state in line with its history (the drafts the target took are
    /// kept, the rest forgotten) and reserves blocks for what it reads first this round; `None`
    /// when it reads nothing.
    fn prepare(&mut self, round: &mut DraftRound<'_>) -> Option<Read> {
        let (state, history) = (&mut *round.state, round.history);
        let seen = &history[state.followed.min(history.len())..];
        let accepted = state.ran.iter().zip(seen).take_while(|(ran, token)| ran == token).count();
        state.followed += accepted;
        state.ran.clear();
        let beyond_reach = history.len() > state.cache.limit();
        if state.cache.truncate(state.followed).is_err() || beyond_reach {
            return None;
        }
        let unseen = state.followed..history.len();
        if unseen.is_empty() {
            return None;
        }
        if unseen.len() > CATCH_UP_TOKENS {
            let range = state.followed..state.followed + CATCH_UP_TOKENS;
            return self
                .reserve(&mut state.cache, CATCH_UP_TOKENS)
                .then_some(Read { range, drafts: false });
        }
        round.want = round.want.min((state.cache.limit() + 1).saturating_sub(history.len()));
        let positions = unseen.len() + round.want.saturating_sub(1);
        if round.want == 0 || !self.reserve(&mut state.cache, positions) {
            return None;
        }
        Some(Read { range: unseen, drafts: true })
    }

    /// Runs `tokens[k]` through the draft after what the `k`-th of `members` (ascending
    /// indices into `rounds`) holds, in one batch: the logits after each; `None` when the pass
    /// failed, and then those sequences' drafts start over.
    fn pass(
        &self,
        rounds: &mut [DraftRound<'_>],
        members: &[usize],
        tokens: &[&[u32]],
    ) -> Option<Vec<Vec<f32>>> {
        let mut entries: Vec<BatchEntry> = (rounds.iter_mut().enumerate())
            .filter(|(i, _)| members.binary_search(i).is_ok())
            .zip(tokens)
            .map(|((_, round), tokens)| BatchEntry::new(tokens, &mut round.state.cache))
            .collect();
        let ran = self.draft.model.forward_batch(&mut entries);
        drop(entries);
        match ran {
            Ok(logits) => Some(logits),
            Err(error) => {
                for &i in members {
                    self.failed(rounds[i].state, &error);
                }
                None
            }
        }
    }

    /// After a failed draft step the cache's last positions are unknown: the draft reads the
    /// sequence again from its start.
    fn failed(&self, state: &mut ModelDraft, error: &spindle_models::ModelError) {
        tracing::warn!(draft = %self.draft.name, %error, "a draft model step failed");
        state.followed = 0;
        state.ran.clear();
        let _ = state.cache.truncate(0);
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
        let drafts = std::iter::repeat_with(|| propose(pool, &mut state, history, want))
            .find(|drafts| !drafts.is_empty())
            .unwrap();
        pool.release(&state);
        drafts
    }

    /// One sequence's round alone.
    fn propose(
        pool: &mut DraftPool,
        state: &mut ModelDraft,
        history: &[u32],
        want: usize,
    ) -> Vec<u32> {
        let round = DraftRound { state, history, want };
        pool.propose(&mut [round]).pop().unwrap()
    }

    #[test]
    fn the_draft_follows_the_decided_tokens_as_if_it_had_read_them_afresh() {
        let mut pool = pool();
        let mut state = pool.start(4096);
        // Longer than a step's catch-up: read over two steps, drafting on the second.
        let mut history: Vec<u32> = (0..CATCH_UP_TOKENS as u32 + 40).map(|i| i * 7 % 512).collect();
        assert!(propose(&mut pool, &mut state, &history, 4).is_empty(), "still catching up");
        let drafts = propose(&mut pool, &mut state, &history, 4);
        assert_eq!(drafts, fresh(&mut pool, &history, 4));
        // The second draft rejected: the target's own token follows the first.
        history.extend([drafts[0], (drafts[1] + 1) % 512]);
        let drafts = propose(&mut pool, &mut state, &history, 4);
        assert_eq!(drafts, fresh(&mut pool, &history, 4), "after a rejection");
        // Every draft accepted, then the target's next token.
        history.extend(&drafts);
        history.push(3);
        let drafts = propose(&mut pool, &mut state, &history, 6);
        assert_eq!(drafts, fresh(&mut pool, &history, 6), "after a full acceptance");
        assert_eq!(state.cache.len(), history.len() + 5, "the last draft is not run");
        pool.release(&state);
        assert_eq!(pool.blocks.free_blocks(), pool.blocks.total_blocks());
    }

    #[test]
    fn sequences_drafting_in_one_batch_draft_what_each_drafts_alone() {
        let mut pool = pool();
        let histories: [Vec<u32>; 3] =
            [(1..40).collect(), (100..107).collect(), (0..CATCH_UP_TOKENS as u32 + 1).collect()];
        let mut states: Vec<ModelDraft> = histories.iter().map(|_| pool.start(4096)).collect();
        let mut rounds: Vec<DraftRound> = (states.iter_mut().zip(&histories))
            .zip([3, 5, 4])
            .map(|((state, history), want)| DraftRound { state, history, want })
            .collect();
        let drafts = pool.propose(&mut rounds);
        assert_eq!(drafts[0], fresh(&mut pool, &histories[0], 3));
        assert_eq!(drafts[1], fresh(&mut pool, &histories[1], 5));
        assert!(drafts[2].is_empty(), "the third catches up");
    }
}
