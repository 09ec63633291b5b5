//! Bursts (asiai's `--burst-mode`): N calls fired at once on a warmed system prompt, at several
//! concurrencies and `--burst-runs` times each.
//!
//! ```text
//! burst:  warm (new system) ─▶ single (new user, alone) ─▶ N at once (new users)
//! ```
//! Each burst has its own system prompt (another salt), so its warm-up is the only call that
//! must compute it and the bursts do not depend on their order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::error::BenchError;
use crate::prompt::user_message;
use crate::sse::Measurement;
use crate::stats::{percentile, slope, Spread};
use crate::workload::Workload;

/// Below this many cached tokens short of the whole system prompt, a call counts as having
/// re-read the prompt. The slack admits caches that keep only whole blocks (up to 64 tokens)
/// or stop at the message boundary rather than after the next role header.
pub const REREAD_SLACK_TOKENS: usize = 64;

/// A burst whose calls streamed fewer than this many at a time, on average, ran one after
/// another. FIFO gives at most 1; a server with two slots about 2; batching all N about N.
pub const SERIAL_STREAMS: f64 = 1.5;

/// A call of a burst that failed: the HTTP status when the server answered with one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailure {
    pub status: Option<u16>,
    pub message: String,
}

impl From<BenchError> for CallFailure {
    fn from(error: BenchError) -> Self {
        let status = match &error {
            BenchError::Status { status, .. } => Some(*status),
            _ => None,
        };
        Self { status, message: error.to_string() }
    }
}

/// One burst: its warm-up, a lone call, and the concurrent calls.
#[derive(Debug, Clone)]
pub struct BurstRun {
    pub concurrency: usize,
    pub warm: Measurement,
    pub single: Measurement,
    pub calls: Vec<Result<Measurement, CallFailure>>,
    /// From the start of the burst to the end of its last call.
    pub wall: Duration,
}

/// The figures of one burst; times in milliseconds (NaN without a successful call).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BurstStats {
    pub concurrency: usize,
    pub successes: usize,
    pub errors: usize,
    /// Errors that were HTTP 429 (the server's queue was full).
    pub rate_limited: usize,
    pub wall_ms: f64,
    pub latency_p50_ms: f64,
    pub latency_p95_ms: f64,
    pub latency_max_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p95_ms: f64,
    /// Completion tokens of all successful calls over the wall time.
    pub aggregate_tokens_per_second: f64,
    /// The median call's completion tokens over its own latency.
    pub per_request_tokens_per_second: f64,
    /// The lone call's completion tokens over its latency.
    pub single_tokens_per_second: f64,
    /// Successful calls that re-read the whole system prompt.
    pub rereads: usize,
    /// [`BurstRun::streams_at_once`]; NaN when the calls did not stream.
    pub streams_at_once: f64,
    pub serialised: bool,
}

impl BurstRun {
    pub fn succeeded(&self) -> impl Iterator<Item = &Measurement> {
        self.calls.iter().filter_map(|c| c.as_ref().ok())
    }

    pub fn errors(&self) -> Vec<&str> {
        self.calls.iter().filter_map(|c| c.as_ref().err().map(|f| f.message.as_str())).collect()
    }

    /// Calls the server refused with 429.
    pub fn rate_limited(&self) -> usize {
        self.calls.iter().filter(|c| matches!(c, Err(f) if f.status == Some(429))).count()
    }

    /// Successful calls that got less than the system prompt (`system_tokens`, less
    /// [`REREAD_SLACK_TOKENS`]) from the server's cache.
    pub fn rereads(&self, system_tokens: usize) -> usize {
        let needed = system_tokens.saturating_sub(REREAD_SLACK_TOKENS);
        self.succeeded().filter(|m| (m.cached_tokens as usize) < needed).count()
    }

    /// Completion tokens of all successful calls over the burst's wall time.
    pub fn aggregate_tokens_per_second(&self) -> f64 {
        let tokens: u32 = self.succeeded().map(|m| m.completion_tokens).sum();
        tokens as f64 / self.wall.as_secs_f64()
    }

    /// Completion tokens of the lone call over its latency.
    pub fn single_tokens_per_second(&self) -> f64 {
        self.single.completion_tokens as f64 / self.single.latency.as_secs_f64()
    }

    /// How many calls streamed tokens at once, on average: each call's streaming time (first
    /// token to end) summed, over the span from the earliest first token to the last end.
    /// Calls that ran one after another give at most 1 (less by the gaps where a prompt was
    /// read); calls generated together give about N, however slow each one is. `None` with
    /// fewer than two calls that streamed (at least 1% of their latency after the first
    /// token), as when a server or proxy sends each answer in one piece.
    pub fn streams_at_once(&self) -> Option<f64> {
        let streamed: Vec<&Measurement> =
            self.succeeded().filter(|m| streaming(m) * 100 >= m.latency).collect();
        let first = streamed.iter().map(|m| m.ttft).min()?;
        let last = streamed.iter().map(|m| m.latency).max()?;
        let total: Duration = streamed.iter().map(|m| streaming(m)).sum();
        (streamed.len() >= 2 && last > first)
            .then(|| total.as_secs_f64() / (last - first).as_secs_f64())
    }

    /// Whether the server took the calls one after another: fewer than [`SERIAL_STREAMS`]
    /// streamed at once. This is the cause behind the panels' "p50 ≈ p95 ≈ max, growing
    /// linearly with N", measured directly, so that a server that batches the calls on a
    /// machine too slow to gain from it (each call slower, all streaming together) is not
    /// mistaken for one that queues them.
    pub fn serialised(&self) -> bool {
        self.concurrency > 1 && self.streams_at_once().is_some_and(|s| s < SERIAL_STREAMS)
    }

    pub fn stats(&self, system_tokens: usize) -> BurstStats {
        let latencies: Vec<Duration> = self.succeeded().map(|m| m.latency).collect();
        let ttfts: Vec<Duration> = self.succeeded().map(|m| m.ttft).collect();
        let ms = |values: &[Duration], p: f64| {
            percentile(values, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
        };
        let per_request: Vec<f64> = self
            .succeeded()
            .map(|m| f64::from(m.completion_tokens) / m.latency.as_secs_f64())
            .collect();
        BurstStats {
            concurrency: self.concurrency,
            successes: latencies.len(),
            errors: self.calls.len() - latencies.len(),
            rate_limited: self.rate_limited(),
            wall_ms: self.wall.as_secs_f64() * 1000.0,
            latency_p50_ms: ms(&latencies, 50.0),
            latency_p95_ms: ms(&latencies, 95.0),
            latency_max_ms: ms(&latencies, 100.0),
            ttft_p50_ms: ms(&ttfts, 50.0),
            ttft_p95_ms: ms(&ttfts, 95.0),
            aggregate_tokens_per_second: self.aggregate_tokens_per_second(),
            per_request_tokens_per_second: Spread::of(&per_request).map_or(f64::NAN, |s| s.median),
            single_tokens_per_second: self.single_tokens_per_second(),
            rereads: self.rereads(system_tokens),
            streams_at_once: self.streams_at_once().unwrap_or(f64::NAN),
            serialised: self.serialised(),
        }
    }
}

/// Every burst at one concurrency.
#[derive(Debug, Clone)]
pub struct BurstLevel {
    pub concurrency: usize,
    pub runs: Vec<BurstRun>,
}

impl BurstLevel {
    /// One figure of the runs' [`BurstStats`] as `median [min–max]`.
    pub fn spread(&self, system_tokens: usize, figure: fn(&BurstStats) -> f64) -> Option<Spread> {
        let values: Vec<f64> = self.runs.iter().map(|r| figure(&r.stats(system_tokens))).collect();
        Spread::of(&values)
    }

    /// Serialised in most of its runs.
    pub fn serialised(&self) -> bool {
        2 * self.runs.iter().filter(|r| r.serialised()).count() > self.runs.len()
    }
}

/// How the slowest call grows with the burst's size over the levels: the least-squares slope
/// of the median `max latency` over N, in milliseconds per added call, and the median lone
/// call's latency. `None` for fewer than two levels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Growth {
    pub ms_per_call: f64,
    pub single_ms: f64,
}

impl Growth {
    pub fn of(levels: &[BurstLevel], system_tokens: usize) -> Option<Self> {
        let points: Vec<(f64, f64)> = levels
            .iter()
            .filter_map(|l| {
                Some((l.concurrency as f64, l.spread(system_tokens, |s| s.latency_max_ms)?.median))
            })
            .collect();
        let singles: Vec<f64> = levels
            .iter()
            .flat_map(|l| &l.runs)
            .map(|r| r.single.latency.as_secs_f64() * 1000.0)
            .collect();
        Some(Self { ms_per_call: slope(&points)?, single_ms: Spread::of(&singles)?.median })
    }

    /// The growth in lone calls per added call: about 1 when each call waits for all the
    /// others' work, near 0 when the calls share it.
    pub fn lone_calls_per_call(&self) -> f64 {
        self.ms_per_call / self.single_ms
    }
}

/// A call's time from its first token to its end.
fn streaming(m: &Measurement) -> Duration {
    m.latency.saturating_sub(m.ttft)
}

/// Burst number `index` of `concurrency` calls, on its own system prompt. Fails only when the
/// warm-up or the lone call fails; the concurrent calls' failures are kept in the result.
pub async fn run_burst(
    client: &Client,
    workload: &Workload,
    index: usize,
    concurrency: usize,
) -> Result<BurstRun, BenchError> {
    let system: Arc<str> =
        workload.system_for(workload.salt().wrapping_add(1 + index as u64)).into();
    let max_tokens = workload.max_tokens();
    let warm = client.chat(&system, &user_message(0), max_tokens).await?;
    let single = client.chat(&system, &user_message(1), max_tokens).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let (client, system) = (client.clone(), system.clone());
            tokio::spawn(
                async move { client.chat(&system, &user_message(2 + i), max_tokens).await },
            )
        })
        .collect();
    let mut calls = Vec::with_capacity(concurrency);
    for task in tasks {
        calls.push(match task.await {
            Ok(result) => result.map_err(CallFailure::from),
            Err(join) => Err(CallFailure { status: None, message: join.to_string() }),
        });
    }
    Ok(BurstRun { concurrency, warm, single, calls, wall: start.elapsed() })
}

/// Runs `runs` bursts at each of `levels` (zeros skipped); `done` hears each burst as it ends.
pub async fn run_bursts(
    client: &Client,
    workload: &Workload,
    levels: &[usize],
    runs: usize,
    done: &mut dyn FnMut(&BurstRun, usize),
) -> Result<Vec<BurstLevel>, BenchError> {
    let mut out = Vec::new();
    for (index, &concurrency) in levels.iter().filter(|&&n| n > 0).enumerate() {
        let mut level = BurstLevel { concurrency, runs: Vec::new() };
        for round in 0..runs.max(1) {
            let run = run_burst(client, workload, index * 1000 + round, concurrency).await?;
            done(&run, round);
            level.runs.push(run);
        }
        out.push(level);
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::agentic::tests::m;

    fn refused(status: Option<u16>) -> Result<Measurement, CallFailure> {
        Err(CallFailure { status, message: format!("status {status:?}") })
    }

    pub fn burst() -> BurstRun {
        BurstRun {
            concurrency: 4,
            warm: m(900, 1000, 0, 16),
            single: m(100, 500, 600, 16),
            calls: vec![
                Ok(m(100, 800, 640, 16)),
                Ok(m(200, 1600, 0, 16)),
                Ok(m(150, 1200, 576, 8)),
                Err(CallFailure { status: Some(429), message: "status 429: full".into() }),
            ],
            wall: Duration::from_millis(2000),
        }
    }

    #[test]
    fn burst_counts() {
        let b = burst();
        assert_eq!(b.errors(), ["status 429: full"]);
        assert_eq!(b.succeeded().count(), 3);
        assert_eq!(b.rate_limited(), 1);
        // Needed: 640 - 64 = 576 cached tokens; only the call with 0 falls short.
        assert_eq!(b.rereads(640), 1);
        assert_eq!(b.rereads(641), 2);
        assert_eq!(b.rereads(10), 0);
        assert_eq!(b.aggregate_tokens_per_second(), 20.0);
        assert_eq!(b.single_tokens_per_second(), 32.0);
    }

    #[test]
    fn stats_of_a_burst() {
        let s = burst().stats(640);
        assert_eq!((s.successes, s.errors, s.rate_limited, s.rereads), (3, 1, 1, 1));
        assert_eq!(
            (s.latency_p50_ms, s.latency_p95_ms, s.latency_max_ms),
            (1200.0, 1600.0, 1600.0)
        );
        assert_eq!((s.ttft_p50_ms, s.ttft_p95_ms, s.wall_ms), (150.0, 200.0, 2000.0));
        // 16/0.8, 16/1.6, 8/1.2 tokens/s: median 10.
        assert_eq!(s.per_request_tokens_per_second, 10.0);
        // Streaming 0.7 + 1.4 + 1.05 s within the 1.5 s from the first token to the last end.
        assert!((s.streams_at_once - 2.1).abs() < 1e-9, "{}", s.streams_at_once);
        assert!(!s.serialised);
        let errors_only = BurstRun { calls: vec![refused(Some(503)), refused(None)], ..burst() };
        let s = errors_only.stats(640);
        assert_eq!((s.successes, s.errors, s.rate_limited), (0, 2, 0));
        assert!(s.latency_p50_ms.is_nan() && s.per_request_tokens_per_second.is_nan());
    }

    /// `n` calls, the k-th (from 1) streaming from `call(k).0` to `call(k).1` ms after the
    /// burst's start; a lone call takes 1 s, its first token after 0.1 s.
    pub fn shaped(n: u64, call: impl Fn(u64) -> (u64, u64)) -> BurstRun {
        let calls: Vec<_> = (1..=n).map(|k| Ok(m(call(k).0, call(k).1, 600, 16))).collect();
        let wall = (1..=n).map(|k| call(k).1).max().unwrap_or(0);
        BurstRun {
            concurrency: n as usize,
            warm: m(100, 1000, 0, 16),
            single: m(100, 1000, 600, 16),
            calls,
            wall: Duration::from_millis(wall),
        }
    }

    #[test]
    fn serialised_when_the_calls_stream_one_at_a_time() {
        for n in [2, 8, 30] {
            // FIFO: each call read and streamed after the one before.
            let fifo = shaped(n, |k| (1000 * (k - 1) + 100, 1000 * k));
            assert!(fifo.serialised(), "n = {n}");
            assert!(fifo.streams_at_once().unwrap() < 1.0);
            // Batched on a machine with no spare compute: every call ~N times slower, with
            // p50 ≈ p95 ≈ max growing linearly with N, but all streaming together.
            let saturated = shaped(n, |k| (100 * n + k, 1000 * n - k));
            assert!(!saturated.serialised(), "n = {n}");
            assert!(saturated.streams_at_once().unwrap() > 0.9 * n as f64);
            let s = saturated.stats(600);
            assert!(s.latency_p50_ms / s.latency_max_ms > 0.99, "p50 ≈ p95 ≈ max");
            // Prompts read one after another, then the answers generated together.
            let staggered = shaped(n, |k| (100 * k, 100 * n + 900));
            assert!(!staggered.serialised(), "n = {n}");
        }
        // Two slots for eight calls: two stream at a time.
        let two_slots = shaped(8, |k| (1000 * ((k - 1) / 2) + 100, 1000 * k.div_ceil(2)));
        assert!((two_slots.streams_at_once().unwrap() - 8.0 * 900.0 / 3900.0).abs() < 1e-9);
        assert!(!two_slots.serialised());
        assert!(!shaped(1, |_| (100, 1000)).serialised(), "one call cannot serialise");
        // Answers sent in one piece (a buffering proxy) tell nothing about the order.
        let unstreamed = shaped(8, |k| (1000 * k, 1000 * k));
        assert_eq!(unstreamed.streams_at_once(), None);
        assert!(!unstreamed.serialised());
        assert!(unstreamed.stats(600).streams_at_once.is_nan());
    }

    #[test]
    fn growth_over_levels() {
        let level = |n: u64, max_ms: u64| BurstLevel {
            concurrency: n as usize,
            runs: vec![shaped(n, |_| (100, max_ms))],
        };
        // Lone calls of 1 s; the slowest call grows 1 s per call.
        let fifo = [level(8, 8000), level(30, 30_000), level(60, 60_000)];
        let growth = Growth::of(&fifo, 600).unwrap();
        assert!((growth.ms_per_call - 1000.0).abs() < 1e-6 && growth.single_ms == 1000.0);
        assert!((growth.lone_calls_per_call() - 1.0).abs() < 1e-9);
        // 100 ms per call.
        let batched = [level(8, 1800), level(30, 4000), level(60, 7000)];
        assert!((Growth::of(&batched, 600).unwrap().lone_calls_per_call() - 0.1).abs() < 1e-9);
        assert_eq!(Growth::of(&fifo[..1], 600), None);
    }

    #[test]
    fn a_level_spreads_its_runs() {
        let level = BurstLevel {
            concurrency: 4,
            runs: vec![burst(), BurstRun { wall: Duration::from_millis(1000), ..burst() }],
        };
        let wall = level.spread(640, |s| s.wall_ms).unwrap();
        assert_eq!(wall, Spread { median: 1500.0, min: 1000.0, max: 2000.0 });
        let fifo = shaped(4, |k| (1000 * (k - 1) + 100, 1000 * k));
        let level = |runs: Vec<BurstRun>| BurstLevel { concurrency: 4, runs };
        assert!(level(vec![fifo.clone(), fifo.clone(), burst()]).serialised());
        // One of two runs serialised is not most of them.
        assert!(!level(vec![fifo, burst()]).serialised());
    }
}
