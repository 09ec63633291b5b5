//! A scripted engine: each request's reply is text a test chose, tokenized and sent back one
//! token at a time through the runner's own output pipeline (stop strings, the reasoning split),
//! so the server sees the events a model would send without running one. Like the real
//! engine, it sends a token only while the request's channel has room, and parks meanwhile.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::Thread;

use spindle_chat::Tokenizer;
use spindle_runner::sampler::SampledToken;
use spindle_runner::{
    Caller, EngineHealth, EngineLoad, EngineStopped, FinishReason, OutputPipeline, ReasoningMode,
    RunnerError, SequenceEvent, SequenceRequest, SequenceSummary, TextDelta,
};
use spindle_server::GenerationEngine;

/// What the engine does with one request.
pub enum Reply {
    /// Generates this text (and then an end-of-sequence), cut at `max_tokens`.
    Text(String),
    /// Reads the prompt, then waits for `gate` to open before generating `text`; a cancelled
    /// request stops waiting.
    Held { text: String, gate: Gate },
    /// Reads the prompt, then fails with this error.
    Fail(RunnerError),
}

impl Reply {
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text(text.into())
    }
}

/// A request as the engine received it, for tests to check what the server planned.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The prompt's token ids, decoded (special tokens kept).
    pub prompt: String,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub stop_strings: Vec<String>,
    pub temperature: f32,
    pub top_p: f32,
    /// 0: no limit.
    pub top_k: usize,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub seed: Option<u64>,
    pub top_logprobs: Option<usize>,
    pub reasoning: ReasoningMode,
    pub reasoning_budget: Option<usize>,
    pub constrained: bool,
    pub context: usize,
    pub speculative: Option<bool>,
}

/// A latch a test opens once; every request held on it then goes on.
#[derive(Clone, Default)]
pub struct Gate(Arc<Mutex<GateState>>);

#[derive(Default)]
struct GateState {
    open: bool,
    /// The threads of the requests held on it, unparked when it opens.
    waiting: Vec<Thread>,
}

impl Gate {
    pub fn open(&self) {
        let mut state = self.0.lock().unwrap();
        state.open = true;
        state.waiting.drain(..).for_each(|thread| thread.unpark());
    }

    /// Parks until the gate opens (true) or `give_up` says to stop waiting (false); the
    /// caller's end unparks this thread when its client leaves or cancels.
    pub fn wait(&self, give_up: impl Fn() -> bool) -> bool {
        self.0.lock().unwrap().waiting.push(std::thread::current());
        loop {
            if self.0.lock().unwrap().open {
                return true;
            }
            if give_up() {
                return false;
            }
            std::thread::park();
        }
    }
}

type Script = dyn Fn(&Seen) -> Reply + Send + Sync;

pub struct ScriptedEngine {
    tokenizer: Arc<Tokenizer>,
    script: Box<Script>,
    seen: Mutex<Vec<Seen>>,
    ends: Arc<Ends>,
    flow: Arc<Flow>,
    load: EngineLoad,
    health: tokio::sync::watch::Sender<Option<String>>,
}

/// How the requests ended, in the order they did (`None`: failed).
#[derive(Default)]
struct Ends {
    reasons: Mutex<Vec<Option<FinishReason>>>,
    changed: Condvar,
}

impl Ends {
    fn push(&self, reason: Option<FinishReason>) {
        self.reasons.lock().unwrap().push(reason);
        self.changed.notify_all();
    }
}

/// Tokens sent over all requests, and how often a request waited for its client to read.
#[derive(Default)]
struct Flow {
    counts: Mutex<FlowCounts>,
    changed: Condvar,
}

/// See [`Flow`].
#[derive(Clone, Copy, Debug, Default)]
pub struct FlowCounts {
    pub tokens_sent: usize,
    pub held_back: usize,
}

impl Flow {
    fn note(&self, change: impl FnOnce(&mut FlowCounts)) {
        change(&mut self.counts.lock().unwrap());
        self.changed.notify_all();
    }
}

impl ScriptedEngine {
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        script: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Self {
        Self {
            tokenizer,
            script: Box::new(script),
            seen: Mutex::default(),
            ends: Arc::default(),
            flow: Arc::default(),
            load: EngineLoad::default(),
            health: tokio::sync::watch::Sender::new(None),
        }
    }

    /// Stops as a fault the engine cannot recover from would stop it.
    pub fn fail_for_good(&self, reason: &str) {
        self.health.send_replace(Some(reason.to_owned()));
    }

    /// Blocks until `count` requests have ended, and says how (`None`: failed).
    pub fn wait_for_ends(&self, count: usize) -> Vec<Option<FinishReason>> {
        let mut reasons = self.ends.reasons.lock().unwrap();
        while reasons.len() < count {
            reasons = self.ends.changed.wait(reasons).unwrap();
        }
        reasons.clone()
    }

    /// The flow counts now.
    pub fn flow(&self) -> FlowCounts {
        *self.flow.counts.lock().unwrap()
    }

    /// Blocks until `done` holds of the flow counts, and returns them.
    pub fn wait_for_flow(&self, done: impl Fn(&FlowCounts) -> bool) -> FlowCounts {
        let mut counts = self.flow.counts.lock().unwrap();
        while !done(&counts) {
            counts = self.flow.changed.wait(counts).unwrap();
        }
        *counts
    }

    /// Every request submitted so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The last request submitted.
    pub fn last(&self) -> Seen {
        self.seen().pop().expect("a request reached the engine")
    }
}

impl GenerationEngine for ScriptedEngine {
    fn submit(&self, request: SequenceRequest, caller: Caller) -> Result<(), EngineStopped> {
        let seen = Seen {
            prompt: self.tokenizer.decode(&request.prompt_ids, false).unwrap(),
            prompt_tokens: request.prompt_ids.len(),
            max_tokens: request.max_tokens,
            stop_strings: request.stop_strings.clone(),
            temperature: request.sampling.temperature,
            top_p: request.sampling.top_p,
            top_k: request.sampling.top_k,
            min_p: request.sampling.min_p,
            repetition_penalty: request.sampling.repetition_penalty,
            seed: request.sampling.seed,
            top_logprobs: request.sampling.top_logprobs,
            reasoning: request.reasoning.clone(),
            reasoning_budget: request.reasoning_budget.as_ref().and_then(|b| b.max_tokens),
            constrained: request.constraint.is_some(),
            context: request.context,
            speculative: request.speculative,
        };
        let reply = (self.script)(&seen);
        self.seen.lock().unwrap().push(seen);
        let (tokenizer, ends, flow) =
            (self.tokenizer.clone(), self.ends.clone(), self.flow.clone());
        std::thread::spawn(move || {
            ends.push(generate(&tokenizer, &request, &caller, reply, &flow));
        });
        Ok(())
    }

    fn load(&self) -> &EngineLoad {
        &self.load
    }

    fn health(&self) -> EngineHealth {
        self.health.subscribe()
    }
}

/// What a model run would report for `request`, with the reply's text as its tokens; how it
/// ended (`None`: it failed).
fn generate(
    tokenizer: &Tokenizer,
    request: &SequenceRequest,
    caller: &Caller,
    reply: Reply,
    flow: &Flow,
) -> Option<FinishReason> {
    caller.wake_on_read(std::thread::current());
    let total = request.prompt_ids.len();
    caller.send_progress(SequenceEvent::Prefilled { read: total, total, cached: 0 });
    let gone = || caller.client_gone();
    let mut run = Run {
        output: OutputPipeline::new(&request.stop_strings, request.reasoning.clone()),
        request,
        caller,
        generated: 0,
        reasoning_tokens: 0,
    };
    let text = match reply {
        Reply::Text(text) => text,
        Reply::Held { text, gate } if gate.wait(gone) => text,
        Reply::Held { .. } => return run.end(FinishReason::Cancelled),
        Reply::Fail(error) => {
            let _ = caller.send(SequenceEvent::Failed(error));
            return None;
        }
    };
    for id in tokenizer.encode(&text, false).unwrap() {
        if !caller.ready() {
            flow.note(|counts| counts.held_back += 1);
            while !caller.ready() {
                std::thread::park();
            }
        }
        if gone() {
            return run.end(FinishReason::Cancelled);
        }
        if run.generated == request.max_tokens {
            return run.end(FinishReason::Length);
        }
        if request.stop_ids.contains(&id) {
            break;
        }
        run.generated += 1;
        let reasoning = run.output.in_reasoning();
        run.reasoning_tokens += usize::from(reasoning);
        let (text, stopped) = run.output.push(tokenizer, id);
        let token = sampled(id, request.sampling.top_logprobs);
        let _ = caller.send(SequenceEvent::Token { token, text, reasoning });
        flow.note(|counts| counts.tokens_sent += 1);
        if stopped {
            return run.report(FinishReason::Stop, TextDelta::default());
        }
    }
    run.end(FinishReason::Stop)
}

/// One request's generation so far.
struct Run<'a> {
    request: &'a SequenceRequest,
    caller: &'a Caller,
    output: OutputPipeline,
    generated: usize,
    reasoning_tokens: usize,
}

impl Run<'_> {
    /// Releases the text held back and reports the end.
    fn end(mut self, reason: FinishReason) -> Option<FinishReason> {
        let (tail, stopped) = self.output.finish();
        let reason = if stopped { FinishReason::Stop } else { reason };
        self.report(reason, tail)
    }

    fn report(self, finish_reason: FinishReason, tail: TextDelta) -> Option<FinishReason> {
        let summary = SequenceSummary {
            finish_reason,
            tail,
            stop_sequence: self.output.stop_sequence().map(str::to_owned),
            prompt_tokens: self.request.prompt_ids.len(),
            completion_tokens: self.generated,
            reasoning_tokens: self.reasoning_tokens,
            cached_tokens: 0,
            drafted_tokens: 0,
            accepted_tokens: 0,
        };
        let _ = self.caller.send(SequenceEvent::Finished(summary));
        Some(finish_reason)
    }
}

/// Token `id` with a fixed logprob, and `top` alternatives (itself first) when asked for.
fn sampled(id: u32, top: Option<usize>) -> SampledToken {
    const LOGPROB: f32 = -0.25;
    let top_logprobs = (0..top.unwrap_or(0) as u32)
        .map(|rank| if rank == 0 { (id, LOGPROB) } else { (id + rank, LOGPROB - rank as f32) })
        .collect();
    SampledToken { id, logprob: LOGPROB, top_logprobs }
}
