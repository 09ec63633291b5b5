//! The engine thread: the one owner of the model and of the KV storage. Requests arrive over a
//! channel and wait in arrival order; the scheduler admits them while there is room and plans
//! each step: one decode token for every running sequence, plus prefill chunks up to a token
//! budget, so a long prompt cannot stall the others' tokens. Every sequence runs through the
//! model on its own, with prefill chunks fixed by its prompt, so it sees exactly the logits it
//! would see alone. Results leave as [`SequenceEvent`]s; a receiver that goes away, or a raised
//! cancel flag, ends the sequence and frees its blocks at its next turn. A sequence whose
//! client has not read its last events sits steps out (see [`crate::events`]).

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Arc;

use spindle_models::BatchEntry;
use spindle_sched::{Scheduler, SchedulerConfig, SeqId, StepPlan};
use tokio::sync::watch;

use crate::bundle::ModelBundle;
use crate::draft::{
    self, DraftModel, DraftPool, DraftScript, NgramDrafter, Proposal, RecentOutputs, RollbackStates,
};
use crate::engine_load::{EngineLoad, MAX_DRAFT};
use crate::error::{EngineStopped, RunnerError};
use crate::events::{Caller, SequenceEvent};
use crate::polling_workers;
use crate::prefix_cache::{CacheConfig, PrefixCache};
use crate::request::SequenceRequest;
use crate::sequence::{Drafting, Next, Sequence};

/// Limits of the engine thread.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences running at once; further requests wait in arrival order.
    pub max_active: usize,
    /// Prompt positions per prefill chunk (besides the cuts at snapshot positions).
    pub prefill_chunk: usize,
    /// Tokens one step may run: every decode token, then whole prefill chunks while they fit.
    pub step_tokens: usize,
    pub cache: CacheConfig,
    /// A prompt whose client went away while it was read is read to its end (and cached) while
    /// the engine has nothing else to do, when at most this many of its positions are left;
    /// 0 turns that off.
    pub orphan_prefill_tokens: usize,
    /// Called at every stage of every step; tests panic from it to check the engine survives a
    /// fault there. `None` in service.
    pub fault_injection: Option<FaultInjection>,
    pub speculation: SpeculationConfig,
}

/// Speculative decoding: a sequence drafts the tokens that followed the latest earlier
/// occurrence of its last few tokens (failing that, the draft model's tokens) and checks them
/// all in one step, keeping those the model picks itself. The output is byte for byte what
/// plain decoding gives, on attention-only and hybrid models alike: a hybrid's recurrent layers
/// run the checked tokens one at a time, as decoding does, and keep the state after each, so
/// rejected drafts are forgotten by taking the state of the last accepted one (see
/// `spindle_models::SequenceCache::truncate`).
#[derive(Clone, Debug)]
pub struct SpeculationConfig {
    /// Whether requests that do not say speculate.
    pub by_default: bool,
    /// Most tokens drafted per round (at most [`MAX_DRAFT`]); 0 turns speculation off for
    /// every request.
    pub max_draft: usize,
    /// Drafts by this instead of the lookup (tests). `None` in service.
    pub script: Option<DraftScript>,
    /// Drafts where the lookup finds nothing (`--draft-model`).
    pub draft_model: Option<Arc<DraftModel>>,
    /// Whether the lookup drafts; on in service, off where a test measures the draft model alone.
    pub lookup: bool,
    /// Most tokens the model's MTP head drafts per round where the lookup finds nothing (models
    /// whose checkpoint carries a head; before the draft model); 0 leaves the head unused.
    pub mtp_max_draft: usize,
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        Self {
            by_default: true,
            max_draft: 8,
            script: None,
            draft_model: None,
            lookup: true,
            mtp_max_draft: 0,
        }
    }
}

/// Where in a step a fault strikes, for [`EngineConfig::fault_injection`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepStage {
    /// Admitting waiting requests (the prefix cache looks their prompts up).
    Admit,
    /// Readying one sequence's work: reserving its blocks, sampling its next token.
    Begin,
    /// The batched model pass.
    Forward,
    /// Taking one sequence's logits back (snapshots into the prefix cache).
    End,
    /// Rebuilding the engine's state after a fault: a fault here stops the engine.
    Recover,
}

/// A function the engine calls at each [`StepStage`].
#[derive(Clone)]
pub struct FaultInjection(pub Arc<dyn Fn(StepStage) + Send + Sync>);

impl std::fmt::Debug for FaultInjection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultInjection")
    }
}

impl EngineConfig {
    /// Prompt tokens per prefill chunk: long enough to keep prefill efficient, short enough that
    /// decoding sequences beside it keep a steady pace.
    pub const PREFILL_CHUNK: usize = 256;
    /// Tokens per step: every decode token, then prefill chunks while they fit.
    pub const STEP_TOKENS: usize = 2 * Self::PREFILL_CHUNK;

    /// The step settings `spindle serve` runs with, for `max_active` sequences over `cache`.
    /// `generate`, `bench` and the reference tests use them too, so they run what serving runs.
    pub fn new(max_active: usize, cache: CacheConfig) -> Self {
        Self {
            max_active,
            prefill_chunk: Self::PREFILL_CHUNK,
            step_tokens: Self::STEP_TOKENS,
            cache,
            orphan_prefill_tokens: usize::MAX,
            fault_injection: None,
            speculation: SpeculationConfig::default(),
        }
    }
}

/// Watches the engine thread: `None` while it runs, the reason once a fault it could not
/// recover from stopped it.
pub type EngineHealth = watch::Receiver<Option<String>>;

/// Handle to the engine thread; cloning shares the thread.
#[derive(Clone)]
pub struct Engine {
    requests: mpsc::Sender<(SequenceRequest, Caller)>,
    /// Unparked after each submission: the thread parks while every sequence is held back.
    thread: std::thread::Thread,
    load: Arc<EngineLoad>,
    health: EngineHealth,
    /// Declared last, so dropped after `requests`: see [`JoinOnDrop`].
    _thread: Arc<JoinOnDrop>,
}

/// The engine thread, joined when the last handle goes: its channel is closed by then (the
/// handles' senders were dropped first), so the thread ends (unparked, if it waited for slow
/// clients), and with it the prefix cache's queued disk writes are done. A clean shutdown
/// loses none.
struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl Engine {
    /// Starts the thread that owns `bundle` for the life of the process.
    pub fn start(bundle: Arc<ModelBundle>, config: EngineConfig) -> Self {
        let (requests, inbox) = mpsc::channel();
        let load = Arc::new(EngineLoad::default());
        // Known before the thread allocates the pool: a gateway may scrape the shape at once.
        load.kv_blocks_total.store(config.cache.kv_blocks(&bundle), Ordering::Relaxed);
        let thread_load = load.clone();
        let (report_failure, health) = watch::channel(None);
        let thread = std::thread::Builder::new()
            .name("spindle-engine".into())
            .spawn(move || {
                // The engine thread is a worker of its own compute pool: a kernel it starts runs
                // here and on the other workers, one thread per core, instead of waking as many
                // workers while this thread sleeps (a decode step starts hundreds of kernels).
                let pool = rayon::ThreadPoolBuilder::new()
                    .thread_name(|i| format!("spindle-compute-{i}"))
                    .use_current_thread()
                    .build();
                if let Err(e) = &pool {
                    tracing::warn!(
                        "no compute pool for the engine thread ({e}); using the global one"
                    );
                }
                let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    run(&bundle, &config, &inbox, &thread_load)
                }));
                // Closed before the failure is reported: whoever sees it can submit no more.
                drop(inbox);
                if let Err(panic) = ran {
                    let message = panic_message(&panic);
                    tracing::error!(%message, "the engine thread stopped on a fault");
                    report_failure.send_replace(Some(message));
                }
                drop(pool);
            })
            .expect("spawning the engine thread");
        Self {
            requests,
            thread: thread.thread().clone(),
            load,
            health,
            _thread: Arc::new(JoinOnDrop(Some(thread))),
        }
    }

    pub fn submit(&self, request: SequenceRequest, caller: Caller) -> Result<(), EngineStopped> {
        self.load.waiting.fetch_add(1, Ordering::Relaxed);
        self.requests.send((request, caller)).map_err(|_| {
            self.load.waiting.fetch_sub(1, Ordering::Relaxed);
            EngineStopped
        })?;
        self.thread.unpark();
        Ok(())
    }

    pub fn load(&self) -> &EngineLoad {
        &self.load
    }

    /// Whether the engine thread still runs, and why it stopped if not.
    pub fn health(&self) -> EngineHealth {
        self.health.clone()
    }
}

/// What the engine thread owns.
struct EngineState<'a> {
    bundle: &'a ModelBundle,
    config: &'a EngineConfig,
    load: &'a EngineLoad,
    prefix: PrefixCache,
    scheduler: Scheduler,
    waiting: HashMap<SeqId, Waiting>,
    running: HashMap<SeqId, Sequence>,
    next_id: u64,
    /// Reused by [`Self::report_memory`], so reporting allocates nothing per step.
    used_blocks: HashSet<u32>,
    /// Finished outputs, which speculating sequences draft from.
    recent_outputs: RecentOutputs,
    /// The draft model's KV pool, with `--draft-model`.
    draft_pool: Option<DraftPool>,
    /// The states recurrent layers may keep for drafted positions, shared by the sequences.
    rollback: RollbackStates,
    /// Acceptance below which a sequence pauses drafting, for this model.
    break_even: f32,
}

fn run(
    bundle: &ModelBundle,
    config: &EngineConfig,
    inbox: &mpsc::Receiver<(SequenceRequest, Caller)>,
    load: &EngineLoad,
) {
    let mut engine = EngineState {
        bundle,
        config,
        load,
        prefix: PrefixCache::new(bundle, &config.cache),
        scheduler: new_scheduler(config),
        waiting: HashMap::new(),
        running: HashMap::new(),
        next_id: 0,
        used_blocks: HashSet::new(),
        recent_outputs: RecentOutputs::default(),
        draft_pool: draft_pool(config),
        rollback: RollbackStates::new(bundle, &config.cache),
        break_even: draft::break_even(bundle.model.as_ref()),
    };
    loop {
        if engine.waiting.is_empty() && engine.running.is_empty() {
            match inbox.recv() {
                Ok((request, caller)) => engine.enqueue(request, caller),
                Err(_) => return,
            }
        }
        for (request, caller) in inbox.try_iter() {
            engine.enqueue(request, caller);
        }
        // A panic of the model pass or of one sequence's part is caught where it strikes;
        // anywhere else it leaves the scheduler and the prefix cache half-changed.
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| engine.admit_and_step()));
        match stepped {
            Ok(Stepped::Ran) => {}
            // Nothing changes until a client reads, leaves or cancels (each unparks this
            // thread, see `Caller::wake_on_read`) or a request comes (`Engine::submit` unparks).
            Ok(Stepped::AllHeldBack) => match inbox.try_recv() {
                Ok((request, caller)) => engine.enqueue(request, caller),
                Err(TryRecvError::Empty) => std::thread::park(),
                // Shutting down: nobody waits for the slow clients' sequences.
                Err(TryRecvError::Disconnected) => return,
            },
            Err(panic) => engine.recover(&panic_message(&panic)),
        }
    }
}

/// What a step came to.
enum Stepped {
    /// Something ran, or may run if the engine loops again.
    Ran,
    /// Every running sequence waits for its client to read: stepping again would spin.
    AllHeldBack,
}

fn new_scheduler(config: &EngineConfig) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_active: config.max_active.max(1),
        step_tokens: config.step_tokens,
    })
}

impl EngineState<'_> {
    fn admit_and_step(&mut self) -> Stepped {
        self.admit();
        self.load.waiting.store(self.waiting.len(), Ordering::Relaxed);
        self.load.active.store(self.running.len(), Ordering::Relaxed);
        self.prefix.set_busy(!self.running.is_empty());
        let stepped = self.step();
        self.prefix.release_window_rows(self.running.values().map(Sequence::cache));
        self.prefix.publish_events();
        // Before blocking for new work, so an idle engine reports itself idle.
        self.report_memory();
        self.load.active.store(self.running.len(), Ordering::Relaxed);
        self.prefix.set_busy(!self.running.is_empty());
        stepped
    }

    /// After a fault outside the parts of a step that catch their own: the running sequences
    /// fail (those the step had in hand went with it, and their callers see their channel
    /// close), the scheduler and the prefix cache start afresh (the cache empty: its blocks'
    /// owners are gone), and the waiting requests wait on in arrival order.
    fn recover(&mut self, message: &str) {
        tracing::error!(%message, sequences = self.running.len(), "an engine step panicked");
        self.strike(StepStage::Recover);
        let error = format!("the engine step panicked: {message}");
        for (_, mut seq) in self.running.drain() {
            seq.fail(RunnerError::Internal(error.clone()));
        }
        self.prefix.rebuild(self.bundle, &self.config.cache);
        self.scheduler = new_scheduler(self.config);
        // The failed sequences' draft blocks went with them.
        self.draft_pool = draft_pool(self.config);
        self.rollback = RollbackStates::new(self.bundle, &self.config.cache);
        let mut waiting: Vec<SeqId> = self.waiting.keys().copied().collect();
        waiting.sort_unstable_by_key(|id| id.0);
        for id in waiting {
            self.scheduler.enqueue(id);
        }
        self.load.waiting.store(self.waiting.len(), Ordering::Relaxed);
        self.load.active.store(0, Ordering::Relaxed);
    }

    /// Calls the test's fault injection, if any, at `stage`.
    fn strike(&self, stage: StepStage) {
        if let Some(inject) = &self.config.fault_injection {
            (inject.0)(stage);
        }
    }

    fn enqueue(&mut self, mut request: SequenceRequest, caller: Caller) {
        let id = SeqId(self.next_id);
        self.next_id += 1;
        // Fixed now, so that a sequence run again after a preemption samples the same tokens.
        request.sampling.seed.get_or_insert_with(rand::random);
        caller.wake_on_read(std::thread::current());
        self.waiting.insert(id, Waiting { request, caller, sent: 0 });
        self.scheduler.enqueue(id);
    }

    /// Starts waiting requests in arrival order while the scheduler admits more and the KV pool
    /// has room for the prompt (what it will generate takes blocks as it goes; when the pool
    /// runs out, [`Self::make_room_for`] preempts). A prompt that could never fit fails at once
    /// instead of blocking the queue.
    fn admit(&mut self) {
        self.strike(StepStage::Admit);
        let mut failed = Vec::new();
        let admitted = self.scheduler.admit(|id| {
            let request = &self.waiting[&id].request;
            if self.running.values().any(|seq| {
                seq.is_reading_shared_prefix(&request.prompt_ids, self.config.prefill_chunk)
            }) {
                // A retry, or a twin sent at the same time: wait for the running one to read the
                // shared part and resume from its cache instead of reading it a second time.
                return false;
            }
            let len = request.prompt_ids.len();
            let plan =
                self.prefix.plan(len, &request.snapshot_positions, self.config.prefill_chunk);
            if len >= request.context {
                failed.push((
                    id,
                    RunnerError::PromptExceedsContext { prompt: len, context: request.context },
                ));
                return true;
            }
            if self.prefix.blocks_for(len + 1) > self.prefix.total_blocks() {
                let kv_tokens = self.prefix.total_blocks() * self.config.cache.block_size;
                failed.push((id, RunnerError::PromptExceedsKvPool { prompt: len, kv_tokens }));
                return true;
            }
            let Ok(started) = self.prefix.start(&request.prompt_ids, &plan, request.context) else {
                return false;
            };
            if !self.prefix.make_room(started.cache.blocks_needed(len + 1 - started.cached)) {
                self.prefix.release(&started.cache);
                return false;
            }
            let Waiting { request, caller, sent } = self.waiting.remove(&id).expect("waiting");
            let speculation = &self.config.speculation;
            let drafter = max_draft(speculation, &request).map(|max| {
                let script = speculation.script.clone();
                NgramDrafter::new(&request.prompt_ids, max, script, speculation.lookup)
                    .with_break_even(self.break_even)
            });
            let model_draft = (self.draft_pool.as_ref())
                .filter(|_| drafter.is_some())
                .map(|pool| pool.start(request.context));
            let drafting = Drafting { drafter, model_draft };
            let mut seq = Sequence::new(request, caller, plan, started, sent, drafting);
            seq.draft_with_head(self.bundle.model.as_ref(), speculation.mtp_max_draft);
            self.running.insert(id, seq);
            true
        });
        for (id, error) in failed {
            if let Some(waiting) = self.waiting.remove(&id) {
                let _ = waiting.caller.send(SequenceEvent::Failed(error));
            }
            self.scheduler.remove(id);
        }
        for id in admitted {
            if let Some(seq) = self.running.get(&id) {
                self.scheduler.start(id, seq.remaining_chunks());
            }
        }
    }

    /// Runs one planned step: every planned prefill chunk and decode token goes through the
    /// model in one batched pass, then speculating sequences' drafts in the rows the step's
    /// token budget has left. A sequence whose client is behind sits it out.
    fn step(&mut self) -> Stepped {
        let running = &self.running;
        let plan = self.scheduler.plan(|id| running.get(&id).is_none_or(Sequence::ready));
        if plan.prefill.is_empty() && plan.decode.is_empty() && !self.running.is_empty() {
            return Stepped::AllHeldBack;
        }
        self.make_room_for(&plan);
        let work = plan
            .prefill
            .iter()
            .map(|&(id, size)| (id, Work::Prefill(size)))
            .chain(plan.decode.iter().map(|&id| (id, Work::Decode)));
        let mut jobs: Vec<Job> = Vec::new();
        // Nobody else wants the engine: a prompt whose client left may go on being read.
        let idle = self.waiting.is_empty() && self.running.values().all(Sequence::client_gone);
        for (id, work) in work {
            let Some(mut seq) = self.running.remove(&id) else { continue };
            let prefix = &mut self.prefix;
            let bundle = self.bundle;
            let orphan_room = self.config.orphan_prefill_tokens;
            let config = self.config;
            let begun = guarded(&mut seq, |seq| {
                if let Some(inject) = &config.fault_injection {
                    (inject.0)(StepStage::Begin);
                }
                if seq.dropped() {
                    let prefill = matches!(work, Work::Prefill(_));
                    let keep_reading = idle && prefill && seq.unread() <= orphan_room;
                    if !keep_reading {
                        seq.keep_read_prompt(prefix);
                        return Next::Ended;
                    }
                }
                match work {
                    Work::Prefill(size) => seq.begin_prefill(prefix, size),
                    Work::Decode => seq.begin_decode(bundle, prefix),
                }
            });
            match begun {
                Next::Run(tokens) => jobs.push(Job { id, seq, tokens, work }),
                Next::Ended => {
                    seq.keep_reply(&mut self.prefix);
                    self.end(id, seq)
                }
            }
        }
        if jobs.is_empty() {
            return Stepped::Ran;
        }
        self.add_drafts(&mut jobs);
        let ran = {
            let mut batch: Vec<BatchEntry> = jobs
                .iter_mut()
                .map(|job| BatchEntry {
                    tokens: &job.tokens,
                    cache: job.seq.cache_mut(),
                    logit_rows: match job.work {
                        Work::Prefill(_) => 1,
                        Work::Decode => job.tokens.len(),
                    },
                })
                .collect();
            let model = self.bundle.model.as_ref();
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.strike(StepStage::Forward);
                polling_workers::while_polling(|| model.forward_batch(&mut batch))
            }))
        };
        let logits = match ran {
            Ok(Ok(logits)) => logits,
            // The caches of a failed pass are in an unknown state: every sequence in it ends.
            Ok(Err(e)) => {
                self.fail_all(jobs, e.to_string());
                return Stepped::Ran;
            }
            Err(panic) => {
                let message = format!("the model step panicked: {}", panic_message(&panic));
                self.fail_all(jobs, message);
                return Stepped::Ran;
            }
        };
        for (mut job, logits) in jobs.into_iter().zip(logits) {
            self.strike(StepStage::End);
            match job.work {
                Work::Prefill(_) => {
                    if job.seq.client_gone() {
                        let read = job.tokens.len();
                        self.load.orphan_prefill_tokens.fetch_add(read, Ordering::Relaxed);
                        let end = job.seq.cache().len();
                        self.prefix.note_orphan_read(job.seq.cache(), end - read, end);
                    }
                    job.seq.end_prefill(&mut self.prefix, logits);
                }
                Work::Decode => {
                    if !job.seq.end_decode(self.bundle, logits, self.load) {
                        job.seq.keep_reply(&mut self.prefix);
                        self.end(job.id, job.seq);
                        continue;
                    }
                }
            }
            job.seq.observe_pass(self.bundle.model.as_ref());
            self.running.insert(job.id, job.seq);
        }
        Stepped::Ran
    }

    /// Gives the decoding jobs of speculating sequences their drafts, in the rows the step's
    /// token budget leaves after the planned work (so drafts never delay anyone's prompt).
    /// After every job has its blocks, so drafts take only blocks nobody's work needs.
    fn add_drafts(&mut self, jobs: &mut [Job]) {
        let planned: usize = jobs.iter().map(|job| job.tokens.len()).sum();
        let mut budget = self.config.step_tokens.saturating_sub(planned);
        // Per job, the tokens it asks of the draft model (0: none).
        let mut from_model = vec![0; jobs.len()];
        for (job, wanted) in jobs.iter_mut().zip(&mut from_model) {
            if budget == 0 {
                break;
            }
            if !matches!(job.work, Work::Decode) {
                continue;
            }
            // On a hybrid model, no more drafts than the sequence can hold states for.
            let room = budget.min(self.rollback.allowance(job.seq.rollback_hold()));
            let model = self.bundle.model.as_ref();
            let drafted = match job.seq.propose_drafts(model, &self.recent_outputs, room) {
                Proposal::Tokens(drafts) => {
                    let drafts = job.seq.take_drafts(&mut self.prefix, drafts);
                    let drafted = drafts.len();
                    job.tokens.extend(drafts);
                    drafted
                }
                Proposal::Fallback(want) => {
                    *wanted = want;
                    want
                }
            };
            budget -= drafted;
            self.rollback.hold(job.seq.rollback_hold_mut(), drafted);
        }
        self.add_model_drafts(jobs, &from_model);
    }

    /// Drafts with the draft model for the jobs that ask it for some (`wanted`, per job), all
    /// of them in one batched round.
    fn add_model_drafts(&mut self, jobs: &mut [Job], wanted: &[usize]) {
        let Some(pool) = &mut self.draft_pool else { return };
        let (asking, drafts): (Vec<usize>, Vec<Vec<u32>>) = {
            let (asking, mut rounds): (Vec<usize>, Vec<_>) = (jobs.iter_mut().zip(wanted))
                .enumerate()
                .filter(|(_, (_, &want))| want > 0)
                .filter_map(|(i, (job, &want))| Some((i, job.seq.draft_round(want)?)))
                .unzip();
            if asking.is_empty() {
                return;
            }
            let drafts = pool.propose(&mut rounds);
            (asking, drafts)
        };
        for (i, drafts) in asking.into_iter().zip(drafts) {
            let job = &mut jobs[i];
            let drafts = job.seq.take_drafts(&mut self.prefix, drafts);
            job.tokens.extend(drafts);
        }
    }

    fn fail_all(&mut self, jobs: Vec<Job>, message: String) {
        tracing::error!(%message, sequences = jobs.len(), "a model step failed");
        for mut job in jobs {
            job.seq.fail(RunnerError::Internal(message.clone()));
            self.end(job.id, job.seq);
        }
    }

    /// Preempts the most recently admitted sequences until the blocks `plan`'s work needs
    /// are free (unused cache evicted first), as vLLM does: a preempted sequence gives its
    /// blocks back, keeps what it read in the prefix cache, and goes back to the front of the
    /// queue to run again from its prompt, resending nothing. Its outputs are bitwise those of
    /// an uninterrupted run, so memory never makes a request fail or stop early while it fits
    /// the pool alone.
    fn make_room_for(&mut self, plan: &StepPlan) {
        let need_of = |running: &HashMap<SeqId, Sequence>, id: SeqId, tokens: usize| {
            running.get(&id).map_or(0, |seq| seq.cache().blocks_needed(tokens))
        };
        let mut needs: HashMap<SeqId, usize> = HashMap::new();
        for &(id, size) in &plan.prefill {
            needs.insert(id, need_of(&self.running, id, size));
        }
        for &id in &plan.decode {
            needs.insert(id, need_of(&self.running, id, 1));
        }
        while !self.prefix.make_room(needs.values().sum()) {
            // The one left alone outgrew the pool: it ends where it is when it asks for a block.
            if self.running.len() <= 1 {
                return;
            }
            let Some(victim) = self.scheduler.last_admitted() else { return };
            needs.remove(&victim);
            self.preempt(victim);
        }
    }

    fn preempt(&mut self, id: SeqId) {
        let Some(seq) = self.running.remove(&id) else { return };
        seq.keep_read_prompt(&mut self.prefix);
        self.prefix.release(seq.cache());
        if let Some(pool) = &mut self.draft_pool {
            seq.release_draft(pool);
        }
        self.rollback.release(seq.rollback_hold());
        match seq.into_retry() {
            Some((request, caller, sent)) => {
                self.load.preemptions.fetch_add(1, Ordering::Relaxed);
                self.waiting.insert(id, Waiting { request, caller, sent });
                self.scheduler.requeue_front(id);
            }
            None => self.scheduler.remove(id),
        }
    }

    /// Publishes KV and snapshot memory use for the metrics.
    fn report_memory(&mut self) {
        self.used_blocks.clear();
        self.used_blocks
            .extend(self.running.values().flat_map(|seq| seq.cache().blocks().iter().copied()));
        self.load.kv_blocks_used.store(self.used_blocks.len(), Ordering::Relaxed);
        self.load.kv_blocks_total.store(self.prefix.total_blocks(), Ordering::Relaxed);
        self.load.snapshot_bytes.store(self.prefix.snapshot_bytes(), Ordering::Relaxed);
        self.load.orphan_tokens_reused.store(self.prefix.orphan_tokens_reused(), Ordering::Relaxed);
        let released = self.prefix.window_released_blocks();
        self.load.kv_window_released_blocks.store(released, Ordering::Relaxed);
    }

    /// Frees an ended sequence's blocks and its place in the scheduler, and keeps what it wrote
    /// for others' drafts where the engine speculates at all.
    fn end(&mut self, id: SeqId, seq: Sequence) {
        if self.config.speculation.max_draft > 0 {
            let (prompt, reply) = seq.prompt_and_reply();
            self.recent_outputs.add(prompt, reply);
        }
        self.prefix.release(seq.cache());
        if let Some(pool) = &mut self.draft_pool {
            seq.release_draft(pool);
        }
        self.rollback.release(seq.rollback_hold());
        self.scheduler.remove(id);
    }
}

/// The draft model's KV pool, when speculation has a draft model.
fn draft_pool(config: &EngineConfig) -> Option<DraftPool> {
    let draft = config.speculation.draft_model.clone()?;
    Some(DraftPool::new(draft, &config.cache))
}

/// A request waiting to be admitted, and how many of its tokens its client already has (a
/// preempted sequence's run again from the prompt; those are not sent twice).
struct Waiting {
    request: SequenceRequest,
    caller: Caller,
    sent: usize,
}

/// What a sequence does in a step.
#[derive(Clone, Copy)]
enum Work {
    /// Reads this many more prompt tokens.
    Prefill(usize),
    /// Samples a token and runs it.
    Decode,
}

/// One sequence's part of a step: the tokens it runs.
struct Job {
    id: SeqId,
    seq: Sequence,
    tokens: Vec<u32>,
    work: Work,
}

/// Most tokens `request` drafts per round: `None` unless it speculates (by its own choice or
/// the server's).
fn max_draft(speculation: &SpeculationConfig, request: &SequenceRequest) -> Option<usize> {
    let wanted = request.speculative.unwrap_or(speculation.by_default);
    let max = speculation.max_draft.min(MAX_DRAFT);
    (wanted && max > 0).then_some(max)
}

/// Runs `f` on `seq`, turning a panic into a failure of that sequence alone.
fn guarded(seq: &mut Sequence, f: impl FnOnce(&mut Sequence) -> Next) -> Next {
    match std::panic::catch_unwind(AssertUnwindSafe(|| f(seq))) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic_message(&panic);
            tracing::error!(%message, "a sequence step panicked");
            seq.fail(RunnerError::Internal(format!("a sequence step panicked: {message}")))
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
