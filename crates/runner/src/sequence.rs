//! One running request: its cache, prefill plan, sampler and text state. The engine decides
//! when it runs; this decides what a prefill chunk or a decode step does to it.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use spindle_models::SequenceCache;
use spindle_sched::PrefillPlan;

use crate::bundle::ModelBundle;
use crate::engine::{SequenceEvent, SequenceRequest, SequenceSummary};
use crate::output::{OutputPipeline, TextDelta};
use crate::prefix_cache::{PrefixCache, Started};
use crate::sampler::Sampler;
use crate::FinishReason;

/// Whether a sequence goes on after a step.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Continue,
    Done,
}

pub struct Sequence {
    pub request: SequenceRequest,
    pub plan: PrefillPlan,
    cache: SequenceCache,
    sampler: Sampler,
    output: OutputPipeline,
    /// Prompt positions taken from the prefix cache.
    cached: usize,
    /// Logits for the next token, once the prompt is in.
    logits: Option<Vec<f32>>,
    generated: usize,
    reasoning_tokens: usize,
    /// Close-tag tokens still to force, front first.
    forcing: VecDeque<u32>,
    /// The engine has forced the close tag (it does so at most once).
    close_forced: bool,
}

impl Sequence {
    pub fn new(request: SequenceRequest, plan: PrefillPlan, started: Started) -> Self {
        let sampler = Sampler::new(request.sampling.clone(), &request.prompt_ids);
        let output = OutputPipeline::new(&request.stop_strings, request.reasoning);
        Self {
            request,
            plan,
            cache: started.cache,
            sampler,
            output,
            cached: started.cached,
            logits: started.logits,
            generated: 0,
            reasoning_tokens: 0,
            forcing: VecDeque::new(),
            close_forced: false,
        }
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

    /// Ends the sequence early when its client went away or cancelled.
    pub fn abandoned(&mut self) -> Option<Step> {
        if self.request.events.is_closed() {
            return Some(Step::Done);
        }
        if self.request.cancel.load(Ordering::Relaxed) {
            return Some(self.finish(FinishReason::Cancelled));
        }
        None
    }

    /// Reports a failure; the sequence is over.
    pub fn fail(&mut self, message: String) -> Step {
        let _ = self.request.events.send(SequenceEvent::Failed(message));
        Step::Done
    }

    /// Runs the next `size` prompt tokens, keeping a snapshot where the plan asks for one.
    pub fn prefill(&mut self, bundle: &ModelBundle, prefix: &mut PrefixCache, size: usize) -> Step {
        let (start, end) = (self.cache.len(), self.cache.len() + size);
        if let Err(e) = prefix.reserve(&mut self.cache, size) {
            return self.fail(format!("the KV cache is full ({e}); raise --kv-cache-memory"));
        }
        let logits = match bundle.model.forward(&self.request.prompt_ids[start..end], &mut self.cache) {
            Ok(logits) => logits,
            Err(e) => return self.fail(e.to_string()),
        };
        if let Some(key) = self.plan.key(end) {
            let at_end = end == self.request.prompt_ids.len();
            prefix.store(&self.request.prompt_ids[..end], &self.cache, key, at_end.then_some(logits.as_slice()));
        }
        if end == self.request.prompt_ids.len() {
            self.logits = Some(logits);
        }
        Step::Continue
    }

    /// Samples one token from the pending logits, reports it, and runs it through the model.
    pub fn decode(&mut self, bundle: &ModelBundle, prefix: &mut PrefixCache) -> Step {
        let Some(logits) = self.logits.take() else {
            return self.fail("internal error: decode before the prompt was in".into());
        };
        let reasoning = self.output.in_reasoning();
        self.apply_reasoning_budget(reasoning);
        let mut token = match self.forcing.pop_front() {
            Some(id) => self.sampler.force(&logits, id),
            None => self.sampler.sample(&logits),
        };
        // Ending inside an open reasoning block would leave the answer empty: close the block
        // instead and let the model answer.
        if reasoning && self.request.stop_ids.contains(&token.id) && self.start_closing_reasoning() {
            let close = self.forcing.pop_front().expect("close_ids is not empty");
            token = self.sampler.force(&logits, close);
        }
        if self.request.stop_ids.contains(&token.id) {
            return self.finish(FinishReason::Stop);
        }
        self.generated += 1;
        self.reasoning_tokens += usize::from(reasoning);
        let (text, stopped) = self.output.push(&bundle.tokenizer, token.id);
        let id = token.id;
        if self.request.events.send(SequenceEvent::Token { token, text, reasoning }).is_err() {
            return Step::Done;
        }
        if stopped {
            return self.report(FinishReason::Stop, TextDelta::default());
        }
        if self.generated >= self.request.max_tokens || self.cache.len() >= self.cache.limit() {
            return self.finish(FinishReason::Length);
        }
        if prefix.reserve(&mut self.cache, 1).is_err() {
            tracing::warn!("the KV cache is full: a sequence ends early; raise --kv-cache-memory");
            return self.finish(FinishReason::Length);
        }
        match bundle.model.forward(&[id], &mut self.cache) {
            Ok(logits) => self.logits = Some(logits),
            Err(e) => return self.fail(e.to_string()),
        }
        Step::Continue
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

    fn finish(&mut self, finish_reason: FinishReason) -> Step {
        let (tail, stopped) = self.output.finish();
        self.report(if stopped { FinishReason::Stop } else { finish_reason }, tail)
    }

    fn report(&mut self, finish_reason: FinishReason, tail: TextDelta) -> Step {
        let summary = SequenceSummary {
            finish_reason,
            tail,
            prompt_tokens: self.request.prompt_ids.len(),
            completion_tokens: self.generated,
            reasoning_tokens: self.reasoning_tokens,
            cached_tokens: self.cached,
        };
        let _ = self.request.events.send(SequenceEvent::Finished(summary));
        Step::Done
    }
}
