//! Hand-written SVG charts. One run: time to Ready (p50, p95, max) and coderd requests per CR
//! of the scale phase, each against N, on an ordinal axis (1, 100, 500, 1000 equally spaced) so
//! the small sizes stay readable. Side by side: every figure as a pair of bars with the ratio.
use std::fmt::Write as _;

use super::compare::{Comparison, ratio_header};
use super::model::ScaleResult;

const PANEL_WIDTH: f64 = 440.0;
const PANEL_HEIGHT: f64 = 300.0;
const MARGIN_LEFT: f64 = 60.0;
const MARGIN_RIGHT: f64 = 20.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 50.0;
/// Drawn as a dashed line on the requests panel.
const REQUESTS_TARGET: f64 = 2.5;

/// One line of a panel: a name, a colour and a value per size (`None` = not measured).
struct Series<'a> {
    name: &'a str,
    colour: &'a str,
    values: Vec<Option<f64>>,
}

pub fn render_chart(scale: &[ScaleResult]) -> String {
    let sizes: Vec<String> = scale.iter().map(|s| s.size.to_string()).collect();
    let secs = |ms: Option<u64>| ms.map(|ms| ms as f64 / 1000.0);
    let latency = [
        Series {
            name: "p50",
            colour: "#1f77b4",
            values: scale.iter().map(|s| secs(s.latency.p50_ms)).collect(),
        },
        Series {
            name: "p95",
            colour: "#ff7f0e",
            values: scale.iter().map(|s| secs(s.latency.p95_ms)).collect(),
        },
        Series {
            name: "max",
            colour: "#d62728",
            values: scale.iter().map(|s| secs(s.latency.max_ms)).collect(),
        },
    ];
    let requests = [Series {
        name: "coderd requests per CR",
        colour: "#2ca02c",
        values: scale.iter().map(|s| s.coderd.per_cr).collect(),
    }];
    let width = 2.0 * PANEL_WIDTH;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_HEIGHT}" viewBox="0 0 {width} {PANEL_HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{width}" height="{PANEL_HEIGHT}" fill="white"/>"#
    );
    svg += &panel(0.0, "Time from create to Ready (s)", &sizes, &latency, None);
    svg += &panel(
        PANEL_WIDTH,
        "coderd requests per CR (create)",
        &sizes,
        &requests,
        Some(REQUESTS_TARGET),
    );
    svg += "</svg>\n";
    svg
}

fn panel(
    x0: f64,
    title: &str,
    sizes: &[String],
    series: &[Series<'_>],
    target: Option<f64>,
) -> String {
    let plot_w = PANEL_WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = PANEL_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let left = x0 + MARGIN_LEFT;
    let bottom = MARGIN_TOP + plot_h;
    let highest = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .copied()
        .chain(target)
        .fold(0.0_f64, f64::max);
    let top_value = nice_ceiling(highest);
    let x_at = |i: usize| match sizes.len() {
        0 | 1 => left + plot_w / 2.0,
        n => left + plot_w * i as f64 / (n - 1) as f64,
    };
    let y_at = |v: f64| bottom - plot_h * v / top_value;
    let mut out = String::new();
    let _ = writeln!(out, r#"<g>"#);
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="20" text-anchor="middle" font-weight="bold">{}</text>"#,
        x0 + PANEL_WIDTH / 2.0,
        escape(title)
    );
    // Axes, horizontal grid with labels, size labels.
    let _ = writeln!(
        out,
        r##"<path d="M{left:.1},{MARGIN_TOP:.1} V{bottom:.1} H{:.1}" fill="none" stroke="#333"/>"##,
        left + plot_w
    );
    for step in 0..=4 {
        let value = top_value * f64::from(step) / 4.0;
        let y = y_at(value);
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + plot_w,
            left - 6.0,
            y + 4.0,
            tick_label(value)
        );
    }
    for (i, size) in sizes.iter().enumerate() {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x_at(i),
            bottom + 18.0,
            escape(size)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">N (CoderProvisioners)</text>"#,
        left + plot_w / 2.0,
        bottom + 36.0
    );
    if let Some(target) = target {
        let y = y_at(target);
        let _ = writeln!(
            out,
            r##"<line x1="{left:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#888" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">target {}</text>"##,
            left + plot_w,
            left + plot_w,
            y - 4.0,
            tick_label(target)
        );
    }
    for (index, s) in series.iter().enumerate() {
        let points: Vec<String> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", x_at(i), y_at(v))))
            .collect();
        if points.len() > 1 {
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
                points.join(" "),
                s.colour
            );
        }
        for point in &points {
            let (x, y) = point.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                out,
                r#"<circle cx="{x}" cy="{y}" r="3" fill="{}"/>"#,
                s.colour
            );
        }
        let legend_y = MARGIN_TOP + 4.0 + 16.0 * index as f64;
        let legend_x = left + 10.0;
        let _ = writeln!(
            out,
            r#"<rect x="{legend_x:.1}" y="{:.1}" width="12" height="3" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            legend_y - 4.0,
            s.colour,
            legend_x + 16.0,
            legend_y,
            escape(s.name)
        );
    }
    out += "</g>\n";
    out
}

/// Colours of the implementations' bars, in command-line order.
const IMPLEMENTATION_COLOURS: [&str; 2] = ["#1f77b4", "#ff7f0e"];
const ROW_HEIGHT: f64 = 26.0;
/// Generous average advance of an 11 px sans-serif character, to size the label column.
const LABEL_CHAR_WIDTH: f64 = 6.5;
const BAR_WIDTH: f64 = 360.0;
const RATIO_WIDTH: f64 = 90.0;
const HEADER_HEIGHT: f64 = 56.0;

/// One row per figure: a bar per implementation (scaled to the larger of the row), its value
/// and unit, and the ratio of the second to the first.
pub fn render_comparison(comparison: &Comparison) -> String {
    let names = comparison.names();
    let labels: Vec<String> = comparison
        .figures
        .iter()
        .map(|f| format!("{} ({})", f.figure, f.unit.label()))
        .collect();
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let label_width = 20.0 + LABEL_CHAR_WIDTH * longest as f64;
    let width = label_width + BAR_WIDTH + RATIO_WIDTH;
    let height = HEADER_HEIGHT + ROW_HEIGHT * comparison.figures.len() as f64 + 10.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{width}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="10" y="20" font-weight="bold" font-size="13">Side by side: {}</text>"#,
        escape(&names.join(" vs "))
    );
    for (index, name) in names.iter().enumerate() {
        let x = label_width + 160.0 * index as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{x:.1}" y="32" width="12" height="10" fill="{}"/><text x="{:.1}" y="41">{}</text>"#,
            IMPLEMENTATION_COLOURS[index % IMPLEMENTATION_COLOURS.len()],
            x + 16.0,
            escape(name)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="41" text-anchor="end" font-weight="bold">{}</text>"#,
        width - 10.0,
        escape(&ratio_header(&names))
    );
    for (row, (figure, label)) in comparison.figures.iter().zip(&labels).enumerate() {
        let top = HEADER_HEIGHT + ROW_HEIGHT * row as f64;
        if row % 2 == 0 {
            let _ = writeln!(
                svg,
                r##"<rect x="0" y="{top:.1}" width="{width}" height="{ROW_HEIGHT}" fill="#f4f4f4"/>"##
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{:.1}">{}</text>"#,
            top + 17.0,
            escape(label)
        );
        let largest = figure
            .values
            .iter()
            .flatten()
            .copied()
            .fold(0.0_f64, f64::max);
        let bar_height = (ROW_HEIGHT - 6.0) / figure.values.len().max(1) as f64;
        for (index, value) in figure.values.iter().enumerate() {
            let y = top + 3.0 + bar_height * index as f64;
            let length = match value {
                Some(v) if largest > 0.0 => (BAR_WIDTH - 70.0) * v / largest,
                _ => 0.0,
            };
            let _ = writeln!(
                svg,
                r#"<rect x="{label_width:.1}" y="{y:.1}" width="{length:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="9">{}</text>"#,
                bar_height - 1.0,
                IMPLEMENTATION_COLOURS[index % IMPLEMENTATION_COLOURS.len()],
                label_width + length + 4.0,
                y + bar_height - 2.0,
                value.map_or_else(|| "—".to_owned(), |v| figure.unit.format(v))
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            width - 10.0,
            top + 17.0,
            figure
                .ratio
                .map_or_else(|| "—".to_owned(), |r| format!("×{r:.2}"))
        );
    }
    svg += "</svg>\n";
    svg
}

/// The smallest of 1, 2, 2.5, 5 × 10^k at or above `value` (1 for nothing to show).
pub fn nice_ceiling(value: f64) -> f64 {
    if value.is_nan() || value <= 0.0 || !value.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|candidate| *candidate >= value * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

fn tick_label(value: f64) -> String {
    if value.fract().abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}").trim_end_matches('0').to_owned()
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::bench::model::tests::sample_scale;

    #[rstest]
    #[case(0.0, 1.0)]
    #[case(f64::NAN, 1.0)]
    #[case(0.7, 1.0)]
    #[case(1.0, 1.0)]
    #[case(1.2, 2.0)]
    #[case(2.3, 2.5)]
    #[case(3.9, 5.0)]
    #[case(61.0, 100.0)]
    #[case(0.03, 0.05)]
    fn ceilings_are_round_numbers(#[case] value: f64, #[case] expected: f64) {
        assert!(
            (nice_ceiling(value) - expected).abs() < 1e-9,
            "{value} → {}",
            nice_ceiling(value)
        );
    }

    #[test]
    fn the_chart_plots_each_series_over_every_size() {
        let scale = [
            sample_scale(1, 3.0, Some(900), 1),
            sample_scale(100, 2.0, Some(5_000), 1),
            sample_scale(1000, 2.0, Some(50_000), 1),
        ];
        let svg = render_chart(&scale);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<polyline").count(),
            4,
            "p50, p95, max and requests per CR"
        );
        assert_eq!(svg.matches("<circle").count(), 12);
        assert!(svg.contains(">1000</text>") && svg.contains("target 2.5"));
        assert_eq!(svg.matches("<g>").count(), svg.matches("</g>").count());
    }

    #[test]
    fn a_single_size_is_drawn_as_points_and_missing_values_are_skipped() {
        let mut one = sample_scale(1, 3.0, Some(900), 1);
        one.latency.max_ms = None;
        let svg = render_chart(&[one]);
        assert_eq!(svg.matches("<polyline").count(), 0);
        assert_eq!(
            svg.matches("<circle").count(),
            3,
            "p50, p95 and requests; no max"
        );
    }

    #[test]
    fn the_side_by_side_chart_has_a_bar_per_implementation_and_figure_and_the_ratios() {
        use crate::bench::compare::compare;
        use crate::bench::model::tests::sample_report;
        let reference = sample_report();
        let mut naive = sample_report();
        naive.environment.implementation = "naive <v2>".to_owned();
        naive.scale[0].coderd.per_cr = Some(6.0);
        let comparison = compare(vec![reference, naive]);
        let svg = render_comparison(&comparison);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        let figures = comparison.figures.len();
        // Two legend boxes, the stripes of every other row, and two bars per figure.
        assert_eq!(
            svg.matches("<rect").count(),
            1 + 2 + figures.div_ceil(2) + 2 * figures
        );
        assert!(svg.contains("scale N=1: coderd requests (per CR)"));
        assert!(svg.contains(">×2.00</text>"), "3.0 → 6.0 requests per CR");
        assert!(svg.contains("naive &lt;v2&gt;/reference"));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
