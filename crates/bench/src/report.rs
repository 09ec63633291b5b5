//! Plain-text report lines, one per phase, ratio and burst.

use std::time::Duration;

use crate::conversation::{ttft_growth_ms_per_1k, Turn};
use crate::stats::percentile;
use crate::workload::{prefix_ratio, BurstRun, Phase, PhaseKind};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `cold       ttft   4012.3 ms  total   4100.0 ms  prompt   2163  cached      0  completion 16`
pub fn phase_line(phase: &Phase) -> String {
    let m = &phase.measurement;
    format!(
        "{:<10} ttft {:>9.1} ms  total {:>9.1} ms  prompt {:>6}  cached {:>6}  completion {}",
        phase.kind.to_string(),
        ms(m.ttft),
        ms(m.latency),
        m.prompt_tokens,
        m.cached_tokens,
        m.completion_tokens
    )
}

/// `median(prefix)/cold = X`, and `restart/cold = Y` when there was a restart.
pub fn ratio_lines(phases: &[Phase]) -> Vec<String> {
    let ttft = |kind: PhaseKind| phases.iter().find(|p| p.kind == kind).map(|p| p.measurement.ttft);
    let mut lines = Vec::new();
    if let Some(ratio) = prefix_ratio(phases) {
        lines.push(format!("median(prefix)/cold = {ratio:.3}"));
    }
    if let (Some(restart), Some(cold)) = (ttft(PhaseKind::Restart), ttft(PhaseKind::Cold)) {
        lines.push(format!("restart/cold = {:.3}", restart.as_secs_f64() / cold.as_secs_f64()));
    }
    lines
}

/// One line per burst: errors, latency and TTFT percentiles, re-reads, throughput.
pub fn burst_line(run: &BurstRun, system_tokens: usize) -> String {
    let latencies: Vec<Duration> = run.succeeded().map(|m| m.latency).collect();
    let ttfts: Vec<Duration> = run.succeeded().map(|m| m.ttft).collect();
    let p = |values: &[Duration], q: f64| percentile(values, q).map_or(f64::NAN, ms);
    let (aggregate, single) = (run.aggregate_tokens_per_second(), run.single_tokens_per_second());
    format!(
        "burst {:>3}: errors {}  latency p50 {:.0} p95 {:.0} max {:.0} ms  ttft p50 {:.0} p95 {:.0} ms  \
         re-read whole prompt {}/{}  {:.1} tok/s aggregate vs {:.1} single-stream ({:.2}x)",
        run.concurrency,
        run.errors().len(),
        p(&latencies, 50.0),
        p(&latencies, 95.0),
        p(&latencies, 100.0),
        p(&ttfts, 50.0),
        p(&ttfts, 95.0),
        run.rereads(system_tokens),
        run.calls.len(),
        aggregate,
        single,
        aggregate / single
    )
}

/// `turn   3  ttft    812.4 ms  total    990.1 ms  prompt   5210  cached   4102  read   1108`
pub fn turn_line(turn: &Turn) -> String {
    let m = &turn.measurement;
    format!(
        "turn {:>3}  ttft {:>9.1} ms  total {:>9.1} ms  prompt {:>6}  cached {:>6}  read {:>6}",
        turn.index,
        ms(m.ttft),
        ms(m.latency),
        m.prompt_tokens,
        m.cached_tokens,
        turn.read()
    )
}

/// Totals of a conversation, and how the time to first token grows with its length after the
/// first call.
pub fn conversation_summary(turns: &[Turn]) -> String {
    let total: Duration = turns.iter().map(|t| t.measurement.latency).sum();
    let read: u64 = turns.iter().map(|t| u64::from(t.read())).sum();
    let prompts: u64 = turns.iter().map(|t| u64::from(t.measurement.prompt_tokens)).sum();
    let growth = ttft_growth_ms_per_1k(turns)
        .map_or_else(|| "n/a".to_string(), |g| format!("{g:.1} ms per 1K prompt tokens"));
    format!(
        "conversation: {} turns in {:.1} s, read {read} of {prompts} prompt tokens; ttft grows {growth} after the first call",
        turns.len(),
        total.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests::{agent_phases, burst, m};

    #[test]
    fn phase_lines() {
        let phases = agent_phases();
        assert_eq!(
            phase_line(&phases[0]),
            "cold       ttft    4000.0 ms  total    4050.0 ms  prompt    700  cached      0  completion 16"
        );
        assert_eq!(
            phase_line(&phases[3]),
            "prefix 2   ttft      90.0 ms  total     140.0 ms  prompt    700  cached      0  completion 16"
        );
    }

    #[test]
    fn ratios_with_and_without_restart() {
        let mut phases = agent_phases();
        assert_eq!(ratio_lines(&phases), ["median(prefix)/cold = 0.028"]);
        phases.push(Phase { kind: PhaseKind::Restart, measurement: m(2000, 2050, 0, 16) });
        assert_eq!(ratio_lines(&phases), ["median(prefix)/cold = 0.028", "restart/cold = 0.500"]);
    }

    #[test]
    fn burst_report() {
        assert_eq!(
            burst_line(&burst(), 640),
            "burst   4: errors 1  latency p50 1200 p95 1600 max 1600 ms  ttft p50 150 p95 200 ms  \
             re-read whole prompt 1/4  20.0 tok/s aggregate vs 32.0 single-stream (0.62x)"
        );
    }
}
