//! Keeps the compute pool's other workers looking for work while a model step runs.
//!
//! A step starts hundreds of parallel kernels with short single-threaded stretches between them
//! (norms, attention, quantizing activations), and rayon puts an idle worker to sleep within tens
//! of microseconds. Waking a core that has slept takes milliseconds on a VM (3–4 ms measured on
//! the 2-core development VM), longer than most kernels, so the engine thread had done all the
//! work by then: in a Qwen2.5-Coder-1.5B decode step the second worker was busy 12% of the time,
//! mostly on the LM head, the one kernel longer than a wake-up. Polling for the length of a step
//! costs one wake-up per step; between steps the workers sleep again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a polling worker goes without finding a job before it stops polling.
///
/// Without a limit a poll could deadlock its step: rayon may hand a worker the step's first job
/// (stolen after it looked for broadcasts) and then the poll while that job waits on a join, so
/// the poll sits on top of a job the step waits for and would spin until the step ends. With the
/// limit that costs at most this long. A millisecond keeps the worker up across a step's serial
/// stretches, and a worker asleep for less than that wakes in tens of microseconds.
const IDLE_LIMIT: Duration = Duration::from_millis(1);

/// Runs `step` on the calling worker while every other worker of its pool polls for jobs.
/// Off a pool, or on a pool of one, runs `step` alone.
pub(crate) fn while_polling<R>(step: impl FnOnce() -> R) -> R {
    let Some(caller) = rayon::current_thread_index() else { return step() };
    if rayon::current_num_threads() < 2 {
        return step();
    }
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let stopped = stop.0.clone();
    rayon::spawn_broadcast(move |worker| {
        // The caller must not poll: it would never return to end the step.
        if worker.index() != caller {
            poll_until(&stopped);
        }
    });
    step()
}

fn poll_until(stopped: &AtomicBool) {
    let mut idle_since: Option<Instant> = None;
    while !stopped.load(Ordering::Acquire) {
        #[cfg(test)]
        tests::POLLING.set(true);
        let ran = rayon::yield_now() == Some(rayon::Yield::Executed);
        #[cfg(test)]
        tests::POLLING.set(false);
        if ran {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() > IDLE_LIMIT {
            return;
        } else {
            // Gives the core away if another process wants it; returns at once if not.
            std::thread::yield_now();
        }
    }
}

/// Ends the polling when the step returns or unwinds.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::cell::Cell;

    thread_local! {
        /// Set while this thread runs a job it found by polling.
        pub(super) static POLLING: Cell<bool> = const { Cell::new(false) };
    }

    /// A pool of 2 whose first worker is the test's thread, as the engine's.
    fn engine_pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(2).use_current_thread().build().unwrap()
    }

    fn spin_until(done: &AtomicBool, limit: Duration) -> bool {
        let start = Instant::now();
        while !done.load(Ordering::Acquire) {
            if start.elapsed() > limit {
                return false;
            }
            std::hint::spin_loop();
        }
        true
    }

    #[test]
    fn the_other_worker_runs_the_steps_jobs_by_polling() {
        let _pool = engine_pool();
        let found_by_polling = AtomicBool::new(false);
        let start = Instant::now();
        // A step at a time, each with its own poll: on a loaded machine the other worker may be
        // off its core for longer than `IDLE_LIMIT` and end one step's poll before taking a job,
        // which a later step's poll makes up for.
        while !found_by_polling.load(Ordering::Relaxed) && start.elapsed().as_secs() < 20 {
            let sum = while_polling(|| {
                let step = Instant::now();
                let mut sum = 0;
                // Until the other worker has polled; every item of a parallel loop it takes
                // without polling would run with `POLLING` unset.
                while !found_by_polling.load(Ordering::Relaxed) && step.elapsed().as_millis() < 50 {
                    sum = (0..64u64)
                        .into_par_iter()
                        .map(|i| {
                            if POLLING.get() {
                                found_by_polling.store(true, Ordering::Relaxed);
                            }
                            let start = Instant::now();
                            while start.elapsed().as_micros() < 20 {}
                            i
                        })
                        .sum::<u64>();
                }
                sum
            });
            assert_eq!(sum, 63 * 64 / 2);
        }
        assert!(found_by_polling.load(Ordering::Relaxed));
    }

    /// The deadlock `IDLE_LIMIT` prevents, made certain: the other worker holds a job the step
    /// waits for when the poll reaches it, and that job waits the way a join does (running
    /// pending jobs meanwhile), so the poll runs on top of it.
    #[test]
    fn a_poll_on_top_of_a_job_its_step_waits_for_lets_the_step_end() {
        let _pool = engine_pool();
        let job_started = AtomicBool::new(false);
        let step_started = AtomicBool::new(false);
        let job_done = AtomicBool::new(false);
        let (step_ended, _) = rayon::join(
            || {
                assert!(spin_until(&job_started, Duration::from_secs(10)));
                while_polling(|| {
                    step_started.store(true, Ordering::Release);
                    // Without the limit the poll above the job would spin until this returns.
                    spin_until(&job_done, Duration::from_secs(10))
                })
            },
            || {
                job_started.store(true, Ordering::Release);
                spin_until(&step_started, Duration::from_secs(20));
                rayon::yield_now();
                job_done.store(true, Ordering::Release);
            },
        );
        assert!(step_ended, "the step waited 10 s for a job stuck under a poll");
    }

    #[test]
    fn off_a_pool_the_step_runs_alone() {
        let outside = std::thread::spawn(|| while_polling(rayon::current_thread_index));
        assert_eq!(outside.join().unwrap(), None);
    }
}
