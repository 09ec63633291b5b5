//! One running request: its cache, prefill plan, sampler and text state. The engine decides
//! when it runs and runs the model; this decides what goes into a step (a prefill chunk, or
//! the token sampled from the last logits) and what comes out of it (snapshots, logits).

use std::collections::VecDeque;

use spindle_constrain::ConstrainError;
use spindle_models::{CausalLm, SequenceCache};
use spindle_sched::{CacheKind, PrefillPlan};

use crate::bundle::ModelBundle;
use crate::draft::{
    DraftPool, DraftRound, ModelDraft, NgramDrafter, Proposal, RecentOutputs, RollbackHold,
};
use crate::engine_load::EngineLoad;
use crate::error::RunnerError;
use crate::events::{Caller, FinishReason, SequenceEvent, SequenceSummary};
use crate::mtp_drafter::MtpDrafter;
use crate::output::{OutputPipeline, TextDelta};
use crate::prefix_cache::{PrefixCache, Started};
use crate::request::SequenceRequest;
use crate::sampler::{SampledToken, Sampler};

/// What beginning a step of a sequence comes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// These tokens run through the model.
    Run(Vec<u32>),
    /// The sequence is over (its end, if any, has been reported).
    Ended,
}

pub struct Sequence {
    pub request: SequenceRequest,
    caller: Caller,
    pub plan: PrefillPlan,
    cache: SequenceCache,
    sampler: Sampler,
    output: OutputPipeline,
    /// Prompt positions taken from the prefix cache.
    cached: usize,
    /// Logits for the next token, once the prompt is in.
    logits: Option<Vec<f32>>,
    generated: usize,
    /// The generated tokens that went into the model, in order.
    reply: Vec<u32>,
    reasoning_tokens: usize,
    /// Close-tag tokens still to force, front first.
    forcing: VecDeque<u32>,
    /// The engine has forced the close tag (it does so at most once).
    close_forced: bool,
    /// The engine has just forced the close tag: the next token starts the answer, so it may
    /// not end the sequence.
    answer_owed: bool,
    /// The client is gone: the prompt may still be read for the cache, nothing is reported.
    orphan: bool,
    /// Tokens the client already has from a run that was preempted: this run produces the
    /// same ones again and does not send them.
    sent: usize,
    /// Proposes drafts when the sequence decodes speculatively.
    drafter: Option<NgramDrafter>,
    /// Drafts where the lookup finds nothing, with a draft model.
    model_draft: Option<ModelDraft>,
    /// Drafts from the model's MTP head where the lookup finds nothing (before the draft model).
    head: Option<MtpDrafter>,
    /// The drafts that run after the decided token in this step, in order.
    drafts: Vec<u32>,
    /// A token decided (sampled and reported) where the model rejected a draft: it runs next,
    /// without being sampled again.
    pending: Option<u32>,
    drafted: usize,
    accepted: usize,
    /// The recurrent layers' states it keeps for drafted positions (hybrid models).
    rollback: RollbackHold,
}

/// How a sequence drafts: `None`s when it does not speculate.
pub struct Drafting {
    pub drafter: Option<NgramDrafter>,
    /// The draft model's state for this sequence, with `--draft-model`.
    pub model_draft: Option<ModelDraft>,
}

impl Sequence {
    pub fn new(
        request: SequenceRequest,
        caller: Caller,
        plan: PrefillPlan,
        started: Started,
        sent: usize,
        drafting: Drafting,
    ) -> Self {
        let sampler = Sampler::new(request.sampling.clone(), &request.prompt_ids);
        let output = OutputPipeline::new(&request.stop_strings, request.reasoning.clone());
        Self {
            request,
            caller,
            plan,
            cache: started.cache,
            sampler,
            output,
            cached: started.cached,
            logits: started.logits,
            generated: 0,
            reply: Vec::new(),
            reasoning_tokens: 0,
            forcing: VecDeque::new(),
            close_forced: false,
            answer_owed: false,
            orphan: false,
            sent,
            drafter: drafting.drafter,
            model_draft: drafting.model_draft,
            head: None,
            drafts: Vec::new(),
            pending: None,
            drafted: 0,
            accepted: 0,
            rollback: RollbackHold::default(),
        }
    }

    /// The request, to run again from its prompt after a preemption, and how many tokens its
    /// client already has; `None` when the client is gone and nothing needs running.
    pub fn into_retry(mut self) -> Option<(SequenceRequest, Caller, usize)> {
        if self.client_gone() {
            return None;
        }
        if let Some(constraint) = &mut self.request.constraint {
            if let Err(e) = constraint.reset() {
                self.fail(RunnerError::Internal(format!("the grammar could not restart: {e}")));
                return None;
            }
        }
        let sent = self.generated.max(self.sent);
        Some((self.request, self.caller, sent))
    }

    pub fn cache(&self) -> &SequenceCache {
        &self.cache
    }

    /// The prompt chunks still to run.
    pub fn remaining_chunks(&self) -> Vec<usize> {
        if self.logits.is_some() {
            return Vec::new();
        }
        self.plan.chunks_after(self.cache.len())
    }

    /// Whether the client went away or cancelled. A cancelled request is told it ended the
    /// first time this sees it; from then on the sequence reports nothing more.
    pub fn dropped(&mut self) -> bool {
        if self.orphan {
            return true;
        }
        if !self.client_gone() {
            return false;
        }
        if !self.caller.is_closed() {
            self.finish(FinishReason::Cancelled);
        }
        self.orphan = true;
        true
    }

    /// The client went away or cancelled.
    pub fn client_gone(&self) -> bool {
        self.orphan || self.caller.client_gone()
    }

    /// Whether the sequence may decode: its client has read enough of its events to leave room
    /// for a step's, or is gone (and the step ends the sequence).
    pub fn ready(&self) -> bool {
        self.orphan || self.caller.ready()
    }

    /// Prompt positions not read yet.
    pub fn unread(&self) -> usize {
        self.request.prompt_ids.len() - self.cache.len()
    }

    /// Whether this sequence is still reading a prefix of its prompt that `prompt` shares, at
    /// least one `chunk` long and not read yet: a request with `prompt` would read the same
    /// positions again if it started now.
    pub fn is_reading_shared_prefix(&self, prompt: &[u32], chunk: usize) -> bool {
        if self.logits.is_some() {
            return false;
        }
        let shared = self.request.prompt_ids.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        shared >= chunk && shared > self.cache.len()
    }

    /// Puts the part of the prompt a dropped request had read into the prefix cache, as if it
    /// were a finished prompt: a client that gave up and sends the request again resumes there
    /// instead of paying for the same chunks twice. It ends at a chunk cut of its own plan, so
    /// the retry (same plan) continues it bit for bit.
    pub fn keep_read_prompt(&self, prefix: &mut PrefixCache) {
        let read = self.cache.len();
        let in_progress =
            self.logits.is_none() && read > self.cached && read < self.request.prompt_ids.len();
        // Snapshot positions were stored as they were reached.
        if in_progress && !self.plan.snapshots().contains(&read) {
            prefix.store(&self.request.prompt_ids[..read], &self.cache, &self.plan, None);
        }
    }

    /// Keeps the prompt and the reply that went into the model in the prefix cache, so that a
    /// client sending the reply back as history resumes after it. Attention-only models only:
    /// there a decoded position's keys and values are the bits a prefill of the same tokens
    /// computes, while a recurrent state decoded token by token rounds unlike a chunked prefill.
    pub fn keep_reply(&self, prefix: &mut PrefixCache) {
        let prompt = &self.request.prompt_ids;
        let len = self.cache.len();
        if prefix.kind() != CacheKind::AttentionOnly || len <= prompt.len() {
            return;
        }
        let tokens: Vec<u32> = prompt.iter().chain(&self.reply).copied().take(len).collect();
        prefix.store_in_memory(&tokens, &self.cache, &self.plan);
    }

    /// The recurrent layers' states it keeps for drafted positions.
    pub fn rollback_hold(&self) -> &RollbackHold {
        &self.rollback
    }

    pub fn rollback_hold_mut(&mut self) -> &mut RollbackHold {
        &mut self.rollback
    }

    /// Gives the draft model's blocks back to `pool` (the sequence ended or was preempted).
    pub fn release_draft(&self, pool: &mut DraftPool) {
        if let Some(state) = &self.model_draft {
            pool.release(state);
        }
    }

    /// The prompt and the tokens the sequence wrote, for other requests' drafts.
    pub fn prompt_and_reply(&self) -> (&[u32], &[u32]) {
        (&self.request.prompt_ids, &self.reply)
    }

    /// Reports a failure; the sequence is over.
    pub fn fail(&mut self, error: RunnerError) -> Next {
        let _ = self.caller.send(SequenceEvent::Failed(error));
        Next::Ended
    }

    pub fn cache_mut(&mut self) -> &mut SequenceCache {
        &mut self.cache
    }

    /// Readies the next `size` prompt tokens to run: their blocks are reserved.
    pub fn begin_prefill(&mut self, prefix: &mut PrefixCache, size: usize) -> Next {
        let start = self.cache.len();
        if let Err(e) = prefix.reserve(&mut self.cache, size) {
            let full =
                format!("no KV blocks for a prefill chunk of a prompt that fits the pool: {e}");
            return self.fail(RunnerError::Internal(full));
        }
        Next::Run(self.request.prompt_ids[start..start + size].to_vec())
    }

    /// After a prefill chunk ran: keeps a snapshot where the plan asks for one, and the logits
    /// once the whole prompt is in.
    pub fn end_prefill(&mut self, prefix: &mut PrefixCache, logits: Vec<f32>) {
        let end = self.cache.len();
        let at_end = end == self.request.prompt_ids.len();
        if self.plan.snapshots().contains(&end) {
            prefix.store(
                &self.request.prompt_ids[..end],
                &self.cache,
                &self.plan,
                at_end.then_some(logits.as_slice()),
            );
        }
        if at_end {
            self.logits = Some(logits);
        }
        if !self.orphan && self.sent == 0 {
            self.caller.send_progress(SequenceEvent::Prefilled {
                read: end,
                total: self.request.prompt_ids.len(),
                cached: self.cached,
            });
        }
    }

    /// Decides the next token (sampled from the pending logits, or the one decided where the
    /// model rejected a draft) and readies it to run through the model, unless the sequence
    /// ended.
    pub fn begin_decode(&mut self, bundle: &ModelBundle, prefix: &mut PrefixCache) -> Next {
        let id = match self.pending.take() {
            Some(id) => id,
            None => {
                let Some(logits) = self.logits.take() else {
                    return self
                        .fail(RunnerError::Internal("decode before the prompt was in".into()));
                };
                match self.decide(bundle, logits, self.cache.len()) {
                    Some(id) => id,
                    None => return Next::Ended,
                }
            }
        };
        if prefix.reserve(&mut self.cache, 1).is_err() {
            tracing::warn!("the KV cache is full: a sequence ends early; raise --kv-cache-memory");
            return self.finish(FinishReason::Length);
        }
        self.reply.push(id);
        Next::Run(vec![id])
    }

    /// Drafts also from `model`'s MTP head, up to `max_length` a round, when the sequence
    /// speculates and the model has a head: where the lookup finds nothing (the lookup proposes
    /// nothing at all while drafting pauses). Every drafter's rounds feed the lookup's one
    /// measure of acceptance, so drafts that keep failing pause them all.
    pub fn draft_with_head(&mut self, model: &dyn CausalLm, max_length: usize) {
        if self.drafter.is_some() && max_length > 0 {
            self.head = MtpDrafter::new(model, &mut self.cache, max_length);
        }
    }

    /// Lets the MTP head see the pass that just ran. A failing head stops drafting, never the
    /// sequence.
    pub fn observe_pass(&mut self, model: &dyn CausalLm) {
        let (Some(head), Some(drafter)) = (&mut self.head, &self.drafter) else { return };
        if let Err(e) = head.observe(model, &self.cache, drafter.history()) {
            self.stop_head(&e);
        }
    }

    /// Drafts no more with the MTP head, which failed with `error`.
    fn stop_head(&mut self, error: &dyn std::fmt::Display) {
        tracing::warn!("a sequence stops drafting with the MTP head: {error}");
        self.head = None;
    }

    /// What the sequence drafts after the decided token this step, at most `budget` tokens
    /// (the rows the step has left): the lookup's; where it finds nothing, the MTP head's, or
    /// a length for the draft model; no tokens when it does not speculate or nothing matches.
    pub fn propose_drafts(
        &mut self,
        model: &dyn CausalLm,
        recent: &RecentOutputs,
        budget: usize,
    ) -> Proposal {
        let Some(drafter) = &mut self.drafter else { return Proposal::Tokens(Vec::new()) };
        if self.orphan {
            return Proposal::Tokens(Vec::new());
        }
        // After the decided token: tokens the sequence may still decide, positions it may
        // still hold, and events its client has room for.
        let room = budget
            .min(self.request.max_tokens.saturating_sub(self.generated))
            .min(self.cache.limit().saturating_sub(self.cache.len() + 1))
            .min(self.caller.spare_events());
        let want = match drafter.propose(room, recent) {
            Proposal::Fallback(want) => want,
            tokens => return tokens,
        };
        if let Some(head) = &mut self.head {
            match head.propose(model, drafter.history(), room) {
                Ok(drafts) if !drafts.is_empty() => return Proposal::Tokens(drafts),
                Ok(_) => {}
                Err(e) => self.stop_head(&e),
            }
        }
        match self.model_draft {
            Some(_) => Proposal::Fallback(want),
            None => Proposal::Tokens(Vec::new()),
        }
    }

    /// The sequence's part of the draft model's round, drafting up to `want` tokens.
    pub fn draft_round(&mut self, want: usize) -> Option<DraftRound<'_>> {
        let history = self.drafter.as_ref()?.history();
        Some(DraftRound { state: self.model_draft.as_mut()?, history, want })
    }

    /// Runs `drafts` after the decided token this step, with their blocks reserved; none when
    /// no block is free.
    pub fn take_drafts(&mut self, prefix: &mut PrefixCache, drafts: Vec<u32>) -> Vec<u32> {
        if drafts.is_empty() || prefix.reserve(&mut self.cache, 1 + drafts.len()).is_err() {
            return Vec::new();
        }
        self.drafts.clone_from(&drafts);
        drafts
    }

    /// Decides one token from `logits`, the logits after `processed` positions, exactly as
    /// plain decoding does (forced close tags, the grammar, one draw of the sampler) and reports
    /// it; `None` when the sequence ended instead (a stop, `max_tokens`, the context).
    fn decide(
        &mut self,
        bundle: &ModelBundle,
        mut logits: Vec<f32>,
        processed: usize,
    ) -> Option<u32> {
        let reasoning = self.output.in_reasoning();
        self.apply_reasoning_budget(reasoning);
        let mut forced = true;
        let mut token = match self.next_forced() {
            Some(id) => self.sampler.force(&logits, id),
            None => match self.sample(&mut logits, reasoning).inspect(|_| forced = false) {
                Ok(token) => token,
                Err(error) => {
                    self.fail(error);
                    return None;
                }
            },
        };
        // Ending inside an open reasoning block would leave the answer empty: close the block
        // instead and let the model answer.
        if reasoning && self.request.stop_ids.contains(&token.id) && self.start_closing_reasoning()
        {
            let close = self.next_forced().expect("close_ids is not empty");
            token = self.sampler.force(&logits, close);
            forced = true;
        }
        if self.request.stop_ids.contains(&token.id) {
            self.finish(FinishReason::Stop);
            return None;
        }
        self.generated += 1;
        // The close tag the engine forces is not thinking: the budget counts the model's own.
        self.reasoning_tokens += usize::from(reasoning && !forced);
        let (text, stopped) = self.output.push(&bundle.tokenizer, token.id);
        let id = token.id;
        if let Some(drafter) = &mut self.drafter {
            drafter.push(id);
        }
        let resent = self.generated <= self.sent;
        if !resent && self.caller.send(SequenceEvent::Token { token, text, reasoning }).is_err() {
            return None;
        }
        if stopped {
            self.report(FinishReason::Stop, TextDelta::default());
            return None;
        }
        if self.generated >= self.request.max_tokens || processed >= self.cache.limit() {
            self.finish(FinishReason::Length);
            return None;
        }
        Some(id)
    }

    /// The next close-tag token to force, if the engine is closing the reasoning block.
    fn next_forced(&mut self) -> Option<u32> {
        let id = self.forcing.pop_front()?;
        self.answer_owed = self.forcing.is_empty();
        Some(id)
    }

    /// Samples the next token from `logits`. Reasoning stays free; the grammar governs what
    /// comes after it. Right after the engine closed the reasoning block no stop id may come,
    /// or the answer it closed the block for would be empty.
    fn sample(&mut self, logits: &mut [f32], reasoning: bool) -> Result<SampledToken, RunnerError> {
        let mut constraint = self.request.constraint.as_mut().filter(|_| !reasoning);
        if let Some(constraint) = &mut constraint {
            // A grammar with no way forward: what the request asked the answer to follow
            // cannot be met from here.
            constraint.mask(logits).map_err(|e| RunnerError::GrammarDeadEnd(e.to_string()))?;
            if logits.iter().all(|&logit| logit == f32::NEG_INFINITY) {
                let nothing = "no token can continue the answer".to_owned();
                return Err(RunnerError::GrammarDeadEnd(nothing));
            }
        }
        if std::mem::take(&mut self.answer_owed) {
            mask_unless_nothing_else(logits, &self.request.stop_ids);
        }
        let token = self.sampler.sample(logits);
        if let Some(constraint) = constraint {
            // The mask allowed the token, so the grammar refusing it is a fault of ours.
            let refused = |e: ConstrainError| RunnerError::Internal(e.to_string());
            constraint.advance(token.id).map_err(refused)?;
        }
        Ok(token)
    }

    /// After a decode step ran (`logits`: one vocabulary per token it ran): checks the round's
    /// drafts in order, deciding each position exactly as plain decoding would from the same
    /// logits; a draft is kept while it is what the model decided. The first it did not decide
    /// ends the round (the decided token runs next step) and the cache goes back to the last
    /// draft kept; when all were, the logits after the last wait for the next step. `load`
    /// counts the round as it is decided, before the sequence can end. Returns whether the
    /// sequence goes on (otherwise its end has been reported).
    pub fn end_decode(
        &mut self,
        bundle: &ModelBundle,
        mut logits: Vec<f32>,
        load: &EngineLoad,
    ) -> bool {
        let drafts = std::mem::take(&mut self.drafts);
        let vocab = logits.len() / (drafts.len() + 1);
        let (mut alive, mut accepted) = (true, 0);
        // Counted before the drafts are decided: deciding one may end the sequence, and its
        // summary (and a scrape after it) reports this round too.
        self.drafted += drafts.len();
        load.count_drafts(drafts.len());
        // Positions processed up to the decided token.
        let decided = self.cache.len() - drafts.len();
        for (&draft, row) in drafts.iter().zip(logits.chunks_exact(vocab)) {
            match self.decide(bundle, row.to_vec(), decided + accepted) {
                None => alive = false,
                Some(id) if id == draft => {
                    self.reply.push(id);
                    load.count_accepted(accepted);
                    accepted += 1;
                    self.accepted += 1;
                    continue;
                }
                Some(id) => self.pending = Some(id),
            }
            break;
        }
        if let Err(e) = self.cache.truncate(decided + accepted) {
            if alive {
                self.fail(RunnerError::Internal(format!("rejected drafts stay in the cache: {e}")));
                alive = false;
            }
        }
        if alive && self.pending.is_none() {
            // The last row, kept in place: a plain step moves its logits without a copy.
            logits.drain(..drafts.len() * vocab);
            self.logits = Some(logits);
        }
        if let Some(drafter) = &mut self.drafter {
            drafter.record(drafts.len(), accepted);
        }
        alive
    }

    /// Starts forcing the close tag when reasoning has used its budget, or when thinking on
    /// would leave the answer less than a quarter of `max_tokens`.
    fn apply_reasoning_budget(&mut self, reasoning: bool) {
        let Some(budget) = &self.request.reasoning_budget else { return };
        if !reasoning || self.close_forced || !self.forcing.is_empty() {
            return;
        }
        let over_budget = budget.max_tokens.is_some_and(|max| self.reasoning_tokens >= max);
        let left = self.request.max_tokens.saturating_sub(self.generated);
        let content_room = self.request.max_tokens.div_ceil(4);
        if over_budget || left <= content_room + budget.close_ids.len() {
            self.start_closing_reasoning();
        }
    }

    /// Queues the close-tag tokens, once per sequence; false when that already happened.
    fn start_closing_reasoning(&mut self) -> bool {
        let Some(budget) = &self.request.reasoning_budget else { return false };
        if self.close_forced || budget.close_ids.is_empty() {
            return false;
        }
        self.forcing.extend(budget.close_ids.iter().copied());
        self.close_forced = true;
        true
    }

    fn finish(&mut self, finish_reason: FinishReason) -> Next {
        let (tail, stopped) = self.output.finish();
        self.report(if stopped { FinishReason::Stop } else { finish_reason }, tail)
    }

    fn report(&mut self, finish_reason: FinishReason, tail: TextDelta) -> Next {
        let summary = SequenceSummary {
            finish_reason,
            tail,
            stop_sequence: self.output.stop_sequence().map(str::to_owned),
            prompt_tokens: self.request.prompt_ids.len(),
            completion_tokens: self.generated,
            reasoning_tokens: self.reasoning_tokens,
            cached_tokens: self.cached,
            drafted_tokens: self.drafted,
            accepted_tokens: self.accepted,
        };
        let _ = self.caller.send(SequenceEvent::Finished(summary));
        Next::Ended
    }
}

/// Makes the tokens `ids` impossible, unless nothing else is possible (a grammar that allows
/// only the end): then the sequence ends rather than sampling from no distribution.
fn mask_unless_nothing_else(logits: &mut [f32], ids: &[u32]) {
    let other_possible = logits
        .iter()
        .enumerate()
        .any(|(id, &logit)| logit > f32::NEG_INFINITY && !ids.contains(&(id as u32)));
    if other_possible {
        for &id in ids {
            if let Some(logit) = logits.get_mut(id as usize) {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mask_unless_nothing_else;

    #[test]
    fn stop_ids_are_masked_unless_only_they_remain() {
        let mut logits = [0.5, 2.0, f32::NEG_INFINITY, 1.0];
        mask_unless_nothing_else(&mut logits, &[1, 3]);
        assert_eq!(logits, [0.5, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        // A grammar that allows only the end keeps it.
        let mut only_end = [f32::NEG_INFINITY, 2.0, f32::NAN];
        mask_unless_nothing_else(&mut only_end, &[1]);
        assert_eq!(only_end[1], 2.0);
    }
}
