//! Drafts from the model's multi-token-prediction head (Qwen3.5 / Qwen3.6 / Qwen3-Next
//! checkpoints that carry one; see `spindle_models::DraftHead`). The head needs the target's final
//! hidden state at every position, each paired with the token after it, so after every pass of the
//! sequence (prompt chunks included) it runs over the pass's rows whose next token is known; the
//! last row waits for its token to be decided. Drafting then runs that row with the decided token
//! (its logits give the first draft) and chains the head on its own output for the rest. The
//! drafts are the head's greedy picks whatever the request samples with: they are only proposals,
//! and verification keeps exactly what plain decoding would have produced.
//!
//! The head's attention cache (one layer, its own storage) holds the target's positions from
//! `origin` on. Where positions arrive out of order it follows the target: a pass that starts
//! earlier (a rollback, the drafts' own verification) truncates it, and one that skips positions
//! (a prompt served from the prefix cache, a step the sequence did not draft in) starts it afresh
//! there; the head then attends over less context, which costs acceptance, never correctness.
//! So does a head whose cache holds fewer positions than the target's context (on a GPU, where
//! its keys and values take device memory per sequence): when the next rows and a round's drafts
//! would not fit, it starts afresh at the latest rows that do.

use spindle_models::{CausalLm, DraftHead, SequenceCache};

use crate::error::RunnerError;
use crate::sampler::argmax;

pub struct MtpDrafter {
    /// The head's attention cache: its position `i` is the target's position `origin + i`.
    cache: SequenceCache,
    origin: usize,
    /// The hidden state at position `origin + cache.len()`, whose next token was not decided
    /// when its pass ran.
    waiting: Option<Vec<f32>>,
    /// Where the row of the target's latest position ran as soon as its pass did (its next token
    /// was decided already: a draft's correction): that position, the head's greedy draft from
    /// it and its output, which the next round starts from.
    ran_last: Option<(usize, u32, Vec<f32>)>,
    /// Most tokens to draft per round.
    max_length: usize,
}

impl MtpDrafter {
    /// A drafter for the sequence whose cache is `target` (which from now on keeps its final
    /// hidden states); `None` when the model has no head.
    pub fn new(
        model: &dyn CausalLm,
        target: &mut SequenceCache,
        max_length: usize,
    ) -> Option<Self> {
        let head = model.draft_head()?;
        target.keep_hidden_states();
        Some(Self {
            cache: head.new_cache(target.limit()),
            origin: target.len(),
            waiting: None,
            ran_last: None,
            max_length,
        })
    }

    /// Runs the head over the latest pass of `target`, whose sequence so far is `tokens`.
    pub fn observe(
        &mut self,
        model: &dyn CausalLm,
        target: &SequenceCache,
        tokens: &[u32],
    ) -> Result<(), RunnerError> {
        let head = head_of(model)?;
        let Some((from, rows)) = target.hidden_states() else { return Ok(()) };
        let count = target.len().saturating_sub(from);
        if count == 0 {
            return Ok(());
        }
        let width = rows.len() / count;
        self.ran_last = None;
        let fed = self.origin + self.cache.len();
        let expected = fed + usize::from(self.waiting.is_some());
        let mut start = from;
        let mut hidden = Vec::with_capacity(rows.len() + width);
        if from == expected {
            if let Some(row) = self.waiting.take() {
                hidden.extend_from_slice(&row);
                start = fed;
            }
        } else if (self.origin..=fed).contains(&from) {
            self.cache.truncate(from - self.origin).map_err(model_error)?;
            self.waiting = None;
        } else {
            self.cache = head.new_cache(target.limit());
            self.origin = from;
            self.waiting = None;
        }
        hidden.extend_from_slice(rows);
        let room = self.cache.limit().saturating_sub(self.max_length + 1);
        if self.cache.len() + hidden.len() / width > room {
            let skipped = (hidden.len() / width).saturating_sub(room);
            self.cache = head.new_cache(target.limit());
            start += skipped;
            self.origin = start;
            hidden.drain(..skipped * width);
        }
        // Rows whose next token is known run now; the last may have to wait for it.
        let total = hidden.len() / width;
        let ready = total.min(tokens.len().saturating_sub(start + 1));
        if ready > 0 {
            let next = &tokens[start + 1..start + 1 + ready];
            let out = head.predict(&hidden[..ready * width], next, &mut self.cache);
            let mut out = out.map_err(model_error)?;
            if let (true, Some(logits), Some(row)) =
                (ready == total, out.logits.last(), out.hidden.pop())
            {
                self.ran_last = Some((start + ready - 1, argmax(logits).0, row));
            }
        }
        if ready < total {
            self.waiting = Some(hidden[ready * width..(ready + 1) * width].to_vec());
        }
        Ok(())
    }

    /// Up to `room` drafts to follow `tokens` (whose last is the token just decided, not yet run);
    /// empty when the head has not seen the position before it.
    pub fn propose(
        &mut self,
        model: &dyn CausalLm,
        tokens: &[u32],
        room: usize,
    ) -> Result<Vec<u32>, RunnerError> {
        let head = head_of(model)?;
        let want = room.min(self.max_length);
        // The position before the decided token, whose row gives the first draft.
        let Some(position) = tokens.len().checked_sub(2).filter(|_| want > 0) else {
            return Ok(Vec::new());
        };
        let waiting_here = self.origin + self.cache.len() == position;
        let first = match (&self.waiting, &self.ran_last) {
            (Some(_), _) if waiting_here => {
                let row = self.waiting.take().unwrap_or_default();
                head.predict(&row, &tokens[position + 1..], &mut self.cache).map(|mut out| {
                    let hidden = out.hidden.pop().unwrap_or_default();
                    (argmax(&out.logits[0]).0, hidden)
                })
            }
            (_, Some((at, draft, hidden))) if *at == position => Ok((*draft, hidden.clone())),
            _ => return Ok(Vec::new()),
        };
        let mut drafts = Vec::with_capacity(want);
        let mut step = first;
        let ran = loop {
            let (draft, hidden) = match step {
                Ok(next) => next,
                Err(e) => break Err(e),
            };
            drafts.push(draft);
            if drafts.len() == want {
                break Ok(());
            }
            step = head.predict(&hidden, &[draft], &mut self.cache).map(|mut out| {
                let hidden = out.hidden.pop().unwrap_or_default();
                (argmax(&out.logits[0]).0, hidden)
            });
        };
        // The chained rows were the head's guesses: only the decided token's row stays.
        self.cache.truncate(position + 1 - self.origin).map_err(model_error)?;
        ran.map_err(model_error)?;
        Ok(drafts)
    }
}

fn head_of(model: &dyn CausalLm) -> Result<&dyn DraftHead, RunnerError> {
    model.draft_head().ok_or_else(|| RunnerError::Internal("the model lost its MTP head".into()))
}

fn model_error(e: spindle_models::ModelError) -> RunnerError {
    RunnerError::Internal(format!("the MTP head failed: {e}"))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use spindle_models::BatchEntry;

    use super::*;

    /// The drafter's head sees each position's hidden state with the token after it, however the
    /// target's passes came (prompt chunks, a verification cut back, a plain step), so its
    /// drafts are the head's greedy chain over the whole sequence run in one call.
    #[test]
    fn drafts_are_the_head_s_chain_over_every_position() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid/qwen3_5");
        let model = spindle_models::load_safetensors(&dir).unwrap();
        let head = model.draft_head().unwrap();
        let mut target = model.new_cache(128);
        let mut drafter = MtpDrafter::new(&*model, &mut target, 3).unwrap();
        let mut tokens: Vec<u32> = (0..30).map(|i| (i * 53 + 7) % 500).collect();
        let mut all_hidden = Vec::new();
        let keep = |target: &SequenceCache, all: &mut Vec<f32>, width: usize| {
            let (from, rows) = target.hidden_states().unwrap();
            all.truncate(from * width);
            all.extend_from_slice(rows);
        };
        let width = model.config().hidden_size;
        // The prompt in two chunks.
        for chunk in [&tokens[..17], &tokens[17..]] {
            model.forward(chunk, &mut target).unwrap();
            keep(&target, &mut all_hidden, width);
            drafter.observe(&*model, &target, &tokens).unwrap();
        }
        // A decided token and its drafts, verified with two of three kept (the rows past them
        // are forgotten), then a plain step.
        tokens.push(11);
        let drafts = drafter.propose(&*model, &tokens, 8).unwrap();
        assert_eq!(drafts.len(), 3, "at most the drafter's own limit");
        let mut run = vec![11, 12, 13, 14];
        model
            .forward_batch(&mut [BatchEntry { tokens: &run, cache: &mut target, logit_rows: 4 }])
            .unwrap();
        target.truncate(tokens.len() + 2).unwrap();
        keep(&target, &mut all_hidden, width);
        tokens.extend([12, 13, 99]);
        drafter.observe(&*model, &target, &tokens).unwrap();
        run = vec![99];
        model.forward(&run, &mut target).unwrap();
        keep(&target, &mut all_hidden, width);
        tokens.push(42);
        drafter.observe(&*model, &target, &tokens).unwrap();

        let drafts = drafter.propose(&*model, &tokens, 8).unwrap();
        // The reference: every position at once, then the chain.
        assert_eq!(drafts, head_chain(head, &all_hidden, &tokens[1..], 3));
        assert_eq!(all_hidden.len(), (tokens.len() - 1) * width);
    }

    /// A head that caches fewer positions than the target's context (as on a GPU).
    struct ShortHead {
        model: Box<dyn CausalLm>,
        limit: usize,
    }

    impl CausalLm for ShortHead {
        fn config(&self) -> &spindle_models::TransformerConfig {
            self.model.config()
        }

        fn forward_batch(
            &self,
            batch: &mut [BatchEntry<'_>],
        ) -> spindle_models::Result<Vec<Vec<f32>>> {
            self.model.forward_batch(batch)
        }

        fn kv_shapes(&self) -> Vec<Option<spindle_models::KvShape>> {
            self.model.kv_shapes()
        }

        fn initial_recurrent_state(&self) -> spindle_models::RecurrentState {
            self.model.initial_recurrent_state()
        }

        fn draft_head(&self) -> Option<&dyn DraftHead> {
            Some(self)
        }
    }

    impl DraftHead for ShortHead {
        fn new_cache(&self, context: usize) -> SequenceCache {
            self.model.draft_head().unwrap().new_cache(context.min(self.limit))
        }

        fn predict(
            &self,
            hidden: &[f32],
            tokens: &[u32],
            cache: &mut SequenceCache,
        ) -> spindle_models::Result<spindle_models::HeadRows> {
            self.model.draft_head().unwrap().predict(hidden, tokens, cache)
        }
    }

    /// A head cache of 12 positions drafting 3: a 30-token prompt leaves it room for its last 8
    /// rows (and a round's 4), from which it drafts as a head run over just those would.
    #[test]
    fn a_head_with_a_short_cache_starts_afresh_at_the_rows_it_holds() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid/qwen3_5");
        let model = ShortHead { model: spindle_models::load_safetensors(&dir).unwrap(), limit: 12 };
        let mut target = CausalLm::new_cache(&model, 128);
        let mut drafter = MtpDrafter::new(&model, &mut target, 3).unwrap();
        let mut tokens: Vec<u32> = (0..30).map(|i| (i * 53 + 7) % 500).collect();
        model.forward(&tokens, &mut target).unwrap();
        let width = model.config().hidden_size;
        let kept = target.hidden_states().unwrap().1[22 * width..].to_vec();
        drafter.observe(&model, &target, &tokens).unwrap();
        tokens.push(11);
        let drafts = drafter.propose(&model, &tokens, 8).unwrap();
        // The reference: a head with room for everything over positions 22.. only.
        let head = model.model.draft_head().unwrap();
        assert_eq!(drafts, head_chain(head, &kept, &tokens[23..], 3));
    }

    /// The head's greedy chain of `drafts` tokens: run over `hidden` with `next` in a fresh
    /// cache, then on its own output.
    fn head_chain(head: &dyn DraftHead, hidden: &[f32], next: &[u32], drafts: usize) -> Vec<u32> {
        let mut cache = head.new_cache(128);
        let out = head.predict(hidden, next, &mut cache).unwrap();
        let mut chain = vec![argmax(out.logits.last().unwrap()).0];
        let mut hidden = out.hidden.last().unwrap().clone();
        while chain.len() < drafts {
            let out = head.predict(&hidden, &chain[chain.len() - 1..], &mut cache).unwrap();
            chain.push(argmax(&out.logits[0]).0);
            hidden = out.hidden[0].clone();
        }
        chain
    }

    /// Nothing to draft from before the head has seen the position before the decided token.
    #[test]
    fn no_drafts_without_the_position_before() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/hybrid/qwen3_5");
        let model = spindle_models::load_safetensors(&dir).unwrap();
        let mut target = model.new_cache(64);
        let mut drafter = MtpDrafter::new(&*model, &mut target, 4).unwrap();
        assert!(drafter.propose(&*model, &[1, 2], 4).unwrap().is_empty());
        model.forward(&[1, 2, 3], &mut target).unwrap();
        drafter.observe(&*model, &target, &[1, 2, 3]).unwrap();
        assert!(drafter.propose(&*model, &[1, 2, 3], 4).unwrap().is_empty(), "no token decided");
        assert_eq!(drafter.propose(&*model, &[1, 2, 3, 4], 4).unwrap().len(), 4);
    }
}
