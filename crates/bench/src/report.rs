//! Plain-text report lines, one per phase, ratio and burst.

use std::time::Duration;

use crate::agentic::{AgenticPanel, PhaseSummary, REUSE_THRESHOLD};
use crate::burst::{BurstLevel, BurstRun, BurstStats, Growth};
use crate::conversation::{ConversationRun, Turn};
use crate::gates::{Gates, EARLY_STOP_FRACTION, KV_METRIC};
use crate::quality::{percent, QualityReport, SECTIONS};
use crate::stats::Spread;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The header of [`phase_row`]s.
pub fn phase_header() -> String {
    format!(
        "{:<14} {:>24} {:>22} {:>20} {:>8} {:>8} {:>10}",
        "phase", "ttft ms", "prefill tok/s", "decode tok/s", "prompt", "cached", "completion"
    )
}

/// One phase over all runs, each figure `median [min–max]` when the runs differ.
pub fn phase_row(s: &PhaseSummary) -> String {
    let speed = |v: Option<Spread>| v.map_or_else(|| "-".to_string(), |v| v.display(1));
    format!(
        "{:<14} {:>24} {:>22} {:>20} {:>8} {:>8} {:>10}",
        s.kind.to_string(),
        s.ttft_ms.display(1),
        speed(s.prefill_tokens_per_second),
        speed(s.decode_tokens_per_second),
        s.prompt_tokens.display(0),
        s.cached_tokens.display(0),
        s.completion_tokens.display(0)
    )
}

/// The header and one row per phase of the panel.
pub fn agentic_table(panel: &AgenticPanel) -> Vec<String> {
    let rows = panel.kinds().into_iter().filter_map(|k| panel.summary(k)).map(|s| phase_row(&s));
    std::iter::once(phase_header()).chain(rows).collect()
}

/// `prefix cache reuse: YES (median(prefix-test)/cold = 0.028, threshold 0.2)`, and
/// `cold-prefix/cold = 0.500` when the server restarted.
pub fn verdict_lines(panel: &AgenticPanel) -> Vec<String> {
    let mut lines = Vec::new();
    if let (Some(verdict), Some(ratio)) = (panel.verdict(), panel.ratio()) {
        lines.push(format!(
            "prefix cache reuse: {verdict} (median(prefix-test)/cold = {}, threshold {REUSE_THRESHOLD})",
            ratio.display(3)
        ));
    }
    if let Some(ratio) = panel.cold_prefix_ratio() {
        lines.push(format!("cold-prefix/cold = {}", ratio.display(3)));
    }
    lines
}

/// One line per burst: successes, errors and 429s, latency and TTFT percentiles, re-reads,
/// throughput, the serialised flag.
pub fn burst_line(run: &BurstRun, system_tokens: usize) -> String {
    let s = run.stats(system_tokens);
    format!(
        "burst {:>3}: errors {} (429: {})  latency p50 {:.0} p95 {:.0} max {:.0} ms  ttft p50 {:.0} p95 {:.0} ms  \
         re-read whole prompt {}/{}  wall {:.1} s  {:.1} tok/s aggregate, {:.1} per request vs {:.1} \
         single-stream ({:.2}x)  streams at once {:.1}  serialised {}",
        s.concurrency,
        s.errors,
        s.rate_limited,
        s.latency_p50_ms,
        s.latency_p95_ms,
        s.latency_max_ms,
        s.ttft_p50_ms,
        s.ttft_p95_ms,
        s.rereads,
        run.calls.len(),
        s.wall_ms / 1000.0,
        s.aggregate_tokens_per_second,
        s.per_request_tokens_per_second,
        s.single_tokens_per_second,
        s.aggregate_tokens_per_second / s.single_tokens_per_second,
        s.streams_at_once,
        if s.serialised { "YES" } else { "no" }
    )
}

/// The header and one row per concurrency: each figure `median [min–max]` over the runs.
pub fn burst_table(levels: &[BurstLevel], system_tokens: usize) -> Vec<String> {
    let head = format!(
        "{:>5}  {:>5}  {:>5}  {:>5}  {:>16}  {:>16}  {:>16}  {:>16}  {:>16}  {:>16}  {:>14}  {:>7}  {:>14}  {:>10}",
        "N",
        "ok",
        "err",
        "429",
        "wall s",
        "latency p50 ms",
        "latency p95 ms",
        "latency max ms",
        "ttft p50 ms",
        "aggregate tok/s",
        "req tok/s",
        "re-read",
        "at once",
        "serialised"
    );
    let rows = levels.iter().map(|level| {
        let f = |figure: fn(&BurstStats) -> f64, decimals| {
            level.spread(system_tokens, figure).map_or_else(|| "-".into(), |s| s.display(decimals))
        };
        format!(
            "{:>5}  {:>5}  {:>5}  {:>5}  {:>16}  {:>16}  {:>16}  {:>16}  {:>16}  {:>16}  {:>14}  {:>7}  {:>14}  {:>10}",
            level.concurrency,
            f(|s| s.successes as f64, 0),
            f(|s| s.errors as f64, 0),
            f(|s| s.rate_limited as f64, 0),
            f(|s| s.wall_ms / 1000.0, 1),
            f(|s| s.latency_p50_ms, 0),
            f(|s| s.latency_p95_ms, 0),
            f(|s| s.latency_max_ms, 0),
            f(|s| s.ttft_p50_ms, 0),
            f(|s| s.aggregate_tokens_per_second, 1),
            f(|s| s.per_request_tokens_per_second, 1),
            f(|s| s.rereads as f64, 0),
            f(|s| s.streams_at_once, 1),
            if level.serialised() { "YES" } else { "no" }
        )
    });
    let growth = Growth::of(levels, system_tokens).map(|g| {
        format!(
            "slowest call grows {:.0} ms per added call, {:.2} of a lone call ({:.0} ms)",
            g.ms_per_call,
            g.lone_calls_per_call(),
            g.single_ms
        )
    });
    std::iter::once(head).chain(rows).chain(growth).collect()
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

/// Totals of a conversation, and how the cost of a call grows with its depth after the first.
pub fn conversation_summary(run: &ConversationRun) -> Vec<String> {
    let (prompt, cached, read) = run.total_tokens();
    let per_1k = |g: Option<f64>| g.map_or_else(|| "n/a".to_string(), |g| format!("{g:.1} ms"));
    let depth = run.depth_cost_ratio().map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}x"));
    let stopped = run.stopped.iter().map(|why| format!("conversation stopped early at {why}"));
    stopped.chain([
        format!(
            "conversation: {} turns in {:.1} s, {prompt} prompt tokens: {cached} cached, {read} re-read",
            run.turns.len(),
            run.total_seconds()
        ),
        format!(
            "cost vs depth: latency +{} and ttft +{} per 1K prompt tokens; last/first quarter latency {depth}",
            per_1k(run.latency_growth_ms_per_1k()),
            per_1k(run.ttft_growth_ms_per_1k())
        ),
    ])
    .collect()
}

/// One line per probe run: clean tool calls and edit turns, or sections delivered; then each
/// dirty turn's problem.
pub fn quality_lines(report: &QualityReport) -> Vec<String> {
    let mut lines = Vec::new();
    for probe in &report.code {
        let (clean, edit) = (probe.clean(), probe.edit_clean());
        lines.push(format!(
            "code [{}]: tool calls clean {}/{} ({:.1}%), edit turns clean {}/{} ({:.1}%)",
            probe.thinking,
            clean.0,
            clean.1,
            percent(clean),
            edit.0,
            edit.1,
            percent(edit)
        ));
        for turn in probe.turns.iter().filter(|t| !t.clean()) {
            let problem = turn.check.problem.as_deref().unwrap_or_default();
            let problem: String = problem.chars().take(120).collect();
            lines.push(format!("  turn {} (script: {}): {problem}", turn.turn + 1, turn.expected));
        }
    }
    for probe in &report.instruct {
        let error = probe.error.as_deref().map_or_else(String::new, |e| format!("  error: {e}"));
        lines.push(format!(
            "instruct [{}]: sections delivered {}/{} ({:.0}%), {} completion tokens{error}",
            probe.thinking,
            probe.sections,
            SECTIONS.len(),
            percent((probe.sections, SECTIONS.len())),
            probe.completion_tokens
        ));
    }
    lines
}

/// The quality gates and footprint: early_stop, memory, KV occupancy, another busy process.
pub fn gate_lines(gates: &Gates) -> Vec<String> {
    let e = &gates.early_stop;
    let mib = |b: Option<u64>| {
        b.map_or_else(|| "n/a".to_string(), |b| format!("{:.1} MiB", b as f64 / 1048576.0))
    };
    let mut lines = vec![match e.runs {
        0 => "early_stop: n/a (no completion to compare)".to_string(),
        _ => format!(
            "early_stop: {} ({} of {} calls under {EARLY_STOP_FRACTION} × the median {:.0} completion tokens)",
            if e.tripped() { "YES" } else { "no" },
            e.short,
            e.runs,
            e.median_completion
        ),
    }];
    if gates.idle.rss_bytes.is_some() || gates.under_load.rss_bytes.is_some() {
        lines.push(format!(
            "server memory: {} idle, {} peak under load ({})",
            mib(gates.idle.rss_bytes),
            mib(gates.under_load.rss_bytes),
            gates.memory_source
        ));
    } else {
        lines
            .push("server memory: not reported (no /metrics process_resident_memory_bytes)".into());
    }
    if let Some(peak) = gates.under_load.kv_usage {
        lines.push(format!("kv cache: peak usage {:.1}% ({KV_METRIC})", peak * 100.0));
    }
    if let Some(cores) = gates.foreign_load() {
        lines.push(format!(
            "warning: another process kept {cores:.1} cores busy beside the benchmark; timings are not reliable"
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agentic::tests::{agent_phases, m};
    use crate::agentic::{Phase, PhaseKind};
    use crate::burst::tests::{burst, shaped};

    #[test]
    fn agentic_table_and_verdict() {
        let mut restarted = agent_phases();
        restarted.push(Phase { kind: PhaseKind::ColdPrefix, measurement: m(2000, 2050, 0, 16) });
        let panel = AgenticPanel { runs: vec![restarted, agent_phases()] };
        let table = agentic_table(&panel);
        assert_eq!(table.len(), 7, "{table:#?}");
        assert!(table[0].starts_with("phase "), "{}", table[0]);
        assert_eq!(
            table[1],
            "cold                             4000.0                  175.0                300.0      700        0         16"
        );
        assert!(table[3].starts_with("prefix-test-1 "), "{}", table[3]);
        assert!(table[6].starts_with("cold-prefix "), "{}", table[6]);
        assert_eq!(
            verdict_lines(&panel),
            [
                "prefix cache reuse: YES (median(prefix-test)/cold = 0.028, threshold 0.2)",
                "cold-prefix/cold = 0.500"
            ]
        );
        let warm_only = AgenticPanel { runs: vec![agent_phases()[1..].to_vec()] };
        assert!(verdict_lines(&warm_only).is_empty());
    }

    #[test]
    fn burst_report() {
        assert_eq!(
            burst_line(&burst(), 640),
            "burst   4: errors 1 (429: 1)  latency p50 1200 p95 1600 max 1600 ms  ttft p50 150 p95 200 ms  \
             re-read whole prompt 1/4  wall 2.0 s  20.0 tok/s aggregate, 10.0 per request vs 32.0 \
             single-stream (0.62x)  streams at once 2.1  serialised no"
        );
        let queued = shaped(4, |k| (1000 * (k - 1) + 100, 1000 * k));
        assert!(burst_line(&queued, 640).ends_with("streams at once 0.9  serialised YES"));
        let fast = BurstRun { wall: std::time::Duration::from_millis(1000), ..burst() };
        let levels = [BurstLevel { concurrency: 4, runs: vec![burst(), fast.clone(), fast] }];
        let table = burst_table(&levels, 640);
        assert_eq!(table.len(), 2);
        let cells: Vec<&str> =
            table[1].split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
        assert_eq!(cells[..3], ["4", "3", "1"]);
        assert!(cells.contains(&"1.0 [1.0–2.0]"), "{cells:?}");
        assert!(cells.contains(&"40.0 [20.0–40.0]"), "{cells:?}");
        assert_eq!(cells[12], "2.1", "streams at once");
        assert!(table[1].ends_with(" no"), "the calls streamed together");
        let queued = [BurstLevel { concurrency: 4, runs: vec![queued.clone(), queued, burst()] }];
        assert!(burst_table(&queued, 640)[1].ends_with(" YES"), "two of three runs queued");
        let bigger =
            BurstRun { concurrency: 8, wall: std::time::Duration::from_millis(4000), ..burst() };
        let levels = [levels[0].clone(), BurstLevel { concurrency: 8, runs: vec![bigger] }];
        let table = burst_table(&levels, 640);
        // The slowest call stays at 1600 ms from 4 to 8 calls.
        assert_eq!(
            table[3],
            "slowest call grows 0 ms per added call, 0.00 of a lone call (500 ms)"
        );
    }

    #[test]
    fn gate_report() {
        use crate::gates::{EarlyStop, Footprint};
        let mut gates = Gates {
            early_stop: EarlyStop::of(&[16, 16, 3, 2, 16]),
            memory_source: "/proc/PID/status VmRSS".into(),
            idle: Footprint { rss_bytes: Some(100 << 20), kv_usage: Some(0.0) },
            under_load: Footprint { rss_bytes: Some(150 << 20), kv_usage: Some(0.125) },
            foreign_cores_before: Some(0.0),
            foreign_cores_during: Some(1.5),
        };
        assert_eq!(
            gate_lines(&gates),
            [
                "early_stop: YES (2 of 5 calls under 0.5 × the median 16 completion tokens)",
                "server memory: 100.0 MiB idle, 150.0 MiB peak under load (/proc/PID/status VmRSS)",
                "kv cache: peak usage 12.5% (vllm:kv_cache_usage_perc)",
                "warning: another process kept 1.5 cores busy beside the benchmark; timings are not reliable"
            ]
        );
        gates.under_load = Footprint::default();
        gates.idle = Footprint::default();
        gates.foreign_cores_during = None;
        gates.early_stop = EarlyStop::of(&[]);
        assert_eq!(
            gate_lines(&gates),
            [
                "early_stop: n/a (no completion to compare)",
                "server memory: not reported (no /metrics process_resident_memory_bytes)"
            ]
        );
    }

    #[test]
    fn quality_report_lines() {
        let lines = quality_lines(&crate::json::tests::quality_report());
        assert_eq!(
            lines,
            [
                "code [enable_thinking=off]: tool calls clean 1/2 (50.0%), edit turns clean 1/2 (50.0%)",
                "  turn 2 (script: edit_file): edit_file: edits: expected array, got object",
                "instruct [enable_thinking=on + preserve_thinking=on]: sections delivered 4/5 (80%), 300 completion tokens"
            ]
        );
    }
}
