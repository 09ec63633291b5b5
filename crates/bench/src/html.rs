//! The HTML report of a run: one self-contained page (inline CSS, charts as inline SVG, no
//! script, no external reference) with the terminal's tables and one chart per measured series:
//! TTFT per phase, latency distribution per burst level, throughput vs concurrency, and per-turn
//! cost vs depth.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::agentic::AgenticPanel;
use crate::burst::BurstLevel;
use crate::conversation::ConversationRun;
use crate::quality::{percent, QualityReport, Thinking, SECTIONS};
use crate::report;
use crate::results::{Meta, Results};
use crate::svg::{bar_chart, escape, line_chart, strip_chart, Bar, Series};

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}\
    pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:12px}\
    table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:.3em .5em;\
    text-align:left;vertical-align:top}.pass{color:#1e8e3e}.fail{color:#d93025;font-weight:bold}\
    .skip{color:#777}\
    .chart{display:block;margin:1em 0}.verdict{font-size:1.2em;font-weight:bold}";

/// A self-contained page titled `title` (plain text) around `body` (HTML), ending the document.
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title}</title><style>{STYLE}</style></head><body><h1>{title}</h1>{body}\
         </body></html>\n",
        title = escape(title),
    )
}

/// The whole page.
pub fn render(meta: &Meta, results: &Results) -> String {
    let mut body = format!(
        "<p>server {} · model {} · seed {} · max_tokens {} · system prompt {} chars, {} tokens</p>",
        escape(&meta.server),
        escape(meta.model.as_deref().unwrap_or("(unnamed)")),
        meta.seed,
        meta.max_tokens,
        meta.system_chars,
        meta.system_tokens.value(),
    );
    if let Some(panel) = &results.agentic {
        body += &agentic(panel);
    }
    if !results.bursts.is_empty() {
        body += &bursts(&results.bursts, meta.system_tokens.value());
    }
    if let Some(run) = &results.conversation {
        body += &conversation(run);
    }
    if let Some(report) = &results.quality {
        body += &quality(report);
    }
    if let Some(panel) = &results.speculation {
        body += "<h2>Speculative decoding</h2>";
        body += &pre(&crate::speculation::report::table(panel));
    }
    if let Some(gates) = &results.gates {
        body += "<h2>Quality gates and footprint</h2>";
        body += &pre(&report::gate_lines(gates));
    }
    page(&format!("spindle bench {}", meta.panel), &body)
}

/// Writes `dir/<panel>.html`; returns its path.
pub fn write(dir: &Path, meta: &Meta, results: &Results) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.html", meta.panel));
    std::fs::write(&path, render(meta, results))?;
    Ok(path)
}

/// `lines` as a preformatted block.
pub fn pre(lines: &[String]) -> String {
    format!("<pre>{}</pre>", escape(&lines.join("\n")))
}

fn agentic(panel: &AgenticPanel) -> String {
    let mut out = String::from("<h2>Agentic phases</h2>");
    if let Some(line) = report::verdict_lines(panel).first() {
        let _ = write!(out, "<p class=\"verdict\">{}</p>", escape(line));
    }
    out += &pre(&report::agentic_table(panel));
    let bars: Vec<Bar> = panel
        .kinds()
        .into_iter()
        .filter_map(|k| panel.summary(k))
        .map(|s| Bar {
            label: s.kind.to_string(),
            value: s.ttft_ms.median,
            min: s.ttft_ms.min,
            max: s.ttft_ms.max,
        })
        .collect();
    out + &bar_chart("ttft-per-phase", "Time to first token per phase", "ms", &bars)
}

fn bursts(levels: &[BurstLevel], system_tokens: usize) -> String {
    let mut out = String::from("<h2>Bursts</h2>");
    out += &pre(&report::burst_table(levels, system_tokens));
    let columns: Vec<(String, Vec<f64>)> = levels
        .iter()
        .map(|l| {
            let latencies =
                l.runs.iter().flat_map(|r| r.succeeded()).map(|m| m.latency.as_secs_f64() * 1000.0);
            (format!("N={}", l.concurrency), latencies.collect())
        })
        .collect();
    out += &strip_chart("burst-latency", "Latency distribution per burst level", "ms", &columns);
    let series = |name: &str, figure: fn(&crate::burst::BurstStats) -> f64| Series {
        name: name.to_string(),
        points: levels
            .iter()
            .filter_map(|l| Some((l.concurrency as f64, l.spread(system_tokens, figure)?.median)))
            .collect(),
    };
    let throughput = [
        series("aggregate tok/s", |s| s.aggregate_tokens_per_second),
        series("per-request tok/s", |s| s.per_request_tokens_per_second),
    ];
    out + &line_chart(
        "throughput-vs-concurrency",
        "Throughput vs concurrency",
        "concurrent calls",
        "tokens/s",
        &throughput,
    )
}

fn conversation(run: &ConversationRun) -> String {
    let mut out = String::from("<h2>Growing conversation</h2>");
    out += &pre(&report::conversation_summary(run));
    let series = |name: &str, f: fn(&crate::sse::Measurement) -> f64| Series {
        name: name.to_string(),
        points: run
            .turns
            .iter()
            .map(|t| (f64::from(t.measurement.prompt_tokens), f(&t.measurement)))
            .collect(),
    };
    let cost = [
        series("latency ms", |m| m.latency.as_secs_f64() * 1000.0),
        series("ttft ms", |m| m.ttft.as_secs_f64() * 1000.0),
    ];
    out += &line_chart("cost-vs-depth", "Per-turn cost vs depth", "prompt tokens", "ms", &cost);
    let turns: Vec<String> = run.turns.iter().map(report::turn_line).collect();
    out + "<details><summary>Every turn</summary>" + &pre(&turns) + "</details>"
}

fn quality(report: &QualityReport) -> String {
    let mut out = String::from("<h2>Agent quality probes</h2>");
    out += &pre(&report::quality_lines(report));
    let bar = |label: String, value: f64| Bar { label, value, min: value, max: value };
    if !report.code.is_empty() {
        let bars: Vec<Bar> = report
            .code
            .iter()
            .enumerate()
            .map(|(i, p)| {
                bar(format!("{} #{}", short_thinking(p.thinking), i + 1), percent(p.clean()))
            })
            .collect();
        out += &bar_chart("tool-call-clean", "Clean tool calls per run", "% of turns", &bars);
    }
    if !report.instruct.is_empty() {
        let bars: Vec<Bar> = report
            .instruct
            .iter()
            .enumerate()
            .map(|(i, p)| {
                bar(
                    format!("{} #{}", short_thinking(p.thinking), i + 1),
                    percent((p.sections, SECTIONS.len())),
                )
            })
            .collect();
        out += &bar_chart("instruct-sections", "Brief sections delivered per run", "%", &bars);
    }
    out
}

/// A label short enough for a bar.
fn short_thinking(thinking: Thinking) -> &'static str {
    match thinking {
        Thinking::Default => "default",
        Thinking::Off => "think off",
        Thinking::OnPreserved => "on+preserve",
        Thinking::OnDropped => "on, dropped",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::tests::{full_results, meta};

    /// `src=` and `href=` values that reach out of the page.
    fn external_references(page: &str) -> Vec<String> {
        let mut found = Vec::new();
        for attribute in ["src=", "href="] {
            for (i, _) in page.match_indices(attribute) {
                let value = page[i + attribute.len()..].trim_start_matches(['"', '\'']);
                if value.starts_with("http:")
                    || value.starts_with("https:")
                    || value.starts_with("//")
                {
                    found.push(value.chars().take(40).collect());
                }
            }
        }
        found
    }

    fn series_ids(page: &str) -> Vec<&str> {
        page.match_indices("data-series=\"")
            .map(|(i, m)| {
                let rest = &page[i + m.len()..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect()
    }

    #[test]
    fn a_full_report_is_self_contained_with_one_chart_per_series() {
        let page = render(&meta("agentic"), &full_results());
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
        assert!(external_references(&page).is_empty(), "{:?}", external_references(&page));
        assert!(!page.contains("<script") && !page.contains("<link"));
        assert_eq!(
            series_ids(&page),
            [
                "ttft-per-phase",
                "burst-latency",
                "throughput-vs-concurrency",
                "cost-vs-depth",
                "tool-call-clean",
                "instruct-sections"
            ]
        );
        assert_eq!(page.matches("<svg").count(), 6);
        assert!(page.contains("prefix cache reuse: YES"));
        assert!(page.contains("Quality gates"));
    }

    #[test]
    fn a_report_charts_only_what_was_measured() {
        let full = full_results();
        let bursts_only = Results { bursts: full.bursts.clone(), ..Results::default() };
        let page = render(&meta("burst"), &bursts_only);
        assert_eq!(series_ids(&page), ["burst-latency", "throughput-vs-concurrency"]);
        let conversation = Results { conversation: full.conversation, ..Results::default() };
        assert_eq!(series_ids(&render(&meta("conversation"), &conversation)), ["cost-vs-depth"]);
    }

    #[test]
    fn the_checker_catches_external_references() {
        let bad =
            "<img src=\"https://cdn.example/x.png\"><a href='http://x'>x</a><a href=\"#top\">";
        assert_eq!(external_references(bad).len(), 2);
    }

    #[test]
    fn text_is_escaped() {
        let mut m = meta("agentic");
        m.server = "http://h/<script>".into();
        let page = render(&m, &Results::default());
        assert!(page.contains("http://h/&lt;script&gt;") && !page.contains("<script>"));
        let dir = std::env::temp_dir().join(format!("spindle-bench-html-{}", std::process::id()));
        let path = write(&dir, &m, &Results::default()).unwrap();
        assert_eq!(path, dir.join("agentic.html"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
