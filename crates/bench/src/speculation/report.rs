//! The speculation panel's terminal table and its part of the JSON report.

use serde_json::{json, Value};

use super::{Mode, SpecRow, SpeculationPanel};
use crate::stats::Spread;

/// One line per workload and mode, then per workload the speed-up and whether the answers
/// agreed.
pub fn table(panel: &SpeculationPanel) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<10} {:<7} {:>24} {:>16} {:>9} {:>9} {:>10} {:>9} {:>8}",
        "workload",
        "mode",
        "decode tok/s",
        "tokens",
        "drafted",
        "accepted",
        "acceptance",
        "fidelity",
        "repeats"
    )];
    for kind in panel.kinds() {
        for row in panel.rows.iter().filter(|r| r.kind == kind) {
            lines.push(row_line(row));
        }
        let speedup = panel.speedup(kind).map(|s| format!("spec/plain {s:.2}×"));
        let agree = panel.outputs_agree(kind).map(|same| {
            if same {
                "answers identical across modes and rounds".to_string()
            } else {
                "ANSWERS DIFFER between calls of the same version".to_string()
            }
        });
        let notes: Vec<String> = speedup.into_iter().chain(agree).collect();
        if !notes.is_empty() {
            lines.push(format!("{:<10} {}", kind.name(), notes.join("; ")));
        }
    }
    lines
}

fn row_line(row: &SpecRow) -> String {
    let show = |s: Option<Spread>, d: usize| s.map_or_else(|| "-".to_string(), |s| s.display(d));
    let acceptance = row.acceptance();
    let count = |f: fn(&super::Acceptance) -> u64| {
        acceptance.as_ref().map_or("-".into(), |a| f(a).to_string())
    };
    let rate =
        acceptance.and_then(|a| a.rate()).map_or("-".into(), |r| format!("{:.1}%", r * 100.0));
    let percent = |s: Option<Spread>| s.map_or("-".into(), |f| format!("{:.0}%", f.median * 100.0));
    format!(
        "{:<10} {:<7} {:>24} {:>16} {:>9} {:>9} {:>10} {:>9} {:>8}",
        row.kind.name(),
        row.mode.name(),
        show(row.decode(), 1),
        show(row.completion_tokens(), 0),
        count(|a| a.drafted),
        count(|a| a.accepted),
        rate,
        percent(row.fidelity()),
        percent(row.self_repeat()),
    )
}

fn spread(s: Option<Spread>) -> Value {
    s.map_or(Value::Null, |s| json!({"median": s.median, "min": s.min, "max": s.max}))
}

/// NaN (no speed) as `null`.
fn number(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// `{"seed", "rows": [...], "workloads": [...]}`: every call of every row, the rows' summaries,
/// and per workload the speed-up and agreement.
pub fn json(panel: &SpeculationPanel) -> Value {
    let rows: Vec<Value> = panel.rows.iter().map(row_json).collect();
    let workloads: Vec<Value> = panel
        .kinds()
        .into_iter()
        .map(|k| {
            json!({"workload": k.name(), "spec_over_plain": panel.speedup(k).map_or(Value::Null, number),
                "outputs_agree": panel.outputs_agree(k)})
        })
        .collect();
    json!({"seed": super::SEED, "temperature": 0,
        "prose_temperature": super::workloads::PROSE_TEMPERATURE, "rows": rows, "workloads": workloads})
}

fn row_json(row: &SpecRow) -> Value {
    let acceptance = row.acceptance();
    let calls: Vec<Value> = row
        .calls
        .iter()
        .map(|c| {
            let (figures, source) = match c.acceptance {
                Some((a, s)) => (Some(a), Some(s.name())),
                None => (None, None),
            };
            json!({
                "round": c.round,
                "variant": c.variant,
                "decode_tokens_per_second": number(c.decode_tokens_per_second),
                "decode_seconds": c.decode_seconds,
                "completion_tokens": c.completion_tokens,
                "drafts": figures.and_then(|a| a.rounds),
                "drafted": figures.map(|a| a.drafted),
                "accepted": figures.map(|a| a.accepted),
                "acceptance_source": source,
                "fidelity": c.fidelity,
                "self_repeat": c.self_repeat,
                "reply": c.reply,
            })
        })
        .collect();
    json!({
        "workload": row.kind.name(),
        "mode": row.mode.name(),
        "speculative_field": match row.mode { Mode::On => json!(true), Mode::Off => json!(false), Mode::Server => Value::Null },
        "decode_tokens_per_second": spread(row.decode()),
        "completion_tokens": spread(row.completion_tokens()),
        "drafted": acceptance.map(|a| a.drafted),
        "accepted": acceptance.map(|a| a.accepted),
        "acceptance_rate": acceptance.and_then(|a| a.rate()),
        "fidelity": spread(row.fidelity()),
        "self_repeat": spread(row.self_repeat()),
        "calls": calls,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::panel;
    use super::*;

    #[test]
    fn table_rows_and_the_speedup_line() {
        let lines = table(&panel());
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(lines[1].starts_with("code-edit  spec"), "{}", lines[1]);
        assert!(
            lines[1].contains("50.0 [40.0–60.0]")
                && lines[1].contains("81.")
                && lines[1].ends_with("25%"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].contains("plain") && lines[2].contains("25.0 [20.0–30.0]"),
            "{}",
            lines[2]
        );
        assert!(
            lines[3].contains("spec/plain 2.00×") && lines[3].contains("identical"),
            "{}",
            lines[3]
        );
    }

    #[test]
    fn json_rows_carry_summaries_and_calls() {
        let doc = json(&panel());
        let row = &doc["rows"][0];
        assert_eq!(
            (row["workload"].as_str(), row["mode"].as_str()),
            (Some("code-edit"), Some("spec"))
        );
        assert_eq!(
            row["decode_tokens_per_second"],
            json!({"median": 50.0, "min": 40.0, "max": 60.0})
        );
        assert_eq!((row["drafted"].as_u64(), row["accepted"].as_u64()), (Some(160), Some(130)));
        assert_eq!(row["calls"].as_array().unwrap().len(), 3);
        assert_eq!(row["calls"][0]["acceptance_source"], "metrics");
        assert_eq!(row["self_repeat"]["median"], 0.25);
        assert_eq!(doc["rows"][1]["speculative_field"], false);
        assert_eq!(doc["workloads"][0]["spec_over_plain"], 2.0);
        assert_eq!(doc["workloads"][0]["outputs_agree"], true);
    }
}
