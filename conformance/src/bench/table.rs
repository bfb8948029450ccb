//! The bench results as plain-text tables (printed, and written as `bench.txt`).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::model::{
    BenchReport, CPU_PROCESSES, CoderdTraffic, CpuBreakdown, ScaleResult, TargetStatus,
};

/// Left-aligned first column, right-aligned numbers, two spaces between columns.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let columns = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                out.push_str("  ");
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    out += &line(
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
    );
    for row in rows {
        let mut cells: Vec<&str> = row.iter().map(String::as_str).take(columns).collect();
        cells.resize(columns, "");
        out += &line(cells);
    }
    out
}

pub fn seconds(ms: Option<u64>) -> String {
    ms.map_or_else(
        || "—".to_owned(),
        |ms| format!("{:.2} s", ms as f64 / 1000.0),
    )
}

pub fn ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.2}"))
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// `APPLY deployments 10, PATCH x 2`, or nothing when there were no writes.
/// One row per key of any size's counts, one column per size: the count divided by the size.
fn per_cr_table(
    first_header: &str,
    scale: &[ScaleResult],
    counts: impl Fn(&ScaleResult) -> &BTreeMap<String, u64>,
) -> String {
    let keys: BTreeSet<&String> = scale.iter().flat_map(|s| counts(s).keys()).collect();
    let headers: Vec<String> = std::iter::once(first_header.to_owned())
        .chain(scale.iter().map(|s| format!("N={}", s.size)))
        .collect();
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|key| {
            std::iter::once((*key).clone())
                .chain(scale.iter().map(|s| {
                    let n = counts(s).get(*key).copied().unwrap_or(0);
                    ratio(super::stats::per(n, s.size))
                }))
                .collect()
        })
        .collect();
    table(
        &headers.iter().map(String::as_str).collect::<Vec<_>>(),
        &rows,
    )
}

fn writes_by_kind(writes: &super::model::ApiWrites) -> String {
    if writes.by_kind.is_empty() {
        return String::new();
    }
    let kinds: Vec<String> = writes
        .by_kind
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    format!("  writes by kind: {}\n", kinds.join(", "))
}

/// kube-apiserver load from every client, which the operator shares the API server with.
fn api_load(requests: u64, over_ms: u64) -> String {
    let rate = (over_ms > 0).then(|| requests as f64 * 1000.0 / over_ms as f64);
    format!(
        "  kube-apiserver requests from all clients (operator, readiness simulator, bench): {requests} ({}/s)\n",
        ratio(rate)
    )
}

/// The processes of `breakdowns` in report order: the known ones, then any other by name.
fn cpu_processes<'a>(breakdowns: impl IntoIterator<Item = &'a CpuBreakdown>) -> Vec<String> {
    let others: BTreeSet<&String> = breakdowns
        .into_iter()
        .flat_map(|cpu| cpu.cpu_seconds.keys())
        .filter(|name| !CPU_PROCESSES.contains(&name.as_str()))
        .collect();
    CPU_PROCESSES
        .iter()
        .map(|name| (*name).to_owned())
        .chain(others.into_iter().cloned())
        .collect()
}

fn cpu_seconds(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.2}"))
}

/// CPU seconds by process, one column per breakdown, then their total and wall time × CPUs.
fn cpu_table(first: &str, columns: &[(String, &CpuBreakdown)], cpus: usize) -> String {
    let headers: Vec<&str> = std::iter::once(first)
        .chain(columns.iter().map(|(name, _)| name.as_str()))
        .collect();
    let mut rows: Vec<Vec<String>> = cpu_processes(columns.iter().map(|(_, cpu)| *cpu))
        .into_iter()
        .map(|process| {
            let values: Vec<String> = columns
                .iter()
                .map(|(_, cpu)| cpu_seconds(cpu.cpu_seconds.get(&process).copied()))
                .collect();
            std::iter::once(process).chain(values).collect()
        })
        .collect();
    let summary = |label: &str, value: &dyn Fn(&CpuBreakdown) -> f64| -> Vec<String> {
        std::iter::once(label.to_owned())
            .chain(columns.iter().map(|(_, cpu)| cpu_seconds(Some(value(cpu)))))
            .collect()
    };
    rows.push(summary("total", &CpuBreakdown::total));
    rows.push(summary(&format!("wall × CPUs ({cpus})"), &|cpu| {
        cpu.available(cpus)
    }));
    table(&headers, &rows)
}

fn traffic_line(traffic: &CoderdTraffic) -> String {
    format!(
        "{} coderd requests ({} per CR; key calls {}, entitlements {}, 429 answers {})",
        traffic.total,
        ratio(traffic.per_cr),
        traffic.key_calls,
        traffic.entitlement_calls,
        traffic.rate_limited
    )
}

/// The whole report as text: one section per measured phase, then the targets.
pub fn render(report: &BenchReport) -> String {
    let mut out = String::new();
    let env = &report.environment;
    let _ = writeln!(
        out,
        "coder-provisioner bench of {} (operator: {}; bench: {} build, {} CPUs, load at start {}), command: {}",
        env.implementation,
        env.operator_build,
        env.profile,
        env.cpus,
        env.load_average_at_start.as_deref().unwrap_or("?"),
        env.operator_command
    );
    if !report.scale.is_empty() {
        let _ = writeln!(
            out,
            "\nScale: {} namespaces, {} control planes; per-CR time from create to first seen Ready",
            report.config.namespaces, report.config.control_planes
        );
        let rows: Vec<Vec<String>> = report
            .scale
            .iter()
            .map(|s| {
                vec![
                    s.size.to_string(),
                    format!("{}/{}", s.ready, s.size),
                    seconds(s.all_ready_ms),
                    seconds(s.latency.p50_ms),
                    seconds(s.latency.p95_ms),
                    seconds(s.latency.max_ms),
                    ratio(s.coderd.per_cr),
                    ratio(s.writes.per_cr),
                    s.api_requests_all_clients.to_string(),
                    mib(s.operator.peak_rss_kib),
                    format!("{:.2}", s.operator.cpu_seconds),
                ]
            })
            .collect();
        out += &table(
            &[
                "N",
                "Ready",
                "all Ready",
                "p50",
                "p95",
                "max",
                "coderd/CR",
                "API writes/CR",
                "API req (all)",
                "peak RSS",
                "CPU s",
            ],
            &rows,
        );
        if report.scale.iter().any(|s| !s.cpu.cpu_seconds.is_empty()) {
            out += "\nCPU seconds by process (scale phase: first create to end of settle window)\n";
            let columns: Vec<(String, &CpuBreakdown)> = report
                .scale
                .iter()
                .map(|s| (format!("N={}", s.size), &s.cpu))
                .collect();
            out += &cpu_table("process", &columns, env.cpus);
        }
        out += "\ncoderd requests per CR by route\n";
        out += &per_cr_table("route", &report.scale, |s| &s.coderd.by_route);
        out += "\nKubernetes API writes per CR by kind (operator only)\n";
        out += &per_cr_table("write", &report.scale, |s| &s.writes.by_kind);
        out += "\nKubernetes API requests per CR by kind (all clients: operator, readiness stand-in, bench, control plane)\n";
        out += &per_cr_table("request", &report.scale, |s| &s.api_requests_by_kind);
    }
    if let Some(steady) = &report.steady {
        let _ = writeln!(
            out,
            "\nSteady state: N = {}, idle {}",
            steady.size,
            seconds(Some(steady.idle_ms))
        );
        let _ = writeln!(out, "  {}", traffic_line(&steady.coderd));
        let _ = writeln!(
            out,
            "  {} operator API writes ({} CoderProvisioner status); {} CR resourceVersion changes; {}/{} still Ready",
            steady.writes.total,
            steady.writes.cr_status_writes,
            steady.cr_modifications,
            steady.ready_at_end,
            steady.size
        );
        out += &writes_by_kind(&steady.writes);
        out += &api_load(steady.api_requests_all_clients, steady.idle_ms);
    }
    if let Some(restart) = &report.restart {
        let _ = writeln!(
            out,
            "\nRestart (SIGKILL, start again): N = {}, every CR reconciled again after {} (observed for {} more)",
            restart.size,
            seconds(restart.reconciled_ms),
            seconds(Some(restart.settle_ms))
        );
        let _ = writeln!(out, "  {}", traffic_line(&restart.coderd));
        let _ = writeln!(
            out,
            "  {} operator API writes ({} CoderProvisioner status); {} CR resourceVersion changes; {}/{} still Ready; \
             new process: {}, {:.2} CPU s",
            restart.writes.total,
            restart.writes.cr_status_writes,
            restart.cr_modifications,
            restart.ready_at_end,
            restart.size,
            mib(restart.operator.peak_rss_kib),
            restart.operator.cpu_seconds
        );
        out += &writes_by_kind(&restart.writes);
        if !restart.cpu.cpu_seconds.is_empty() {
            let columns = [(format!("N={}", restart.size), &restart.cpu)];
            out += "  CPU seconds by process (SIGKILL to end of settle window)\n";
            for line in cpu_table("process", &columns, env.cpus).lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
        out += &api_load(
            restart.api_requests_all_clients,
            restart.reconciled_ms.unwrap_or(0) + restart.settle_ms,
        );
    }
    if let Some(churn) = &report.churn {
        let _ = writeln!(
            out,
            "\nChurn under faults: N = {}, 429 on key routes toggled every {} ms for {} ({} of key requests answered 429)",
            churn.size,
            churn.toggle_ms,
            seconds(Some(churn.fault_window_ms)),
            churn
                .rate_limited_share
                .map_or_else(|| "—".to_owned(), |s| format!("{:.0} %", s * 100.0))
        );
        let row = |name: &str, run: &super::model::ChurnRun| {
            vec![
                name.to_owned(),
                format!("{}/{}", run.ready, churn.size),
                seconds(run.all_ready_ms),
                seconds(run.latency.p95_ms),
                run.coderd.total.to_string(),
                ratio(run.coderd.per_cr),
                run.coderd.rate_limited.to_string(),
                format!(
                    "{:.2}",
                    run.coderd.keys_created as f64 / churn.size.max(1) as f64
                ),
            ]
        };
        out += &table(
            &[
                "run",
                "Ready",
                "all Ready",
                "p95",
                "coderd",
                "coderd/CR",
                "429s",
                "keys/CR",
            ],
            &[
                row("healthy", &churn.healthy),
                row("faulted", &churn.faulted),
            ],
        );
        let _ = writeln!(
            out,
            "  faulted/healthy: coderd requests per CR ×{}, time to all Ready ×{}",
            ratio(churn.requests_ratio),
            ratio(churn.time_ratio)
        );
    }
    if let Some(suite) = &report.suite {
        let scope = suite.tag_filter.as_ref().map_or_else(
            || "full suite".to_owned(),
            |tags| format!("only scenarios matching {tags}"),
        );
        let _ = writeln!(
            out,
            "\nSuite cost ({scope}): `conformance run` on the local tier took {} including control-plane start, {} \
             without (setup {}), exit code {}",
            seconds(Some(suite.wall_ms)),
            seconds(suite.without_setup_ms),
            seconds(suite.setup_ms),
            suite
                .exit_code
                .map_or_else(|| "none (killed)".to_owned(), |c| c.to_string())
        );
        if let Some(pace) = &suite.pace {
            let _ = writeln!(out, "  pace: {pace}");
        }
    }
    out += "\nTargets\n";
    let rows: Vec<Vec<String>> = report
        .targets
        .iter()
        .map(|t| {
            let status = match t.status {
                TargetStatus::Met => "met",
                TargetStatus::Missed => "MISSED",
                TargetStatus::NotMeasured => "not measured",
            };
            vec![t.target.clone(), t.measured.clone(), status.to_owned()]
        })
        .collect();
    out += &table(&["target", "measured", "result"], &rows);
    for error in &report.errors {
        let _ = writeln!(out, "error: {error}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::model::evaluate_targets;
    use crate::bench::model::tests::sample_report;

    #[test]
    fn columns_line_up() {
        let text = table(
            &["N", "value"],
            &[
                vec!["1".into(), "2.50".into()],
                vec!["1000".into(), "10.00".into()],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            ["N     value", "----  -----", "1      2.50", "1000  10.00"]
        );
    }

    #[test]
    fn short_rows_are_padded() {
        let text = table(&["a", "b"], &[vec!["x".into()]]);
        assert_eq!(text.lines().last(), Some("x"));
    }

    #[test]
    fn the_report_shows_every_size_and_every_target() {
        let mut report = sample_report();
        report.targets = evaluate_targets(&report);
        let text = render(&report);
        for needle in [
            "N=1",
            "N=500",
            "N=1000",
            "70.00 s",
            "MISSED",
            "not measured",
            "68.4 MiB",
            "POST /api/v2/",
            "operator: coder-provisioner-operator 0.1.0 (debug build); bench: debug build",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(
            !text.contains("Steady state"),
            "no steady phase was measured"
        );
    }

    #[test]
    fn follow_up_phases_have_their_own_sections() {
        use crate::bench::model::{
            ApiWrites, ChurnResult, ChurnRun, RestartResult, SteadyResult, SuiteResult,
        };
        let mut report = sample_report();
        let writes = ApiWrites {
            total: 4,
            per_cr: Some(0.4),
            cr_status_writes: 0,
            by_kind: [("APPLY deployments".to_owned(), 4)].into(),
        };
        let base = &report.scale[0];
        report.steady = Some(SteadyResult {
            size: 10,
            idle_ms: 60_000,
            coderd: Default::default(),
            writes: ApiWrites::default(),
            api_requests_all_clients: 600,
            cr_modifications: 0,
            ready_at_end: 10,
            entitlement_allowance: 20,
        });
        report.restart = Some(RestartResult {
            size: 10,
            reconciled_ms: Some(1_100),
            settle_ms: 5_000,
            coderd: Default::default(),
            writes,
            api_requests_all_clients: 100,
            cr_modifications: 0,
            ready_at_end: 10,
            operator: base.operator,
            cpu: base.cpu.clone(),
        });
        let run = ChurnRun::from(base);
        report.churn = Some(ChurnResult {
            size: 1,
            fault_window_ms: 30_000,
            toggle_ms: 500,
            rate_limited_share: Some(0.5),
            faulted: run.clone(),
            healthy: run,
            requests_ratio: Some(1.0),
            time_ratio: Some(1.0),
        });
        report.suite = Some(SuiteResult {
            exit_code: Some(0),
            wall_ms: 60_000,
            setup_ms: Some(4_000),
            without_setup_ms: Some(56_000),
            tag_filter: Some("@tutorial".to_owned()),
            report_dir: "r".to_owned(),
            pace: Some("1 scenarios in 56 s, up to 1 at once".to_owned()),
        });
        report.targets = evaluate_targets(&report);
        let text = render(&report);
        for needle in [
            "Steady state: N = 10, idle 60.00 s",
            "reconciled again after 1.10 s",
            "writes by kind: APPLY deployments 4",
            "50 % of key requests answered 429",
            "only scenarios matching @tutorial",
            "  pace: 1 scenarios in 56 s, up to 1 at once",
            "all clients (operator, readiness simulator, bench): 600 (10.00/s)",
            "56.00 s",
            "  CPU seconds by process (SIGKILL to end of settle window)",
            "\n  kube-apiserver            4.25\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert_eq!(
            text.matches("writes by kind").count(),
            1,
            "no line for a phase without writes"
        );
    }

    #[test]
    fn the_scale_phase_has_a_cpu_breakdown_by_process() {
        let mut report = sample_report();
        // A process that could not be read in one run, and one outside the known set.
        report.scale[0].cpu.cpu_seconds.remove("etcd");
        report.scale[2]
            .cpu
            .cpu_seconds
            .insert("kube-scheduler".to_owned(), 1.0);
        let text = render(&report);
        let section: Vec<&str> = text
            .split("CPU seconds by process (scale phase")
            .nth(1)
            .expect("a CPU breakdown section")
            .lines()
            .skip(1)
            .take_while(|line| !line.is_empty())
            .collect();
        assert_eq!(
            section,
            [
                "process                    N=1  N=500  N=1000",
                "-----------------------  -----  -----  ------",
                "operator                  1.50   1.50    1.50",
                "kube-apiserver            4.25   4.25    4.25",
                "etcd                         —   2.00    2.00",
                "kube-controller-manager   0.25   0.25    0.25",
                "bench                     0.01   5.00   10.00",
                "kube-scheduler               —      —    1.00",
                "total                     6.01  13.00   19.00",
                "wall × CPUs (2)          21.80  60.00  160.00",
            ],
            "in\n{text}"
        );
    }

    #[test]
    fn an_older_report_without_cpu_breakdowns_has_no_breakdown_table() {
        let mut report = sample_report();
        for scale in &mut report.scale {
            scale.cpu = Default::default();
        }
        assert!(!render(&report).contains("CPU seconds by process"));
    }

    #[test]
    fn missing_values_show_a_dash() {
        assert_eq!(seconds(None), "—");
        assert_eq!(seconds(Some(1234)), "1.23 s");
        assert_eq!(ratio(None), "—");
    }
}
