//! The agentic panel (asiai's `--agentic-mode`): a cold call, the same call again, three calls
//! with the same system prompt and new user text, and one after a server restart, repeated
//! `--runs` times. The headline is the verdict on cross-user prefix reuse:
//! `median(prefix-test) / cold` of the time to first token below [`REUSE_THRESHOLD`].
//!
//! ```text
//! agent:  warm-up ─▶ cold ─▶ warm (same messages) ─▶ prefix-test 1..3 (same system, new user)
//!         ─▶ [server restart] ─▶ warm-up ─▶ cold-prefix (same system, new user)
//! ```

use std::future::Future;
use std::time::Duration;

use crate::client::Client;
use crate::error::BenchError;
use crate::prompt::user_message;
use crate::sse::Measurement;
use crate::stats::{median, Spread};
use crate::workload::Workload;

/// Calls of the agent pattern with the same system prompt and a new user message.
pub const PREFIX_CALLS: usize = 3;

/// Below this `median(prefix-test) / cold`, the server reuses the system prompt it cached.
pub const REUSE_THRESHOLD: f64 = 0.2;

/// One step of the agent pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseKind {
    /// First sight of the system prompt.
    Cold,
    /// The cold call's messages again.
    Warm,
    /// Same system prompt, the n-th new user message (from 1).
    Prefix(usize),
    /// Same system prompt, a new user message, after the server restarted: what a persistent
    /// (disk) cache keeps.
    ColdPrefix,
}

impl std::fmt::Display for PhaseKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PhaseKind::Cold => f.write_str("cold"),
            PhaseKind::Warm => f.write_str("warm"),
            PhaseKind::Prefix(n) => write!(f, "prefix-test-{n}"),
            PhaseKind::ColdPrefix => f.write_str("cold-prefix"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    pub kind: PhaseKind,
    pub measurement: Measurement,
}

/// The TTFT of the median prefix-test call over the cold call's, `None` without both.
pub fn prefix_ratio(phases: &[Phase]) -> Option<f64> {
    let cold = phases.iter().find(|p| p.kind == PhaseKind::Cold)?.measurement.ttft;
    let prefix: Vec<Duration> = phases
        .iter()
        .filter(|p| matches!(p.kind, PhaseKind::Prefix(_)))
        .map(|p| p.measurement.ttft)
        .collect();
    Some(median(&prefix)?.as_secs_f64() / cold.as_secs_f64())
}

/// Whether the server served a new user's call from the cached system prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Yes,
    No,
}

impl Verdict {
    /// `Yes` when `ratio` (`median(prefix-test) / cold`) is below [`REUSE_THRESHOLD`].
    pub fn from_ratio(ratio: f64) -> Self {
        if ratio < REUSE_THRESHOLD {
            Verdict::Yes
        } else {
            Verdict::No
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Yes => "YES",
            Verdict::No => "NO",
        })
    }
}

/// One phase over all runs: each figure as `median [min–max]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseSummary {
    pub kind: PhaseKind,
    pub ttft_ms: Spread,
    /// `None` when every call took its whole prompt from the cache.
    pub prefill_tokens_per_second: Option<Spread>,
    /// `None` when no call produced two tokens.
    pub decode_tokens_per_second: Option<Spread>,
    pub prompt_tokens: Spread,
    pub cached_tokens: Spread,
    pub completion_tokens: Spread,
}

/// The phases of every run of the panel, in the order they ran.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgenticPanel {
    pub runs: Vec<Vec<Phase>>,
}

impl AgenticPanel {
    /// The phase kinds, in the order of their first appearance.
    pub fn kinds(&self) -> Vec<PhaseKind> {
        let mut kinds: Vec<PhaseKind> = Vec::new();
        for phase in self.runs.iter().flatten() {
            if !kinds.contains(&phase.kind) {
                kinds.push(phase.kind);
            }
        }
        kinds
    }

    /// Every run's measurement of `kind`.
    pub fn measurements(&self, kind: PhaseKind) -> Vec<Measurement> {
        self.runs.iter().flatten().filter(|p| p.kind == kind).map(|p| p.measurement).collect()
    }

    /// `kind` over all runs; `None` when no run has it.
    pub fn summary(&self, kind: PhaseKind) -> Option<PhaseSummary> {
        let ms = self.measurements(kind);
        let of = |f: fn(&Measurement) -> f64| Spread::of(&ms.iter().map(f).collect::<Vec<_>>());
        Some(PhaseSummary {
            kind,
            ttft_ms: of(|m| m.ttft.as_secs_f64() * 1000.0)?,
            prefill_tokens_per_second: of(Measurement::prefill_tokens_per_second),
            decode_tokens_per_second: of(Measurement::decode_tokens_per_second),
            prompt_tokens: of(|m| f64::from(m.prompt_tokens))?,
            cached_tokens: of(|m| f64::from(m.cached_tokens))?,
            completion_tokens: of(|m| f64::from(m.completion_tokens))?,
        })
    }

    /// `median(prefix-test) / cold` of each run that has both.
    pub fn ratios(&self) -> Vec<f64> {
        self.runs.iter().filter_map(|run| prefix_ratio(run)).collect()
    }

    /// The runs' `median(prefix-test) / cold`.
    pub fn ratio(&self) -> Option<Spread> {
        Spread::of(&self.ratios())
    }

    /// The verdict on the median run's ratio.
    pub fn verdict(&self) -> Option<Verdict> {
        self.ratio().map(|r| Verdict::from_ratio(r.median))
    }

    /// The runs' `cold-prefix / cold` of the time to first token.
    pub fn cold_prefix_ratio(&self) -> Option<Spread> {
        let ratios: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|run| {
                let ttft = |kind| run.iter().find(|p| p.kind == kind).map(|p| p.measurement.ttft);
                Some(
                    ttft(PhaseKind::ColdPrefix)?.as_secs_f64()
                        / ttft(PhaseKind::Cold)?.as_secs_f64(),
                )
            })
            .collect();
        Spread::of(&ratios)
    }
}

/// After a [`Workload::warm_up`]: cold, warm, and [`PREFIX_CALLS`] new-user calls, one after
/// another.
pub async fn agent_calls(client: &Client, workload: &Workload) -> Result<Vec<Phase>, BenchError> {
    workload.warm_up(client).await?;
    let mut phases = Vec::new();
    for (kind, user) in [(PhaseKind::Cold, 0), (PhaseKind::Warm, 0)]
        .into_iter()
        .chain((1..=PREFIX_CALLS).map(|n| (PhaseKind::Prefix(n), n)))
    {
        let measurement =
            client.chat(&workload.system, &user_message(user), workload.max_tokens()).await?;
        phases.push(Phase { kind, measurement });
    }
    Ok(phases)
}

/// The call after a restart (and a [`Workload::warm_up`]): the agent's system prompt with yet
/// another user message.
pub async fn cold_prefix_call(client: &Client, workload: &Workload) -> Result<Phase, BenchError> {
    workload.warm_up(client).await?;
    let user = user_message(PREFIX_CALLS + 1);
    let measurement = client.chat(&workload.system, &user, workload.max_tokens()).await?;
    Ok(Phase { kind: PhaseKind::ColdPrefix, measurement })
}

/// Restarts the server between a run's prefix tests and its cold-prefix call.
pub trait Restart {
    /// Restarts the server and returns once it answers again: `Ok(true)`, or `Ok(false)` when
    /// this server cannot be restarted (the cold-prefix phase is then skipped).
    fn restart(&mut self) -> impl Future<Output = Result<bool, BenchError>>;
}

/// A server that is not ours to restart.
pub struct NoRestart;

impl Restart for NoRestart {
    async fn restart(&mut self) -> Result<bool, BenchError> {
        Ok(false)
    }
}

/// What one agentic panel sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgenticOptions {
    /// Salt of the first run's system prompt; each run has its own.
    pub salt: u64,
    pub system_tokens: usize,
    pub max_tokens: u32,
    pub runs: usize,
}

impl AgenticOptions {
    /// The system prompt's salt of run `run` (from 0): far apart, so no two runs share one.
    pub fn run_salt(&self, run: usize) -> u64 {
        self.salt.wrapping_add(run as u64 * 1_000_003)
    }
}

/// Runs the panel `options.runs` times, each with a new system prompt: cold, warm, prefix-test
/// ×[`PREFIX_CALLS`], then a restart and the cold-prefix call when `restart` can restart.
/// `progress` hears what is running; `prepared` gets each run's workload before it runs.
pub async fn run_panel(
    client: &Client,
    options: &AgenticOptions,
    restart: &mut impl Restart,
    progress: &mut dyn FnMut(&str),
    prepared: &mut dyn FnMut(&Workload),
) -> Result<AgenticPanel, BenchError> {
    let mut panel = AgenticPanel::default();
    let runs = options.runs.max(1);
    for run in 0..runs {
        let salt = options.run_salt(run);
        let workload =
            Workload::prepare(client, salt, options.system_tokens, options.max_tokens).await;
        prepared(&workload);
        progress(&format!("agentic run {}/{runs}: cold, warm, prefix-test ×3", run + 1));
        let mut phases = agent_calls(client, &workload).await?;
        progress(&format!("agentic run {}/{runs}: restart", run + 1));
        if restart.restart().await? {
            progress(&format!("agentic run {}/{runs}: cold-prefix", run + 1));
            phases.push(cold_prefix_call(client, &workload).await?);
        }
        panel.runs.push(phases);
    }
    Ok(panel)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn m(ttft_ms: u64, latency_ms: u64, cached: u32, completion: u32) -> Measurement {
        Measurement {
            ttft: Duration::from_millis(ttft_ms),
            latency: Duration::from_millis(latency_ms),
            prompt_tokens: 700,
            cached_tokens: cached,
            completion_tokens: completion,
        }
    }

    /// One run: cold 4 s, warm 0.1 s, prefix-tests 130/90/110 ms (median 110 ms).
    pub fn agent_phases() -> Vec<Phase> {
        phases_with_cold(4000)
    }

    fn phases_with_cold(cold_ms: u64) -> Vec<Phase> {
        [
            (PhaseKind::Cold, cold_ms),
            (PhaseKind::Warm, 100),
            (PhaseKind::Prefix(1), 130),
            (PhaseKind::Prefix(2), 90),
            (PhaseKind::Prefix(3), 110),
        ]
        .into_iter()
        .map(|(kind, ttft)| Phase { kind, measurement: m(ttft, ttft + 50, 0, 16) })
        .collect()
    }

    #[test]
    fn ratio_is_median_prefix_over_cold() {
        assert_eq!(prefix_ratio(&agent_phases()), Some(0.11 / 4.0));
        assert_eq!(prefix_ratio(&agent_phases()[..2]), None);
        assert_eq!(prefix_ratio(&agent_phases()[1..]), None);
    }

    #[test]
    fn phase_names() {
        let names: Vec<String> =
            [PhaseKind::Cold, PhaseKind::Warm, PhaseKind::Prefix(2), PhaseKind::ColdPrefix]
                .iter()
                .map(|k| k.to_string())
                .collect();
        assert_eq!(names, ["cold", "warm", "prefix-test-2", "cold-prefix"]);
    }

    #[test]
    fn verdict_threshold_is_strict() {
        assert_eq!(Verdict::from_ratio(0.028), Verdict::Yes);
        assert_eq!(Verdict::from_ratio(0.199), Verdict::Yes);
        assert_eq!(Verdict::from_ratio(0.2), Verdict::No);
        assert_eq!(Verdict::from_ratio(0.9).to_string(), "NO");
    }

    #[test]
    fn a_panel_summarises_each_phase_over_runs() {
        // Cold 4 s, 0.3 s and 1 s: ratios 0.0275, 0.367, 0.11 -> median 0.11.
        let panel = AgenticPanel {
            runs: vec![phases_with_cold(4000), phases_with_cold(300), phases_with_cold(1000)],
        };
        assert_eq!(panel.kinds()[..3], [PhaseKind::Cold, PhaseKind::Warm, PhaseKind::Prefix(1)]);
        let cold = panel.summary(PhaseKind::Cold).unwrap();
        assert_eq!(cold.ttft_ms, Spread { median: 1000.0, min: 300.0, max: 4000.0 });
        assert_eq!(cold.prompt_tokens.display(0), "700");
        // 700 tokens read in 1 s; 15 tokens after the first in 50 ms.
        assert_eq!(cold.prefill_tokens_per_second.unwrap().median, 700.0);
        assert!((cold.decode_tokens_per_second.unwrap().median - 300.0).abs() < 1e-9);
        let ratio = panel.ratio().unwrap();
        assert!((ratio.median - 0.11).abs() < 1e-12, "{ratio:?}");
        assert_eq!(panel.verdict(), Some(Verdict::Yes));
        assert_eq!(panel.summary(PhaseKind::ColdPrefix), None);
        assert_eq!(panel.cold_prefix_ratio(), None);

        let slow = AgenticPanel { runs: vec![phases_with_cold(400)] };
        assert_eq!(slow.verdict(), Some(Verdict::No), "110/400 = 0.275");
        let mut restarted = agent_phases();
        restarted.push(Phase { kind: PhaseKind::ColdPrefix, measurement: m(2000, 2050, 0, 16) });
        let panel = AgenticPanel { runs: vec![restarted] };
        assert_eq!(panel.cold_prefix_ratio().unwrap().median, 0.5);
    }
}
