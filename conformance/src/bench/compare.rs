//! Side by side (`bench --compare`): every figure the bench measured, for each implementation,
//! with the ratio of the second to the first. Written as `bench.json` ([`Comparison`]), as the
//! first table of `bench.txt` and as `bench.svg` (see [`super::svg::render_comparison`]).
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::model::BenchReport;
use super::stats::per;
use super::table::table;

/// Identifies the side-by-side document format.
pub const COMPARISON_SCHEMA: &str = "coder-provisioner-conformance/bench-comparison/v1";

/// The side-by-side document: each implementation's full results, and the figures lined up.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Comparison {
    pub schema: String,
    /// One report per implementation, in command-line order; the first is the baseline of
    /// every ratio.
    pub implementations: Vec<BenchReport>,
    pub figures: Vec<ComparedFigure>,
}

/// How a figure is counted, which decides how it is printed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Seconds,
    CpuSeconds,
    PerCr,
    Count,
    Mib,
}

impl Unit {
    pub fn label(self) -> &'static str {
        match self {
            Self::Seconds => "s",
            Self::CpuSeconds => "CPU s",
            Self::PerCr => "per CR",
            Self::Count => "count",
            Self::Mib => "MiB",
        }
    }

    pub fn format(self, value: f64) -> String {
        match self {
            Self::Count => format!("{value:.0}"),
            Self::Mib => format!("{value:.1}"),
            Self::Seconds | Self::CpuSeconds | Self::PerCr => format!("{value:.2}"),
        }
    }
}

/// One figure for every implementation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ComparedFigure {
    pub figure: String,
    pub unit: Unit,
    /// Per implementation, in [`Comparison::implementations`] order; `None` = not measured.
    pub values: Vec<Option<f64>>,
    /// Second ÷ first; `None` when either is missing or the first is 0.
    pub ratio: Option<f64>,
}

/// A figure of one report, named so that the same figure of another report matches it.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub name: String,
    pub unit: Unit,
    pub value: Option<f64>,
}

/// `rows` named `"{phase}: {row}"`.
fn phase_figures<'a>(
    phase: &'a str,
    rows: impl IntoIterator<Item = (&'a str, Unit, Option<f64>)> + 'a,
) -> impl Iterator<Item = Figure> + 'a {
    rows.into_iter().map(move |(name, unit, value)| Figure {
        name: format!("{phase}: {name}"),
        unit,
        value,
    })
}

fn secs(ms: Option<u64>) -> Option<f64> {
    ms.map(|ms| ms as f64 / 1000.0)
}

fn count(n: u64) -> Option<f64> {
    Some(n as f64)
}

fn mib(kib: u64) -> Option<f64> {
    Some(kib as f64 / 1024.0)
}

/// Every figure of a report that can be set against another implementation's, in report order.
pub fn figures(report: &BenchReport) -> Vec<Figure> {
    let mut out = Vec::new();
    for s in &report.scale {
        let phase = format!("scale N={}", s.size);
        let routes: Vec<(String, Option<f64>)> = s
            .coderd
            .by_route
            .iter()
            .map(|(route, n)| (format!("coderd {route}"), per(*n, s.size)))
            .collect();
        out.extend(phase_figures(
            &phase,
            [
                ("all Ready", Unit::Seconds, secs(s.all_ready_ms)),
                ("create → Ready p50", Unit::Seconds, secs(s.latency.p50_ms)),
                ("create → Ready p95", Unit::Seconds, secs(s.latency.p95_ms)),
                ("create → Ready max", Unit::Seconds, secs(s.latency.max_ms)),
                ("coderd requests", Unit::PerCr, s.coderd.per_cr),
            ],
        ));
        out.extend(phase_figures(
            &phase,
            routes
                .iter()
                .map(|(route, value)| (route.as_str(), Unit::PerCr, *value)),
        ));
        out.extend(phase_figures(
            &phase,
            [
                ("API writes", Unit::PerCr, s.writes.per_cr),
                ("operator peak RSS", Unit::Mib, mib(s.operator.peak_rss_kib)),
                (
                    "operator CPU",
                    Unit::CpuSeconds,
                    Some(s.operator.cpu_seconds),
                ),
            ],
        ));
    }
    if let Some(steady) = &report.steady {
        let phase = format!("steady N={}", steady.size);
        out.extend(phase_figures(
            &phase,
            [
                ("coderd requests", Unit::Count, count(steady.coderd.total)),
                (
                    "coderd key calls",
                    Unit::Count,
                    count(steady.coderd.key_calls),
                ),
                ("API writes", Unit::Count, count(steady.writes.total)),
                (
                    "CoderProvisioner status writes",
                    Unit::Count,
                    count(steady.writes.cr_status_writes),
                ),
                ("CR changes", Unit::Count, count(steady.cr_modifications)),
            ],
        ));
    }
    if let Some(restart) = &report.restart {
        let phase = format!("restart N={}", restart.size);
        let new_process = restart.operator;
        out.extend(phase_figures(
            &phase,
            [
                (
                    "every CR reconciled again",
                    Unit::Seconds,
                    secs(restart.reconciled_ms),
                ),
                ("coderd requests", Unit::Count, count(restart.coderd.total)),
                (
                    "coderd key calls",
                    Unit::Count,
                    count(restart.coderd.key_calls),
                ),
                ("API writes", Unit::Count, count(restart.writes.total)),
                (
                    "new process peak RSS",
                    Unit::Mib,
                    mib(new_process.peak_rss_kib),
                ),
                (
                    "new process CPU",
                    Unit::CpuSeconds,
                    Some(new_process.cpu_seconds),
                ),
            ],
        ));
    }
    if let Some(churn) = &report.churn {
        let phase = format!("churn N={} under 429s", churn.size);
        let faulted = &churn.faulted;
        out.extend(phase_figures(
            &phase,
            [
                ("all Ready", Unit::Seconds, secs(faulted.all_ready_ms)),
                (
                    "create → Ready p95",
                    Unit::Seconds,
                    secs(faulted.latency.p95_ms),
                ),
                ("coderd requests", Unit::PerCr, faulted.coderd.per_cr),
                (
                    "answered 429",
                    Unit::Count,
                    count(faulted.coderd.rate_limited),
                ),
            ],
        ));
    }
    if let Some(suite) = &report.suite {
        out.extend(phase_figures(
            "suite",
            [(
                "wall time without setup",
                Unit::Seconds,
                secs(suite.without_setup_ms),
            )],
        ));
    }
    out
}

/// Lines up the figures of every report (a figure only one of them has gets `None` for the
/// others) and divides the second by the first.
pub fn compare(implementations: Vec<BenchReport>) -> Comparison {
    let per_report: Vec<Vec<Figure>> = implementations.iter().map(figures).collect();
    let mut lined_up: Vec<ComparedFigure> = Vec::new();
    for (index, report_figures) in per_report.iter().enumerate() {
        for f in report_figures {
            let position = match lined_up.iter().position(|c| c.figure == f.name) {
                Some(position) => position,
                None => {
                    lined_up.push(ComparedFigure {
                        figure: f.name.clone(),
                        unit: f.unit,
                        values: vec![None; implementations.len()],
                        ratio: None,
                    });
                    lined_up.len() - 1
                }
            };
            lined_up[position].values[index] = f.value;
        }
    }
    for compared in &mut lined_up {
        compared.ratio = match compared.values.as_slice() {
            [Some(first), Some(second), ..] if *first > 0.0 => Some(second / first),
            _ => None,
        };
    }
    Comparison {
        schema: COMPARISON_SCHEMA.to_owned(),
        implementations,
        figures: lined_up,
    }
}

/// The phases of `report` in which not every CR reached Ready, as `(figure prefix, why)`: their
/// figures describe a broken run, not the implementation's speed.
pub fn unready_phases(report: &BenchReport) -> Vec<(String, String)> {
    let mut out = Vec::new();
    // `showing`: what the CRs that were not Ready showed, when it was recorded.
    let mut check = |phase: String, ready: usize, size: usize, showing: &[String]| {
        if ready < size {
            let why = format!("{ready} of {size} CRs Ready");
            out.push((
                phase,
                if showing.is_empty() {
                    why
                } else {
                    format!("{why} ({})", showing.join(", "))
                },
            ));
        }
    };
    for s in &report.scale {
        let showing: Vec<String> = s
            .not_ready
            .iter()
            .map(|(condition, count)| format!("{count} showed {condition}"))
            .collect();
        check(format!("scale N={}", s.size), s.ready, s.size, &showing);
    }
    if let Some(steady) = &report.steady {
        check(
            format!("steady N={}", steady.size),
            steady.ready_at_end,
            steady.size,
            &[],
        );
    }
    if let Some(restart) = &report.restart {
        check(
            format!("restart N={}", restart.size),
            restart.ready_at_end,
            restart.size,
            &[],
        );
    }
    if let Some(churn) = &report.churn {
        let phase = format!("churn N={} under 429s", churn.size);
        check(phase.clone(), churn.faulted.ready, churn.size, &[]);
        check(phase, churn.healthy.ready, churn.size, &[]);
    }
    out
}

/// Drops the ratio of every figure of a phase where either side did not bring every CR to
/// Ready, and says which side and phase that was (`logs` names where each side's logs are).
pub fn withhold_broken_ratios(comparison: &mut Comparison, logs: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for (index, report) in comparison.implementations.iter().enumerate() {
        for (phase, why) in unready_phases(report) {
            for compared in &mut comparison.figures {
                if compared.figure.starts_with(&format!("{phase}:")) {
                    compared.ratio = None;
                }
            }
            problems.push(format!(
                "{}: {phase}: {why}, so no ratio is given for that phase (its operator's log: {})",
                report.environment.implementation,
                logs.get(index).map_or("not kept", String::as_str)
            ));
        }
    }
    problems.dedup();
    problems
}

impl Comparison {
    pub fn names(&self) -> Vec<&str> {
        self.implementations
            .iter()
            .map(|r| r.environment.implementation.as_str())
            .collect()
    }
}

/// The side-by-side table, then each implementation's own report.
pub fn render(comparison: &Comparison) -> String {
    let names = comparison.names();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Side by side: {} (ratio = {})",
        names.join(" vs "),
        ratio_header(&names)
    );
    for report in &comparison.implementations {
        let _ = writeln!(
            out,
            "  {} ({}): {}",
            report.environment.implementation,
            report.environment.operator_build,
            report.environment.operator_command
        );
    }
    let ratio_column = ratio_header(&names);
    let headers: Vec<&str> = ["figure", "unit"]
        .into_iter()
        .chain(names.iter().copied())
        .chain([ratio_column.as_str()])
        .collect();
    let rows: Vec<Vec<String>> = comparison
        .figures
        .iter()
        .map(|f| {
            [f.figure.clone(), f.unit.label().to_owned()]
                .into_iter()
                .chain(
                    f.values
                        .iter()
                        .map(|v| v.map_or_else(|| "—".to_owned(), |v| f.unit.format(v))),
                )
                .chain([f
                    .ratio
                    .map_or_else(|| "—".to_owned(), |r| format!("×{r:.2}"))])
                .collect()
        })
        .collect();
    out += &table(&headers, &rows);
    for report in &comparison.implementations {
        let _ = writeln!(out, "\n==== {}", report.environment.implementation);
        out += &super::table::render(report);
    }
    out
}

/// `second/first`, the column of [`ComparedFigure::ratio`].
pub fn ratio_header(names: &[&str]) -> String {
    match names {
        [first, second, ..] => format!("{second}/{first}"),
        _ => "ratio".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::bench::model::SteadyResult;
    use crate::bench::model::tests::sample_report;

    fn named(name: &str) -> BenchReport {
        let mut report = sample_report();
        report.environment.implementation = name.to_owned();
        report
    }

    /// An implementation that never became Ready (it rewrote the fixture, it crashed) gives no
    /// ratio for that phase, and the run names it.
    #[test]
    fn a_side_that_never_became_ready_gets_no_ratio() {
        let reference = named("reference");
        let mut broken = named("other");
        for scale in &mut broken.scale {
            scale.ready = 0;
            scale.not_ready = BTreeMap::from([(
                "ControlPlaneReady=False ControlPlaneUnavailable".to_owned(),
                scale.size,
            )]);
        }
        let mut comparison = compare(vec![reference, broken]);
        let size = comparison.implementations[0].scale[0].size;
        let problems = withhold_broken_ratios(&mut comparison, &["a".into(), "b/logs".into()]);
        assert!(
            problems[0].starts_with(&format!(
                "other: scale N={size}: 0 of {size} CRs Ready ({size} showed ControlPlaneReady=False ControlPlaneUnavailable)"
            )),
            "{problems:?}"
        );
        assert!(
            problems[0].ends_with("(its operator's log: b/logs)"),
            "{problems:?}"
        );
        assert!(
            comparison
                .figures
                .iter()
                .filter(|f| f.figure.starts_with("scale N="))
                .all(|f| f.ratio.is_none())
        );
    }

    #[test]
    fn figures_line_up_by_name_with_the_ratio_to_the_first() {
        let reference = named("reference");
        let mut naive = named("naive");
        naive.scale[1].coderd.per_cr = Some(3.0);
        naive.scale[1].operator.peak_rss_kib = 60_000;
        naive.scale.remove(2);
        let comparison = compare(vec![reference, naive]);
        let find = |name: &str| {
            comparison
                .figures
                .iter()
                .find(|f| f.figure == name)
                .unwrap_or_else(|| panic!("no figure {name:?}"))
        };
        let requests = find("scale N=500: coderd requests");
        assert_eq!(requests.values, vec![Some(2.0), Some(3.0)]);
        assert_eq!(requests.ratio, Some(1.5));
        assert_eq!(find("scale N=500: operator peak RSS").ratio, Some(2.0));
        let only_first = find("scale N=1000: all Ready");
        assert_eq!(only_first.values, vec![Some(70.0), None]);
        assert_eq!(only_first.ratio, None);
        assert!(
            comparison
                .figures
                .iter()
                .any(|f| f.figure.starts_with("scale N=1: coderd POST ")),
            "requests by route are figures too"
        );
    }

    #[test]
    fn a_zero_baseline_has_no_ratio() {
        let mut reference = named("reference");
        let steady = SteadyResult {
            size: 10,
            idle_ms: 60_000,
            coderd: Default::default(),
            writes: Default::default(),
            api_requests_all_clients: 0,
            cr_modifications: 0,
            ready_at_end: 10,
            entitlement_allowance: 2,
        };
        reference.steady = Some(steady.clone());
        let mut naive = named("naive");
        naive.steady = Some(SteadyResult {
            cr_modifications: 120,
            ..steady
        });
        let comparison = compare(vec![reference, naive]);
        let changes = comparison
            .figures
            .iter()
            .find(|f| f.figure == "steady N=10: CR changes")
            .expect("CR changes");
        assert_eq!(changes.values, vec![Some(0.0), Some(120.0)]);
        assert_eq!(changes.ratio, None);
    }

    #[test]
    fn the_table_shows_both_values_and_the_ratio_then_each_report() {
        let mut naive = named("naive");
        naive.scale[0].all_ready_ms = Some(1_800);
        let text = render(&compare(vec![named("reference"), naive]));
        let row = text
            .lines()
            .find(|l| l.starts_with("scale N=1: all Ready"))
            .expect("a row for N=1");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[cells.len() - 4..], ["s", "0.90", "1.80", "×2.00"]);
        assert!(text.contains("naive/reference"), "{text}");
        assert!(text.contains("\n==== reference\n") && text.contains("\n==== naive\n"));
    }

    #[test]
    fn the_document_keeps_both_reports_through_json() {
        let comparison = compare(vec![named("reference"), named("naive")]);
        let json = serde_json::to_string(&comparison).expect("serialize");
        let back: Comparison = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, comparison);
        let value: serde_json::Value = serde_json::from_str(&json).expect("json");
        assert_eq!(value["schema"], COMPARISON_SCHEMA);
        assert_eq!(
            value["implementations"][1]["environment"]["implementation"],
            "naive"
        );
        assert_eq!(value["figures"][0]["unit"], "seconds");
    }
}
