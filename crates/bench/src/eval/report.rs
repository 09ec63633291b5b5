//! What `spindle eval` shows and writes: one terminal line per check (verdict, expected,
//! actual), a summary with server and model-dependent checks apart, a JSONL log (one line per
//! check) and a self-contained HTML report built with the bench's [`crate::html`] page.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::{count, passed, CheckResult, Dependence, Outcome};
use crate::html;
use crate::svg::escape;

/// The server and settings of an eval run, for the files' headers.
#[derive(Debug, Clone)]
pub struct EvalMeta {
    pub server: String,
    pub model: Option<String>,
    pub tier: String,
    pub started_unix: u64,
}

/// `PASS  sampling/stop  expected: … | actual: …`, tagged when model-dependent.
pub fn line(r: &CheckResult) -> String {
    let tag = match r.dependence {
        Dependence::Server => "",
        Dependence::Model => " [model-dependent]",
    };
    format!(
        "{}  {}/{}{tag}\n      expected: {}\n      actual:   {}",
        r.outcome, r.section, r.name, r.expected, r.actual
    )
}

/// The closing lines: server checks, model-dependent checks, and the verdict.
pub fn summary(results: &[CheckResult]) -> Vec<String> {
    let tally = |d: Dependence| {
        format!(
            "{} passed, {} failed, {} skipped",
            count(results, d, Outcome::Pass),
            count(results, d, Outcome::Fail),
            count(results, d, Outcome::Skip)
        )
    };
    let failed: Vec<String> = results
        .iter()
        .filter(|r| r.dependence == Dependence::Server && r.outcome == Outcome::Fail)
        .map(|r| format!("{}/{}", r.section, r.name))
        .collect();
    let verdict = if passed(results) {
        "eval: PASS".to_string()
    } else {
        format!("eval: FAIL ({})", failed.join(", "))
    };
    vec![
        format!("server checks: {}", tally(Dependence::Server)),
        format!("model-dependent checks (not counted): {}", tally(Dependence::Model)),
        verdict,
    ]
}

/// One JSON object per check.
pub fn jsonl(meta: &EvalMeta, results: &[CheckResult]) -> String {
    results
        .iter()
        .map(|r| {
            json!({
                "section": r.section,
                "check": r.name,
                "kind": r.dependence.to_string(),
                "outcome": r.outcome.to_string().to_lowercase(),
                "expected": r.expected,
                "actual": r.actual,
                "server": meta.server,
                "model": meta.model,
                "tier": meta.tier,
                "started_unix": meta.started_unix,
            })
            .to_string()
                + "\n"
        })
        .collect()
}

/// The HTML page: the summary, then server checks and model-dependent checks in tables.
pub fn render(meta: &EvalMeta, results: &[CheckResult]) -> String {
    let mut body = format!(
        "<p>server {} · model {} · tier {}</p>",
        escape(&meta.server),
        escape(meta.model.as_deref().unwrap_or("(unnamed)")),
        escape(&meta.tier)
    );
    let _ = write!(body, "<p class=\"verdict\">{}</p>", escape(&summary(results).join(" · ")));
    for (dependence, title) in
        [(Dependence::Server, "Server checks"), (Dependence::Model, "Model-dependent checks")]
    {
        let rows: Vec<&CheckResult> =
            results.iter().filter(|r| r.dependence == dependence).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = write!(
            body,
            "<h2>{title}</h2><table><tr><th>result</th><th>check</th><th>expected</th>\
             <th>actual</th></tr>"
        );
        for r in rows {
            let class = r.outcome.to_string().to_lowercase();
            let _ = write!(
                body,
                "<tr><td class=\"{class}\">{}</td><td>{}/{}</td><td>{}</td><td>{}</td></tr>",
                r.outcome,
                escape(r.section),
                escape(r.name),
                escape(&r.expected),
                escape(&r.actual)
            );
        }
        body += "</table>";
    }
    html::page(&format!("spindle eval ({})", meta.tier), &body)
}

/// Writes `dir/eval.jsonl` and `dir/eval.html`; returns their paths.
pub fn write(
    dir: &Path,
    meta: &EvalMeta,
    results: &[CheckResult],
) -> std::io::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let (log, page) = (dir.join("eval.jsonl"), dir.join("eval.html"));
    std::fs::write(&log, jsonl(meta, results))?;
    std::fs::write(&page, render(meta, results))?;
    Ok((log, page))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> Vec<CheckResult> {
        let r = |name, dependence, outcome| CheckResult {
            section: "protocol",
            name,
            dependence,
            outcome,
            expected: "400".into(),
            actual: "<500>".into(),
        };
        vec![
            r("bad-body-400", Dependence::Server, Outcome::Fail),
            r("cors-preflight", Dependence::Server, Outcome::Pass),
            r("nonce-echo", Dependence::Model, Outcome::Fail),
        ]
    }

    fn meta() -> EvalMeta {
        EvalMeta { server: "http://h:1".into(), model: None, tier: "smoke".into(), started_unix: 5 }
    }

    #[test]
    fn summary_keeps_model_dependent_checks_apart() {
        assert_eq!(
            summary(&results()),
            [
                "server checks: 1 passed, 1 failed, 0 skipped",
                "model-dependent checks (not counted): 0 passed, 1 failed, 0 skipped",
                "eval: FAIL (protocol/bad-body-400)",
            ]
        );
        assert!(line(&results()[2]).starts_with("FAIL  protocol/nonce-echo [model-dependent]"));
    }

    #[test]
    fn one_json_line_per_check() {
        let text = jsonl(&meta(), &results());
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["outcome"], "fail");
        assert_eq!(lines[2]["kind"], "model-dependent");
        assert_eq!(lines[1]["check"], "cors-preflight");
    }

    #[test]
    fn the_page_is_escaped_and_self_contained() {
        let page = render(&meta(), &results());
        assert!(page.contains("&lt;500&gt;") && !page.contains("<500>"));
        assert!(page.contains("Model-dependent checks") && page.ends_with("</html>\n"));
        assert!(!page.contains("<script") && !page.contains("http://h:1\""));
        assert_eq!(page.matches("<tr>").count(), 2 + 3);
    }
}
