//! Keeps the compute pool's other workers looking for work while a model step runs.
//!
//! A step starts hundreds of parallel kernels with short single-threaded stretches between them
//! (norms, attention, quantizing activations), and rayon puts an idle worker to sleep within tens
//! of microseconds. Waking a core that has slept takes milliseconds on a VM (3–4 ms measured on
//! the 2-core development VM), longer than most kernels, so the engine thread had done all the
//! work by then: in a Qwen2.5-Coder-1.5B decode step the second worker was busy 12% of the time,
//! mostly on the LM head, the one kernel longer than a wake-up. Polling for the length of a step costs one wake-up per step;
//! between steps the workers sleep again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
        if worker.index() == caller {
            return;
        }
        while !stopped.load(Ordering::Acquire) {
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                // Gives the core away if another process wants it; returns at once if not.
                std::thread::yield_now();
            }
        }
    });
    step()
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
    use std::sync::atomic::AtomicUsize;

    /// A pool of 2 whose first worker is the test's thread, as the engine's.
    fn engine_pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(2).use_current_thread().build().unwrap()
    }

    #[test]
    fn the_other_worker_takes_part_in_the_step() {
        let _pool = engine_pool();
        let caller = rayon::current_thread_index();
        let elsewhere = AtomicUsize::new(0);
        let sum = while_polling(|| {
            (0..2000u64)
                .into_par_iter()
                .map(|i| {
                    if rayon::current_thread_index() != caller {
                        elsewhere.fetch_add(1, Ordering::Relaxed);
                    }
                    let start = std::time::Instant::now();
                    while start.elapsed().as_micros() < 5 {}
                    i
                })
                .sum::<u64>()
        });
        assert_eq!(sum, 1999 * 2000 / 2);
        assert!(elsewhere.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn off_a_pool_the_step_runs_alone() {
        let outside = std::thread::spawn(|| while_polling(rayon::current_thread_index));
        assert_eq!(outside.join().unwrap(), None);
    }
}
