//! Plans checked step by step while a fake runner executes them against scripted replies.

use std::collections::BTreeMap;

use super::*;

const EOS: u32 = 0;
/// The engine's fixed prefill chunk size.
const CHUNK: usize = 8;

/// One scripted request.
struct Script {
    /// Prompt tokens the prefix cache does not cover.
    uncached: usize,
    /// Cache blocks the request reserves while it runs.
    blocks: usize,
    /// The token each successive set of logits picks; the sequence finishes at EOS.
    replies: Vec<u32>,
}

/// Executes plans as a model runner would, replaying each sequence's scripted logits, and
/// catches plans it could not execute.
struct FakeRunner {
    scripts: BTreeMap<SeqId, Script>,
    free_blocks: usize,
    prefilled: BTreeMap<SeqId, usize>,
    outputs: BTreeMap<SeqId, Vec<u32>>,
}

impl FakeRunner {
    fn new(free_blocks: usize, scripts: impl IntoIterator<Item = (u64, Script)>) -> Self {
        let scripts = scripts.into_iter().map(|(id, script)| (SeqId(id), script)).collect();
        Self { scripts, free_blocks, prefilled: BTreeMap::new(), outputs: BTreeMap::new() }
    }

    /// The admission check: reserves the sequence's blocks if they are free.
    fn reserve(&mut self, id: SeqId) -> bool {
        let blocks = self.scripts[&id].blocks;
        let fits = blocks <= self.free_blocks;
        if fits {
            self.free_blocks -= blocks;
            self.prefilled.insert(id, 0);
        }
        fits
    }

    fn chunks(&self, id: SeqId) -> Vec<usize> {
        let uncached = self.scripts[&id].uncached;
        (0..uncached).step_by(CHUNK).map(|start| CHUNK.min(uncached - start)).collect()
    }

    /// Runs one step; returns the sequences that finished in it.
    fn execute(&mut self, plan: &StepPlan) -> Vec<SeqId> {
        let mut finished = Vec::new();
        for &(id, tokens) in &plan.prefill {
            assert!(!plan.decode.contains(&id), "{id:?} prefills and decodes in one step");
            let done = self.prefilled.get_mut(&id).expect("prefilling an admitted sequence");
            *done += tokens;
            let uncached = self.scripts[&id].uncached;
            assert!(*done <= uncached, "{id:?} prefilled past its prompt");
            if *done == uncached && self.sample(id) {
                finished.push(id);
            }
        }
        for &id in &plan.decode {
            assert_eq!(
                self.prefilled[&id], self.scripts[&id].uncached,
                "{id:?} decodes before its prompt is in"
            );
            if self.sample(id) {
                finished.push(id);
            }
        }
        finished
    }

    /// Emits the sequence's next scripted token; true when that ends it (its blocks go back).
    fn sample(&mut self, id: SeqId) -> bool {
        let output = self.outputs.entry(id).or_default();
        let token = self.scripts[&id].replies[output.len()];
        output.push(token);
        self.finish_if(id, token == EOS)
    }

    /// Frees a sequence's blocks when `done` (finished, or cancelled by the test).
    fn finish_if(&mut self, id: SeqId, done: bool) -> bool {
        if done {
            self.free_blocks += self.scripts[&id].blocks;
            self.prefilled.remove(&id);
        }
        done
    }

    fn output(&self, id: u64) -> &[u32] {
        self.outputs.get(&SeqId(id)).map_or(&[], Vec::as_slice)
    }
}

/// The engine loop around the scheduler: admit and start, plan, execute, remove the finished.
struct Engine {
    scheduler: Scheduler,
    runner: FakeRunner,
}

impl Engine {
    fn new(max_active: usize, step_tokens: usize, runner: FakeRunner) -> Self {
        let mut scheduler = Scheduler::new(SchedulerConfig { max_active, step_tokens });
        for &id in runner.scripts.keys() {
            scheduler.enqueue(id);
        }
        Self { scheduler, runner }
    }

    fn step(&mut self) -> StepPlan {
        let runner = &mut self.runner;
        for id in self.scheduler.admit(|id| runner.reserve(id)) {
            self.scheduler.start(id, self.runner.chunks(id));
        }
        let plan = self.scheduler.plan(|_| true);
        for id in self.runner.execute(&plan) {
            self.scheduler.remove(id);
        }
        plan
    }

    /// A client goes away: the request is dropped wherever it is.
    fn cancel(&mut self, id: u64) {
        self.scheduler.remove(SeqId(id));
        let admitted = self.runner.prefilled.contains_key(&SeqId(id));
        self.runner.finish_if(SeqId(id), admitted);
    }

    fn counts(&self) -> (usize, usize) {
        (self.scheduler.waiting(), self.scheduler.running())
    }
}

fn script(uncached: usize, blocks: usize, replies: &[u32]) -> Script {
    Script { uncached, blocks, replies: replies.to_vec() }
}

fn plan(prefill: &[(u64, usize)], decode: &[u64]) -> StepPlan {
    StepPlan {
        prefill: prefill.iter().map(|&(id, tokens)| (SeqId(id), tokens)).collect(),
        decode: decode.iter().map(|&id| SeqId(id)).collect(),
    }
}

#[test]
fn chunks_fill_the_budget_left_by_decoding_in_admission_order() {
    let runner = FakeRunner::new(
        10,
        [
            (1, script(12, 1, &[11, 12, EOS])),
            (2, script(6, 1, &[21, EOS])),
            (3, script(0, 1, &[31, 32, 33, EOS])), // the cache covers its whole prompt
            (4, script(1, 1, &[41, EOS])),
        ],
    );
    let mut engine = Engine::new(4, 10, runner);
    // 1 decode + 8 fit; 2's 6 would not, and the step ends there: 4's one token would fit but
    // does not overtake.
    assert_eq!(engine.step(), plan(&[(1, 8)], &[3]));
    // Sequence 1 gets one chunk per step, so sequence 2 still waits behind it.
    assert_eq!(engine.step(), plan(&[(1, 4)], &[3]));
    assert_eq!(
        engine.step(),
        plan(&[(2, 6), (4, 1)], &[1, 3]),
        "1 decodes from the step after its last chunk"
    );
    assert_eq!(engine.step(), plan(&[], &[1, 2, 3, 4]));
    assert_eq!(engine.counts(), (0, 0), "all four reached EOS");
    assert_eq!(engine.step(), StepPlan::default());
    assert_eq!(
        [
            engine.runner.output(1),
            engine.runner.output(2),
            engine.runner.output(3),
            engine.runner.output(4)
        ],
        [&[11, 12, EOS][..], &[21, EOS], &[31, 32, 33, EOS], &[41, EOS]]
    );
}

#[test]
fn admission_is_fifo_within_max_active_and_room() {
    let runner = FakeRunner::new(
        6,
        [
            (1, script(4, 3, &[11, EOS])),
            (2, script(4, 4, &[21, EOS])),
            (3, script(4, 1, &[31, EOS])),
            (4, script(4, 1, &[41, EOS])),
        ],
    );
    let mut engine = Engine::new(2, 16, runner);
    // 2 needs 4 blocks but 3 are free; 3 would fit but must not overtake it.
    assert_eq!(engine.step(), plan(&[(1, 4)], &[]));
    assert_eq!(engine.counts(), (3, 1));
    assert_eq!(engine.step(), plan(&[], &[1]));
    assert_eq!(
        (engine.counts(), engine.runner.free_blocks),
        ((3, 0), 6),
        "1 finished and gave its blocks back"
    );
    // Room for 2 and 3; max_active keeps 4 waiting although a block is left for it.
    assert_eq!(engine.step(), plan(&[(2, 4), (3, 4)], &[]));
    assert_eq!((engine.counts(), engine.runner.free_blocks), ((1, 2), 1));
    assert_eq!(engine.step(), plan(&[], &[2, 3]));
    assert_eq!(engine.step(), plan(&[(4, 4)], &[]));
    assert_eq!(engine.step(), plan(&[], &[4]));
    assert_eq!(engine.counts(), (0, 0));
    assert_eq!(engine.runner.output(4), [41, EOS]);
}

#[test]
fn a_cancelled_sequence_leaves_the_next_plan() {
    let runner = FakeRunner::new(
        10,
        [
            (1, script(0, 1, &[11, 12, 13, 14, EOS])),
            (2, script(16, 1, &[21, EOS])),
            (3, script(8, 1, &[31, 32, EOS])),
            (4, script(8, 1, &[41, EOS])),
        ],
    );
    let mut engine = Engine::new(3, 10, runner);
    assert_eq!(engine.step(), plan(&[(2, 8)], &[1]));
    engine.cancel(2); // mid-prompt
    engine.cancel(4); // still waiting
    assert_eq!(engine.counts(), (0, 2));
    assert_eq!(engine.step(), plan(&[(3, 8)], &[1]), "3 takes the budget 2 would have used");
    engine.cancel(1); // mid-decode
    assert_eq!(engine.step(), plan(&[], &[3]));
    engine.cancel(1); // a second cancellation of the same request is harmless
    assert_eq!(engine.step(), plan(&[], &[3]));
    assert_eq!(engine.counts(), (0, 0));
    assert_eq!((engine.runner.output(1), engine.runner.output(4)), (&[11, 12][..], &[][..]));
    assert_eq!(engine.runner.free_blocks, 10);
}

#[test]
fn decoding_never_starves_a_prompt() {
    let long = [1; 8];
    let runner = FakeRunner::new(
        10,
        [
            (1, script(0, 1, &long)),
            (2, script(0, 1, &long)),
            (3, script(0, 1, &long)),
            (4, script(16, 1, &[41, EOS])),
            (5, script(8, 1, &[51, EOS])),
        ],
    );
    let mut engine = Engine::new(5, 4, runner);
    // The three decodes leave one token of budget; the first chunk runs anyway, alone.
    assert_eq!(engine.step(), plan(&[(4, 8)], &[1, 2, 3]));
    assert_eq!(engine.step(), plan(&[(4, 8)], &[1, 2, 3]));
    assert_eq!(engine.step(), plan(&[(5, 8)], &[1, 2, 3, 4]));
    assert_eq!(engine.step(), plan(&[], &[1, 2, 3, 5]), "4 reached EOS");
    assert_eq!(engine.runner.output(5), [51, EOS]);
}

#[test]
fn an_admitted_sequence_waits_for_its_chunks() {
    let mut scheduler = Scheduler::new(SchedulerConfig { max_active: 2, step_tokens: 8 });
    scheduler.enqueue(SeqId(1));
    assert_eq!(scheduler.admit(|_| true), [SeqId(1)]);
    assert_eq!(scheduler.plan(|_| true), StepPlan::default(), "no chunks known yet");
    scheduler.start(SeqId(1), vec![3, 3]);
    assert_eq!(scheduler.plan(|_| true), plan(&[(1, 3)], &[]));
    assert_eq!(scheduler.plan(|_| true), plan(&[(1, 3)], &[]));
    assert_eq!(scheduler.plan(|_| true), plan(&[], &[1]));
}

#[test]
#[should_panic(expected = "SeqId(1) was started twice")]
fn starting_twice_is_caught() {
    let mut scheduler = Scheduler::new(SchedulerConfig { max_active: 1, step_tokens: 8 });
    scheduler.enqueue(SeqId(1));
    scheduler.admit(|_| true);
    scheduler.start(SeqId(1), vec![]);
    scheduler.start(SeqId(1), vec![]);
}

#[test]
fn a_preempted_sequence_goes_back_to_the_front_of_the_queue() {
    let mut scheduler = Scheduler::new(SchedulerConfig { max_active: 2, step_tokens: 8 });
    for id in 1..=3 {
        scheduler.enqueue(SeqId(id));
    }
    assert_eq!(scheduler.admit(|_| true), [SeqId(1), SeqId(2)]);
    scheduler.start(SeqId(1), vec![2]);
    scheduler.start(SeqId(2), vec![2, 2]);
    assert_eq!(scheduler.last_admitted(), Some(SeqId(2)));
    scheduler.requeue_front(SeqId(2));
    assert_eq!(scheduler.last_admitted(), Some(SeqId(1)));
    assert_eq!(
        scheduler.plan(|_| true),
        plan(&[(1, 2)], &[]),
        "the preempted sequence runs nothing"
    );
    // It is admitted again before 3, which arrived later, and starts over.
    assert_eq!(scheduler.admit(|_| true), [SeqId(2)]);
    scheduler.start(SeqId(2), vec![4]);
    assert_eq!(scheduler.plan(|_| true), plan(&[(2, 4)], &[1]));
    assert_eq!(scheduler.waiting(), 1);
    // Unknown or waiting ids are left alone.
    scheduler.requeue_front(SeqId(3));
    scheduler.requeue_front(SeqId(9));
    assert_eq!((scheduler.waiting(), scheduler.running()), (1, 2));
}

#[test]
fn a_sequence_held_back_sits_out_while_the_others_run() {
    let mut scheduler = Scheduler::new(SchedulerConfig { max_active: 3, step_tokens: 8 });
    for id in 1..=3 {
        scheduler.enqueue(SeqId(id));
    }
    scheduler.admit(|_| true);
    scheduler.start(SeqId(1), vec![]);
    scheduler.start(SeqId(2), vec![]);
    scheduler.start(SeqId(3), vec![4]);
    let not_2 = |id: SeqId| id != SeqId(2);
    assert_eq!(scheduler.plan(not_2), plan(&[(3, 4)], &[1]), "a prompt is never held back");
    assert_eq!(scheduler.plan(not_2), plan(&[], &[1, 3]));
    assert_eq!(scheduler.plan(|_| true), plan(&[], &[1, 2, 3]), "and it decodes again");
}
