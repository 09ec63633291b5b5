//! The token-budget step planner: decides which sequences run in each model step and how many
//! tokens each feeds. Mirrors the core of vLLM v1's `Scheduler.schedule()`: one loop under a
//! token budget, no separate prefill and decode phases, running sequences served before waiting
//! ones are admitted.
//!
//! ```text
//!  enqueue ─► waiting ─admit─► admitted ─start(chunks)─► prefilling ─last chunk─► decoding
//!                 │                  │                        │                      │
//!                 └──────────────────┴────────── remove ──────┴──────────────────────┘
//! ```
//!
//! The scheduler never sees tokens or blocks: the caller checks cache room at admission, fixes
//! the prompt's chunk sizes, and removes a sequence when it finishes, fails or is cancelled.

use std::collections::VecDeque;

/// Names one request's sequence for its whole life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences admitted at once (waiting for their chunks, prefilling or decoding).
    pub max_active: usize,
    /// Tokens one step aims to feed the model. Every decoding sequence gets its token whatever
    /// the budget, and so does the step's first prefill chunk.
    pub step_tokens: usize,
}

/// What the model runs in one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Prompt chunks, in admission order: (sequence, tokens).
    pub prefill: Vec<(SeqId, usize)>,
    /// Sequences that feed their last sampled token, in admission order.
    pub decode: Vec<SeqId>,
}

enum Phase {
    /// Admitted; the caller has not yet said how much of the prompt is left.
    Admitted,
    /// Prompt chunks still to run, in order; never empty.
    Prefilling(VecDeque<usize>),
    Decoding,
}

struct Active {
    id: SeqId,
    phase: Phase,
}

pub struct Scheduler {
    config: SchedulerConfig,
    /// In arrival order.
    waiting: VecDeque<SeqId>,
    /// In admission order, which is the order of every plan.
    active: Vec<Active>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Self { config, waiting: VecDeque::new(), active: Vec::new() }
    }

    /// Queues a new sequence behind those already waiting.
    pub fn enqueue(&mut self, id: SeqId) {
        debug_assert!(!self.knows(id), "{id:?} is already scheduled");
        self.waiting.push_back(id);
    }

    /// Admits waiting sequences in arrival order while fewer than `max_active` are active and
    /// `can_admit` agrees (the caller checks, and may reserve, cache room). Stops at the first
    /// refusal: a later, smaller request never overtakes an earlier one, so none starves.
    pub fn admit(&mut self, mut can_admit: impl FnMut(SeqId) -> bool) -> Vec<SeqId> {
        let mut admitted = Vec::new();
        while self.active.len() < self.config.max_active {
            let Some(&id) = self.waiting.front() else { break };
            if !can_admit(id) {
                break;
            }
            self.waiting.pop_front();
            self.active.push(Active { id, phase: Phase::Admitted });
            admitted.push(id);
        }
        admitted
    }

    /// Gives an admitted sequence the prefill chunks its prompt still needs (token counts, in
    /// order; empty when the cache covers the whole prompt). The caller fixes the sizes without
    /// regard to load, so that a sequence's outputs do not depend on what else runs; the
    /// scheduler only decides when each chunk runs.
    ///
    /// # Panics
    /// If `id` is not admitted or was already started: a bookkeeping bug in the caller.
    pub fn start(&mut self, id: SeqId, chunks: Vec<usize>) {
        debug_assert!(chunks.iter().all(|&tokens| tokens > 0), "a chunk feeds at least one token");
        let active =
            self.active.iter_mut().find(|a| a.id == id).expect("starting an admitted sequence");
        assert!(matches!(active.phase, Phase::Admitted), "{id:?} was started twice");
        active.phase =
            if chunks.is_empty() { Phase::Decoding } else { Phase::Prefilling(chunks.into()) };
    }

    /// Forgets a sequence wherever it is (finished, cancelled, failed); the next plan leaves it
    /// out. Unknown ids are ignored, so a cancellation racing a finish is harmless.
    pub fn remove(&mut self, id: SeqId) {
        self.waiting.retain(|&waiting| waiting != id);
        self.active.retain(|active| active.id != id);
    }

    /// The next step: one decode token for every sequence whose prompt is in, then whole
    /// prefill chunks in admission order while decode and chunk tokens stay within
    /// `step_tokens`. The step's first chunk is taken even over budget, so prompts are never
    /// starved by decoding; the first chunk that does not fit ends the step, so prompts finish
    /// in admission order. A sequence gets at most one chunk per step, and decodes from the
    /// step after its last chunk. A decoding sequence `may_decode` refuses sits the step out
    /// (its client has not read what it sent), costing the others nothing.
    pub fn plan(&mut self, may_decode: impl Fn(SeqId) -> bool) -> StepPlan {
        let decode: Vec<SeqId> = self
            .active
            .iter()
            .filter(|a| matches!(a.phase, Phase::Decoding) && may_decode(a.id))
            .map(|a| a.id)
            .collect();
        let mut tokens = decode.len();
        let mut prefill = Vec::new();
        for active in &mut self.active {
            let Phase::Prefilling(chunks) = &mut active.phase else { continue };
            let chunk = chunks[0];
            if !prefill.is_empty() && tokens + chunk > self.config.step_tokens {
                break;
            }
            tokens += chunk;
            prefill.push((active.id, chunk));
            chunks.pop_front();
            if chunks.is_empty() {
                active.phase = Phase::Decoding;
            }
        }
        StepPlan { prefill, decode }
    }

    /// The most recently admitted sequence still active: the one to preempt when the KV pool
    /// runs out, since it has done the least work.
    pub fn last_admitted(&self) -> Option<SeqId> {
        self.active.last().map(|a| a.id)
    }

    /// Sends an active sequence back to the front of the queue, to be admitted again (and its
    /// work recomputed) before anything that arrived later.
    pub fn requeue_front(&mut self, id: SeqId) {
        let before = self.active.len();
        self.active.retain(|active| active.id != id);
        if self.active.len() < before {
            self.waiting.push_front(id);
        }
    }

    /// Sequences queued but not admitted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences admitted and not yet removed.
    pub fn running(&self) -> usize {
        self.active.len()
    }

    fn knows(&self, id: SeqId) -> bool {
        self.waiting.contains(&id) || self.active.iter().any(|a| a.id == id)
    }
}

#[cfg(test)]
mod tests;
