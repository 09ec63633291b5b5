//! The JSON file of a run: the settings and every measurement (each call of each phase, burst
//! and turn), the summaries the terminal table shows, and the gates. Figures that could not be
//! measured (a speed without tokens, a percentile without calls) are `null`.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::agentic::AgenticPanel;
use crate::burst::{BurstLevel, BurstRun, BurstStats, Growth};
use crate::conversation::ConversationRun;
use crate::gates::Gates;
use crate::quality::{percent, QualityReport, SECTIONS};
use crate::results::{Meta, Results};
use crate::sse::Measurement;
use crate::stats::Spread;
use crate::workload::TokenCount;

/// Version of the document's layout; raised when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

/// The whole document.
pub fn document(meta: &Meta, results: &Results) -> Value {
    let system_tokens = meta.system_tokens.value();
    let mut doc = json!({
        "schema_version": SCHEMA_VERSION,
        "tool": "spindle bench",
        "panel": meta.panel,
        "server": meta.server,
        "model": meta.model,
        "seed": meta.seed,
        "max_tokens": meta.max_tokens,
        "started_unix": meta.started_unix,
        "system_prompt": {
            "chars": meta.system_chars,
            "tokens": meta.system_tokens.value(),
            "counted": matches!(meta.system_tokens, TokenCount::Counted(_)),
        },
    });
    if let Some(panel) = &results.agentic {
        doc["agentic"] = agentic(panel);
    }
    if !results.bursts.is_empty() {
        let levels: Vec<Value> = results.bursts.iter().map(|l| level(l, system_tokens)).collect();
        let growth = Growth::of(&results.bursts, system_tokens).map(|g| {
            json!({"max_latency_ms_per_added_call": g.ms_per_call, "single_latency_ms": g.single_ms,
                "lone_calls_per_added_call": g.lone_calls_per_call()})
        });
        doc["burst"] = json!({ "levels": levels, "growth": growth });
    }
    if let Some(run) = &results.conversation {
        doc["conversation"] = conversation(run);
    }
    if let Some(report) = &results.quality {
        doc["quality"] = quality(report);
    }
    if let Some(panel) = &results.speculation {
        doc["speculation"] = crate::speculation::report::json(panel);
    }
    if let Some(gates) = &results.gates {
        doc["gates"] = gates_json(gates);
    }
    doc
}

/// Writes `dir/<panel>.json`; returns its path.
pub fn write(dir: &Path, meta: &Meta, results: &Results) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.json", meta.panel));
    let text = serde_json::to_string_pretty(&document(meta, results))?;
    std::fs::write(&path, text + "\n")?;
    Ok(path)
}

/// One call's figures.
pub fn measurement(m: &Measurement) -> Value {
    json!({
        "ttft_ms": m.ttft.as_secs_f64() * 1000.0,
        "latency_ms": m.latency.as_secs_f64() * 1000.0,
        "prompt_tokens": m.prompt_tokens,
        "cached_tokens": m.cached_tokens,
        "read_tokens": m.read_tokens(),
        "completion_tokens": m.completion_tokens,
        "prefill_tokens_per_second": m.prefill_tokens_per_second(),
        "decode_tokens_per_second": m.decode_tokens_per_second(),
    })
}

fn spread(s: Option<Spread>) -> Value {
    s.map_or(Value::Null, |s| json!({"median": s.median, "min": s.min, "max": s.max}))
}

/// `measurement(m)` with `extra`'s fields in front.
fn with(extra: Value, m: &Measurement) -> Value {
    let mut out = extra;
    if let (Some(out), Value::Object(fields)) = (out.as_object_mut(), measurement(m)) {
        out.extend(fields);
    }
    out
}

fn agentic(panel: &AgenticPanel) -> Value {
    let runs: Vec<Value> = panel
        .runs
        .iter()
        .enumerate()
        .map(|(i, phases)| {
            let phases: Vec<Value> = phases
                .iter()
                .map(|p| with(json!({"phase": p.kind.to_string()}), &p.measurement))
                .collect();
            json!({"run": i, "phases": phases})
        })
        .collect();
    let summary: Vec<Value> = panel
        .kinds()
        .into_iter()
        .filter_map(|k| panel.summary(k))
        .map(|s| {
            json!({
                "phase": s.kind.to_string(),
                "ttft_ms": spread(Some(s.ttft_ms)),
                "prefill_tokens_per_second": spread(s.prefill_tokens_per_second),
                "decode_tokens_per_second": spread(s.decode_tokens_per_second),
                "prompt_tokens": spread(Some(s.prompt_tokens)),
                "cached_tokens": spread(Some(s.cached_tokens)),
                "completion_tokens": spread(Some(s.completion_tokens)),
            })
        })
        .collect();
    json!({
        "runs": runs,
        "summary": summary,
        "prefix_ratio": spread(panel.ratio()),
        "prefix_ratio_threshold": crate::agentic::REUSE_THRESHOLD,
        "prefix_cache_reuse": panel.verdict().map(|v| v.to_string()),
        "cold_prefix_ratio": spread(panel.cold_prefix_ratio()),
    })
}

fn stats(s: &BurstStats) -> Value {
    json!({
        "successes": s.successes,
        "errors": s.errors,
        "rate_limited": s.rate_limited,
        "wall_ms": s.wall_ms,
        "latency_p50_ms": s.latency_p50_ms,
        "latency_p95_ms": s.latency_p95_ms,
        "latency_max_ms": s.latency_max_ms,
        "ttft_p50_ms": s.ttft_p50_ms,
        "ttft_p95_ms": s.ttft_p95_ms,
        "aggregate_tokens_per_second": s.aggregate_tokens_per_second,
        "per_request_tokens_per_second": s.per_request_tokens_per_second,
        "single_tokens_per_second": s.single_tokens_per_second,
        "rereads": s.rereads,
        "streams_at_once": s.streams_at_once,
        "serialised": s.serialised,
    })
}

fn burst_run(run: &BurstRun, system_tokens: usize) -> Value {
    let calls: Vec<Value> = run
        .calls
        .iter()
        .map(|c| match c {
            Ok(m) => with(json!({"ok": true}), m),
            Err(f) => json!({"ok": false, "status": f.status, "error": f.message}),
        })
        .collect();
    json!({
        "stats": stats(&run.stats(system_tokens)),
        "warm_up": measurement(&run.warm),
        "single": measurement(&run.single),
        "calls": calls,
    })
}

fn level(level: &BurstLevel, system_tokens: usize) -> Value {
    let figure = |f: fn(&BurstStats) -> f64| spread(level.spread(system_tokens, f));
    json!({
        "concurrency": level.concurrency,
        "serialised": level.serialised(),
        "summary": {
            "wall_ms": figure(|s| s.wall_ms),
            "latency_p50_ms": figure(|s| s.latency_p50_ms),
            "latency_p95_ms": figure(|s| s.latency_p95_ms),
            "latency_max_ms": figure(|s| s.latency_max_ms),
            "ttft_p50_ms": figure(|s| s.ttft_p50_ms),
            "ttft_p95_ms": figure(|s| s.ttft_p95_ms),
            "aggregate_tokens_per_second": figure(|s| s.aggregate_tokens_per_second),
            "per_request_tokens_per_second": figure(|s| s.per_request_tokens_per_second),
            "errors": figure(|s| s.errors as f64),
            "rate_limited": figure(|s| s.rate_limited as f64),
            "rereads": figure(|s| s.rereads as f64),
        },
        "runs": level.runs.iter().map(|r| burst_run(r, system_tokens)).collect::<Vec<_>>(),
    })
}

fn conversation(run: &ConversationRun) -> Value {
    let (prompt, cached, read) = run.total_tokens();
    let turns: Vec<Value> =
        run.turns.iter().map(|t| with(json!({"turn": t.index}), &t.measurement)).collect();
    json!({
        "turns": turns,
        "totals": {
            "seconds": run.total_seconds(),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "read_tokens": read,
        },
        "latency_growth_ms_per_1k_prompt_tokens": run.latency_growth_ms_per_1k(),
        "ttft_growth_ms_per_1k_prompt_tokens": run.ttft_growth_ms_per_1k(),
        "depth_cost_ratio": run.depth_cost_ratio(),
        "stopped": run.stopped,
    })
}

fn quality(report: &QualityReport) -> Value {
    let code: Vec<Value> = report
        .code
        .iter()
        .map(|p| {
            let turns: Vec<Value> = p
                .turns
                .iter()
                .map(|t| {
                    json!({"turn": t.turn, "script_tool": t.expected, "called": t.check.called,
                        "clean": t.clean(), "problem": t.check.problem,
                        "completion_tokens": t.completion_tokens})
                })
                .collect();
            json!({"thinking": p.thinking.to_string(), "chat_template_kwargs": p.thinking.kwargs(),
                "clean_percent": percent(p.clean()), "edit_clean_percent": percent(p.edit_clean()),
                "turns": turns})
        })
        .collect();
    let instruct: Vec<Value> = report
        .instruct
        .iter()
        .map(|p| {
            json!({"thinking": p.thinking.to_string(), "chat_template_kwargs": p.thinking.kwargs(),
                "sections": p.sections, "of": SECTIONS.len(),
                "completion_tokens": p.completion_tokens, "error": p.error})
        })
        .collect();
    json!({"seed": crate::quality::SEED, "code": code, "instruct": instruct})
}

fn gates_json(g: &Gates) -> Value {
    json!({
        "early_stop": {
            "tripped": g.early_stop.tripped(),
            "short_calls": g.early_stop.short,
            "calls": g.early_stop.runs,
            "median_completion_tokens": g.early_stop.median_completion,
        },
        "memory": {
            "source": g.memory_source,
            "idle_bytes": g.idle.rss_bytes,
            "peak_bytes": g.under_load.rss_bytes,
        },
        "kv_cache_usage": {"idle": g.idle.kv_usage, "peak": g.under_load.kv_usage},
        "foreign_cores": {"before": g.foreign_cores_before, "during": g.foreign_cores_during},
        "busy_machine_warning": g.foreign_load().is_some(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::agentic::tests::agent_phases;
    use crate::burst::tests::burst;
    use crate::gates::{EarlyStop, Footprint};

    pub fn meta(panel: &str) -> Meta {
        Meta {
            panel: panel.into(),
            server: "http://127.0.0.1:1".into(),
            model: Some("m".into()),
            seed: 7,
            max_tokens: 16,
            system_chars: 7000,
            system_tokens: TokenCount::Counted(2150),
            started_unix: 1,
        }
    }

    pub fn full_results() -> Results {
        use crate::conversation::Turn;
        let turns = (0..9)
            .map(|i| Turn {
                index: i,
                measurement: crate::agentic::tests::m(100 * i as u64, 100 * i as u64 + 50, 0, 16),
            })
            .collect();
        Results {
            agentic: Some(AgenticPanel { runs: vec![agent_phases(), agent_phases()] }),
            bursts: vec![BurstLevel { concurrency: 4, runs: vec![burst()] }],
            conversation: Some(ConversationRun {
                system_chars: 100,
                system_tokens: TokenCount::Estimated(25),
                turns,
                stopped: None,
            }),
            quality: Some(quality_report()),
            speculation: Some(crate::speculation::tests::panel()),
            gates: Some(Gates {
                early_stop: EarlyStop::of(&[16, 16]),
                memory_source: "/proc/PID/status VmRSS".into(),
                idle: Footprint { rss_bytes: Some(1000), kv_usage: None },
                under_load: Footprint { rss_bytes: Some(2000), kv_usage: Some(0.5) },
                foreign_cores_before: Some(0.0),
                foreign_cores_during: None,
            }),
        }
    }

    pub fn quality_report() -> QualityReport {
        use crate::quality::{CallCheck, CodeProbe, InstructProbe, Thinking, TurnCheck};
        let turn = |turn, problem: Option<&str>| TurnCheck {
            turn,
            expected: "edit_file",
            check: CallCheck {
                called: Some("edit_file".into()),
                problem: problem.map(str::to_string),
            },
            completion_tokens: 30,
        };
        QualityReport {
            code: vec![CodeProbe {
                thinking: Thinking::Off,
                turns: vec![
                    turn(0, None),
                    turn(1, Some("edit_file: edits: expected array, got object")),
                ],
            }],
            instruct: vec![InstructProbe {
                thinking: Thinking::OnPreserved,
                sections: 4,
                completion_tokens: 300,
                error: None,
            }],
        }
    }

    #[test]
    fn every_measurement_is_in_the_document() {
        let doc = document(&meta("agentic"), &full_results());
        assert_eq!(doc["schema_version"], 1);
        assert_eq!(doc["system_prompt"], json!({"chars": 7000, "tokens": 2150, "counted": true}));
        let runs = doc["agentic"]["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[1]["phases"][0]["phase"], "cold");
        assert_eq!(runs[1]["phases"][0]["ttft_ms"], 4000.0);
        assert_eq!(runs[1]["phases"][0]["read_tokens"], 700);
        assert_eq!(doc["agentic"]["summary"][2]["phase"], "prefix-test-1");
        assert_eq!(doc["agentic"]["prefix_cache_reuse"], "YES");
        assert_eq!(doc["agentic"]["prefix_ratio"]["median"], 0.11 / 4.0);
        assert_eq!(doc["agentic"]["cold_prefix_ratio"], Value::Null);

        let level = &doc["burst"]["levels"][0];
        assert_eq!(
            (level["concurrency"].clone(), level["serialised"].clone()),
            (json!(4), json!(false))
        );
        let calls = level["runs"][0]["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 4);
        assert_eq!(calls[3], json!({"ok": false, "status": 429, "error": "status 429: full"}));
        assert_eq!(calls[0]["latency_ms"], 800.0);
        assert_eq!(level["runs"][0]["stats"]["rate_limited"], 1);
        assert_eq!(level["summary"]["latency_p95_ms"]["median"], 1600.0);
        assert_eq!(doc["burst"]["growth"], Value::Null, "one level has no growth");

        let conversation = &doc["conversation"];
        assert_eq!(conversation["turns"].as_array().unwrap().len(), 9);
        assert_eq!(conversation["turns"][8]["turn"], 8);
        assert_eq!(conversation["totals"]["read_tokens"], 6300);
        assert_eq!(
            conversation["latency_growth_ms_per_1k_prompt_tokens"],
            Value::Null,
            "one prompt length"
        );

        assert_eq!(doc["speculation"]["workloads"][0]["spec_over_plain"], 2.0);

        let code = &doc["quality"]["code"][0];
        assert_eq!(code["chat_template_kwargs"], json!({"enable_thinking": false}));
        assert_eq!(
            (code["clean_percent"].clone(), code["edit_clean_percent"].clone()),
            (json!(50.0), json!(50.0))
        );
        assert_eq!(code["turns"][1]["problem"], "edit_file: edits: expected array, got object");
        assert_eq!(doc["quality"]["instruct"][0]["sections"], 4);

        assert_eq!(doc["gates"]["memory"]["peak_bytes"], 2000);
        assert_eq!(doc["gates"]["kv_cache_usage"]["peak"], 0.5);
        assert_eq!(doc["gates"]["early_stop"]["tripped"], false);
        assert_eq!(doc["gates"]["busy_machine_warning"], false);
    }

    #[test]
    fn unmeasurable_figures_are_null_and_the_file_parses() {
        let mut all_cached = agent_phases();
        all_cached[1].measurement.cached_tokens = 700;
        all_cached[1].measurement.completion_tokens = 1;
        let results = Results {
            agentic: Some(AgenticPanel { runs: vec![all_cached] }),
            ..Results::default()
        };
        let dir = std::env::temp_dir().join(format!("spindle-bench-json-{}", std::process::id()));
        let path = write(&dir, &meta("agentic"), &results).unwrap();
        assert_eq!(path, dir.join("agentic.json"));
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let warm = &doc["agentic"]["runs"][0]["phases"][1];
        assert_eq!(
            (warm["prefill_tokens_per_second"].clone(), warm["decode_tokens_per_second"].clone()),
            (Value::Null, Value::Null)
        );
        assert!(doc.get("burst").is_none() && doc.get("gates").is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
