//! Small inline SVG charts for the HTML report: bars with a range whisker, lines over x, and
//! strips of points per row. Plain SVG text, no script and no external reference, so a report
//! opens offline.

use std::fmt::Write;

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 280.0;
/// Margin for the y axis labels.
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
/// Margin for the title.
const TOP: f64 = 28.0;
/// Margin for the category or x axis labels.
const BOTTOM: f64 = 44.0;
const COLORS: [&str; 4] = ["#3367d6", "#e8710a", "#1e8e3e", "#d93025"];

/// Escapes text for HTML and SVG.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One bar: its label, height and the range its whisker spans.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub min: f64,
    pub max: f64,
}

/// A named series of `(x, y)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// The opening of a chart: the `<svg>` element named `id`, its title and a y axis to `y_max`.
fn open(id: &str, title: &str, y_label: &str, y_max: f64) -> String {
    let mut svg = format!(
        "<svg class=\"chart\" data-series=\"{}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\">\
         <title>{}</title><text x=\"{LEFT}\" y=\"18\" font-weight=\"bold\">{}</text>",
        escape(id),
        escape(title),
        escape(title)
    );
    for k in 0..=4 {
        let value = y_max * f64::from(k) / 4.0;
        let y = y_of(value, y_max);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            short(value)
        );
    }
    let _ = write!(
        svg,
        "<text x=\"12\" y=\"{:.1}\" font-size=\"11\" transform=\"rotate(-90 12 {:.1})\" \
         text-anchor=\"middle\">{}</text>",
        (TOP + HEIGHT - BOTTOM) / 2.0,
        (TOP + HEIGHT - BOTTOM) / 2.0,
        escape(y_label)
    );
    svg
}

fn y_of(value: f64, y_max: f64) -> f64 {
    HEIGHT - BOTTOM - (value / y_max).clamp(0.0, 1.0) * (HEIGHT - BOTTOM - TOP)
}

/// `1234` as `1234`, `0.25` as `0.25`, `12345678` as `12.3M`.
fn short(value: f64) -> String {
    match value.abs() {
        v if v >= 1e6 => format!("{:.1}M", value / 1e6),
        v if v >= 1e4 => format!("{:.0}k", value / 1e3),
        v if v >= 10.0 || v.fract() == 0.0 => format!("{value:.0}"),
        _ => format!("{value:.2}"),
    }
}

/// A y range that holds `values`: the next 1, 2, 4, 5 or 8 × 10^k above the largest, so the
/// four grid steps are round numbers.
fn y_max(values: impl Iterator<Item = f64>) -> f64 {
    let top = values.filter(|v| v.is_finite()).fold(0.0, f64::max).max(1e-9);
    let scale = 10f64.powf(top.log10().floor());
    let step = [1.0, 2.0, 4.0, 5.0, 8.0, 10.0].into_iter().find(|s| s * scale >= top);
    step.unwrap_or(10.0) * scale
}

/// Bars with whiskers from `min` to `max`.
pub fn bar_chart(id: &str, title: &str, y_label: &str, bars: &[Bar]) -> String {
    let top = y_max(bars.iter().flat_map(|b| [b.value, b.max]));
    let mut svg = open(id, title, y_label, top);
    let slot = (WIDTH - LEFT - RIGHT) / bars.len().max(1) as f64;
    for (i, bar) in bars.iter().enumerate() {
        let x = LEFT + slot * i as f64;
        let (y, base) = (y_of(bar.value, top), y_of(0.0, top));
        let mid = x + slot / 2.0;
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\">\
             <title>{}: {}</title></rect>\
             <line x1=\"{mid:.1}\" x2=\"{mid:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>\
             <text x=\"{mid:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
            x + slot * 0.15,
            slot * 0.7,
            base - y,
            COLORS[0],
            escape(&bar.label),
            short(bar.value),
            y_of(bar.min, top),
            y_of(bar.max, top),
            HEIGHT - BOTTOM + 16.0,
            escape(&bar.label)
        );
    }
    svg + "</svg>"
}

/// Lines over a numeric x axis, one per series, with a legend.
pub fn line_chart(
    id: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> String {
    let points = || series.iter().flat_map(|s| s.points.iter().copied());
    let top = y_max(points().map(|p| p.1));
    let (x_min, x_max) =
        points().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let span = if x_max > x_min { x_max - x_min } else { 1.0 };
    let x_of = |x: f64| LEFT + (x - x_min.min(x_max)) / span * (WIDTH - LEFT - RIGHT);
    let mut svg = open(id, title, y_label, top);
    for (k, s) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", x_of(x), y_of(y, top)))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for xy in &path {
            let (x, y) = xy.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(svg, "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{color}\"/>");
        }
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"{color}\">{}</text>",
            WIDTH - RIGHT - 130.0 * (series.len() - k) as f64,
            HEIGHT - 8.0,
            escape(&s.name)
        );
    }
    // Every x of a short series (burst levels), else the ends.
    let mut ticks: Vec<f64> = points().map(|p| p.0).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    if ticks.len() > 8 {
        ticks = vec![x_min, x_max];
    }
    for x in ticks.into_iter().filter(|x| x.is_finite()) {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
            x_of(x),
            HEIGHT - BOTTOM + 16.0,
            short(x)
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
        LEFT + 100.0,
        HEIGHT - 8.0,
        escape(x_label)
    );
    svg + "</svg>"
}

/// One column of points per category (a distribution), with its median marked.
pub fn strip_chart(id: &str, title: &str, y_label: &str, columns: &[(String, Vec<f64>)]) -> String {
    let top = y_max(columns.iter().flat_map(|c| c.1.iter().copied()));
    let mut svg = open(id, title, y_label, top);
    let slot = (WIDTH - LEFT - RIGHT) / columns.len().max(1) as f64;
    for (i, (label, values)) in columns.iter().enumerate() {
        let mid = LEFT + slot * (i as f64 + 0.5);
        for (k, v) in values.iter().filter(|v| v.is_finite()).enumerate() {
            // Spread the points sideways so equal values stay visible.
            let dx = ((k % 7) as f64 - 3.0) * slot * 0.06;
            let _ = write!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{}\" fill-opacity=\"0.6\"/>",
                mid + dx,
                y_of(*v, top),
                COLORS[1]
            );
        }
        if let Some(median) = crate::stats::Spread::of(values).map(|s| s.median) {
            let y = y_of(median, top);
            let _ = write!(
                svg,
                "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#333\" \
                 stroke-width=\"2\"><title>median {}</title></line>",
                mid - slot * 0.3,
                mid + slot * 0.3,
                short(median)
            );
        }
        let _ = write!(
            svg,
            "<text x=\"{mid:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
            HEIGHT - BOTTOM + 16.0,
            escape(label)
        );
    }
    svg + "</svg>"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(label: &str, value: f64) -> Bar {
        Bar { label: label.into(), value, min: value * 0.5, max: value * 1.5 }
    }

    #[test]
    fn bars_are_scaled_to_the_tallest_whisker() {
        let svg =
            bar_chart("ttft", "TTFT <per> phase", "ms", &[bar("cold", 100.0), bar("warm", 10.0)]);
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>"));
        assert!(svg.contains("data-series=\"ttft\""));
        assert!(svg.contains("TTFT &lt;per&gt; phase"), "titles are escaped");
        assert_eq!(svg.matches("<rect").count(), 2);
        // The cold bar's whisker top (150) sits at 150 / 200 of the plot height.
        let top = y_of(150.0, 200.0);
        assert!(svg.contains(&format!("y2=\"{top:.1}\"")), "{svg}");
    }

    #[test]
    fn lines_and_strips_draw_every_finite_point() {
        let series = [
            Series {
                name: "latency".into(),
                points: vec![(1.0, 2.0), (2.0, f64::NAN), (3.0, 4.0)],
            },
            Series { name: "ttft".into(), points: vec![(1.0, 1.0)] },
        ];
        let svg = line_chart("cost", "Cost", "prompt tokens", "ms", &series);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 3);
        let strip = strip_chart("lat", "Latency", "ms", &[("8".into(), vec![1.0, 2.0, 3.0])]);
        assert_eq!(strip.matches("<circle").count(), 3);
        assert!(strip.contains("<title>median 2</title>"), "{strip}");
    }

    #[test]
    fn round_y_ranges() {
        assert_eq!(y_max([0.9, 0.3].into_iter()), 1.0);
        assert_eq!(y_max([2181.0].into_iter()), 4000.0);
        assert_eq!(y_max([4500.0].into_iter()), 5000.0);
        assert_eq!(y_max([12.9].into_iter()), 20.0);
        assert_eq!(y_max([100.0].into_iter()), 100.0);
    }

    #[test]
    fn short_numbers() {
        assert_eq!(
            [0.0, 0.25, 2.0, 12.4, 1234.0, 45678.0, 2.5e6].map(short),
            ["0", "0.25", "2", "12", "1234", "46k", "2.5M"]
        );
    }
}
