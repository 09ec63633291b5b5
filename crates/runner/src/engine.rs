//! The engine thread: the one owner of the model. Requests arrive over a channel; the thread
//! runs every admitted sequence one step at a time in turn (a prefill chunk or one decode step),
//! so a long prompt cannot stall the others' tokens and every sequence sees exactly the logits it
//! would see alone. Results leave as [`SequenceEvent`]s; a receiver that goes away, or a raised
//! cancel flag, ends the sequence and frees its cache at its next turn.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use spindle_models::SequenceCache;
use tokio::sync::mpsc::UnboundedSender;

use crate::bundle::ModelBundle;
use crate::output::{OutputPipeline, ReasoningMode, TextDelta};
use crate::sampler::{SampledToken, Sampler, SamplingParams};
use crate::FinishReason;

/// Limits of the engine thread.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences stepped in turn; further requests wait in arrival order.
    pub max_active: usize,
    /// Prompt tokens run per turn, so a long prefill shares the thread with decoding sequences.
    pub prefill_chunk: usize,
}

/// Reasoning tokens get their own budget; the engine closes the block itself when it is spent.
#[derive(Clone, Debug)]
pub struct ReasoningBudget {
    /// Reasoning tokens allowed (`None`: only the room rule below applies).
    pub max_tokens: Option<usize>,
    /// Tokens forced to close the block, e.g. those of "\n</think>\n\n".
    pub close_ids: Vec<u32>,
}

/// One generation to run.
pub struct SequenceRequest {
    pub prompt_ids: Vec<u32>,
    /// Tokens to generate at most; the caller has already fitted it into the context.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (not emitted).
    pub stop_ids: Vec<u32>,
    /// Strings that end generation (never emitted).
    pub stop_strings: Vec<String>,
    pub reasoning: ReasoningMode,
    pub reasoning_budget: Option<ReasoningBudget>,
    /// Positions the sequence may use in all.
    pub context: usize,
    pub cancel: Arc<AtomicBool>,
    pub events: UnboundedSender<SequenceEvent>,
}

/// What the engine reports about a sequence, in order: tokens, then one `Finished` or `Failed`.
#[derive(Debug)]
pub enum SequenceEvent {
    Token { token: SampledToken, text: TextDelta, reasoning: bool },
    Finished(SequenceSummary),
    Failed(String),
}

/// Counts reported when a sequence ends.
#[derive(Clone, Debug)]
pub struct SequenceSummary {
    pub finish_reason: FinishReason,
    /// Text that was held back (a possible stop-string or tag prefix) and is now released.
    pub tail: TextDelta,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub reasoning_tokens: usize,
    pub cached_tokens: usize,
}

/// Gauges the server exports.
#[derive(Debug, Default)]
pub struct EngineLoad {
    pub waiting: AtomicUsize,
    pub active: AtomicUsize,
}

/// Handle to the engine thread; cloning shares the thread.
#[derive(Clone)]
pub struct Engine {
    requests: mpsc::Sender<SequenceRequest>,
    load: Arc<EngineLoad>,
}

/// The engine thread has stopped (it only does when its handle is dropped or it panicked).
#[derive(Debug, thiserror::Error)]
#[error("the engine thread has stopped")]
pub struct EngineStopped;

impl Engine {
    /// Starts the thread that owns `bundle` for the life of the process.
    pub fn start(bundle: Arc<ModelBundle>, config: EngineConfig) -> Self {
        let (requests, inbox) = mpsc::channel();
        let load = Arc::new(EngineLoad::default());
        let thread_load = load.clone();
        std::thread::Builder::new()
            .name("spindle-engine".into())
            .spawn(move || run(&bundle, &config, &inbox, &thread_load))
            .expect("spawning the engine thread");
        Self { requests, load }
    }

    pub fn submit(&self, request: SequenceRequest) -> Result<(), EngineStopped> {
        self.load.waiting.fetch_add(1, Ordering::Relaxed);
        self.requests.send(request).map_err(|_| {
            self.load.waiting.fetch_sub(1, Ordering::Relaxed);
            EngineStopped
        })
    }

    pub fn load(&self) -> &EngineLoad {
        &self.load
    }
}

fn run(bundle: &ModelBundle, config: &EngineConfig, inbox: &mpsc::Receiver<SequenceRequest>, load: &EngineLoad) {
    let mut waiting = VecDeque::new();
    let mut active: Vec<Sequence> = Vec::new();
    loop {
        if active.is_empty() && waiting.is_empty() {
            match inbox.recv() {
                Ok(r) => waiting.push_back(r),
                Err(_) => return,
            }
        }
        waiting.extend(inbox.try_iter());
        while active.len() < config.max_active.max(1) {
            let Some(request) = waiting.pop_front() else { break };
            active.push(Sequence::new(bundle, request));
        }
        load.waiting.store(waiting.len(), Ordering::Relaxed);
        load.active.store(active.len(), Ordering::Relaxed);
        active.retain_mut(|seq| {
            // A panic in one sequence's step must not take the others down with the thread.
            let step = std::panic::catch_unwind(AssertUnwindSafe(|| seq.step(bundle, config.prefill_chunk)));
            match step {
                Ok(Step::Continue) => true,
                Ok(Step::Done) => false,
                Err(panic) => {
                    let message = panic.downcast_ref::<&str>().map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    tracing::error!(%message, "a sequence step panicked");
                    let _ = seq.request.events.send(SequenceEvent::Failed(format!("internal error: {message}")));
                    false
                }
            }
        });
        // Before blocking for new work, so an idle engine reports itself idle.
        load.active.store(active.len(), Ordering::Relaxed);
    }
}

enum Step {
    Continue,
    Done,
}

/// A running request: its cache, sampler and text state.
struct Sequence {
    request: SequenceRequest,
    cache: SequenceCache,
    sampler: Sampler,
    output: OutputPipeline,
    /// Prompt tokens already run through the model.
    prefilled: usize,
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
    fn new(bundle: &ModelBundle, request: SequenceRequest) -> Self {
        let cache = bundle.model.new_cache(request.context);
        let sampler = Sampler::new(request.sampling.clone(), &request.prompt_ids);
        let output = OutputPipeline::new(&request.stop_strings, request.reasoning);
        Self {
            request,
            cache,
            sampler,
            output,
            prefilled: 0,
            logits: None,
            generated: 0,
            reasoning_tokens: 0,
            forcing: VecDeque::new(),
            close_forced: false,
        }
    }

    fn step(&mut self, bundle: &ModelBundle, prefill_chunk: usize) -> Step {
        if self.request.events.is_closed() {
            return Step::Done;
        }
        if self.request.cancel.load(Ordering::Relaxed) {
            return self.finish(FinishReason::Cancelled);
        }
        match self.advance(bundle, prefill_chunk) {
            Ok(step) => step,
            Err(message) => {
                let _ = self.request.events.send(SequenceEvent::Failed(message));
                Step::Done
            }
        }
    }

    fn advance(&mut self, bundle: &ModelBundle, prefill_chunk: usize) -> Result<Step, String> {
        let model = bundle.model.as_ref();
        let Some(logits) = self.logits.take() else {
            let prompt = &self.request.prompt_ids;
            let end = (self.prefilled + prefill_chunk.max(1)).min(prompt.len());
            let logits = model.forward(&prompt[self.prefilled..end], &mut self.cache).map_err(|e| e.to_string())?;
            self.prefilled = end;
            if end == prompt.len() {
                self.logits = Some(logits);
            }
            return Ok(Step::Continue);
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
            return Ok(self.finish(FinishReason::Stop));
        }
        self.generated += 1;
        self.reasoning_tokens += usize::from(reasoning);
        let (text, stopped) = self.output.push(&bundle.tokenizer, token.id);
        let id = token.id;
        if self.request.events.send(SequenceEvent::Token { token, text, reasoning }).is_err() {
            return Ok(Step::Done);
        }
        if stopped {
            return Ok(self.finish_without_tail(FinishReason::Stop));
        }
        if self.generated >= self.request.max_tokens || self.cache.len() >= self.cache.limit() {
            return Ok(self.finish(FinishReason::Length));
        }
        self.logits = Some(model.forward(&[id], &mut self.cache).map_err(|e| e.to_string())?);
        Ok(Step::Continue)
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

    fn finish_without_tail(&mut self, finish_reason: FinishReason) -> Step {
        self.report(finish_reason, TextDelta::default())
    }

    fn report(&mut self, finish_reason: FinishReason, tail: TextDelta) -> Step {
        let summary = SequenceSummary {
            finish_reason,
            tail,
            prompt_tokens: self.request.prompt_ids.len(),
            completion_tokens: self.generated,
            reasoning_tokens: self.reasoning_tokens,
            cached_tokens: 0,
        };
        let _ = self.request.events.send(SequenceEvent::Finished(summary));
        Step::Done
    }
}
