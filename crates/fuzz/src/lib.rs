//! Seeded mutation fuzzing for the workspace's integration tests (issue #20).
//!
//! Each target takes valid examples (a corpus), mutates them ([`mutate_bytes`],
//! [`mutate_json`], [`mutate_text`]) and feeds the result to the code under test through
//! [`run`], which fails the test on a panic or a slow case and names the case to rerun. The
//! generator is a seeded xorshift, so case `n` is the same input on every machine: CI runs a
//! fixed subset, and `SPINDLE_FUZZ_CASES=100000` runs a long one. A test binary that declares
//! [`CappedAlloc`] as its global allocator also fails (aborts, naming the case) on any single
//! allocation above [`ALLOCATION_LIMIT`]: the "allocate without bound" half of the brief.
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: spindle_fuzz::CappedAlloc = spindle_fuzz::CappedAlloc;
//!
//! let corpus = [b"{}".to_vec()];
//! spindle_fuzz::run("json", 1_000, |rng| {
//!     let mut bytes = rng.pick(&corpus).clone();
//!     spindle_fuzz::mutate_bytes(rng, &mut bytes);
//!     bytes
//! }, |bytes| {
//!     let _ = serde_json::from_slice::<serde_json::Value>(bytes);
//! });
//! ```

mod alloc;
mod mutate;

use std::cell::Cell;
use std::fmt::Debug;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use alloc::{CappedAlloc, ALLOCATION_LIMIT};
pub use mutate::{mutate_bytes, mutate_json, mutate_text, INTERESTING_NUMBERS};

/// A case slower than this fails the run; a case that never returns is reported (and the
/// process ended) by a watchdog after twice this long.
pub const CASE_TIME_LIMIT: Duration = Duration::from_secs(10);

thread_local! {
    /// The case this thread is running, for the allocator's report (tests run on parallel
    /// threads, each its own target). `u64::MAX`: none.
    static CURRENT_CASE: Cell<u64> = const { Cell::new(u64::MAX) };
}

/// A deterministic xorshift64* generator: small, seedable, the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so neighbouring case numbers give unrelated streams.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`; `n` must be non-zero.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Cases to run: `SPINDLE_FUZZ_CASES`, else `default` (the CI subset).
pub fn case_count(default: u64) -> u64 {
    std::env::var("SPINDLE_FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(default)
}

/// Runs `cases` cases of a target: case `n` seeds an [`Rng`] with `n`, `generate` makes its
/// input from it, and `check` runs the code under test (and asserts what it must). Panics,
/// naming the case and its input, if `check` panics or takes longer than [`CASE_TIME_LIMIT`].
/// `SPINDLE_FUZZ_CASE=n` runs case `n` alone, to reproduce one. Returns how many cases ran.
pub fn run<I: Debug>(
    target: &str,
    default_cases: u64,
    mut generate: impl FnMut(&mut Rng) -> I,
    mut check: impl FnMut(&I),
) -> u64 {
    let only: Option<u64> = std::env::var("SPINDLE_FUZZ_CASE").ok().and_then(|n| n.parse().ok());
    let cases = match only {
        Some(n) => n..n + 1,
        None => 0..case_count(default_cases),
    };
    let current = Arc::new(AtomicU64::new(0));
    let _watchdog = Watchdog::start(target, current.clone());
    let started = Instant::now();
    let count = cases.end - cases.start;
    for case in cases {
        CURRENT_CASE.set(case);
        current.store(case, Ordering::Relaxed);
        let input = generate(&mut Rng::new(case));
        let case_started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| check(&input)));
        let elapsed = case_started.elapsed();
        if let Err(payload) = outcome {
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            panic!(
                "{target}: case {case} panicked: {message}\nrerun with SPINDLE_FUZZ_CASE={case}\n\
                 input: {}",
                shown(&input)
            );
        }
        assert!(
            elapsed < CASE_TIME_LIMIT,
            "{target}: case {case} took {elapsed:?}\nrerun with SPINDLE_FUZZ_CASE={case}\n\
             input: {}",
            shown(&input)
        );
    }
    CURRENT_CASE.set(u64::MAX);
    eprintln!("{target}: {count} cases in {:.1} s", started.elapsed().as_secs_f64());
    count
}

/// An input's `Debug` form, cut to a length a test log can hold.
fn shown(input: &impl Debug) -> String {
    let text = format!("{input:?}");
    match text.char_indices().nth(4_000) {
        Some((end, _)) => format!("{}… ({} bytes in all)", &text[..end], text.len()),
        None => text,
    }
}

/// Ends the process, naming the case, when no case finishes for twice [`CASE_TIME_LIMIT`]: a
/// hang would otherwise stall CI without saying which input caused it.
struct Watchdog {
    done: Arc<AtomicU64>,
}

impl Watchdog {
    /// Watches `current`, the case the run is on.
    fn start(target: &str, current: Arc<AtomicU64>) -> Self {
        let done = Arc::new(AtomicU64::new(0));
        let (target, stop) = (target.to_string(), done.clone());
        std::thread::spawn(move || {
            let mut last = (current.load(Ordering::Relaxed), Instant::now());
            while stop.load(Ordering::Relaxed) == 0 {
                std::thread::sleep(Duration::from_millis(200));
                let case = current.load(Ordering::Relaxed);
                if case != last.0 {
                    last = (case, Instant::now());
                } else if last.1.elapsed() > 2 * CASE_TIME_LIMIT {
                    // Straight to the file descriptor: the test harness's capture of
                    // `eprintln!` would be lost with the process.
                    let _ = writeln!(
                        std::io::stderr(),
                        "{target}: case {case} hangs; rerun with SPINDLE_FUZZ_CASE={case}"
                    );
                    std::process::abort();
                }
            }
        });
        Self { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(1, Ordering::Relaxed);
    }
}
