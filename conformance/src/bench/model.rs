//! The bench results document (`bench.json`) and the targets it is judged against.
//!
//! Performance is measured, not asserted: a missed target is reported, never an error.
use std::collections::BTreeMap;

use fake_coderd::JournalEntry;
use fake_coderd::routes;
use serde::{Deserialize, Serialize};

use super::apimetrics::WriteCounts;
use super::procfs::Footprint;
use super::stats::{Latency, per};

/// Identifies the document format.
pub const SCHEMA: &str = "coder-provisioner-conformance/bench/v1";
/// How long a control plane's entitlement check stays fresh (contract R-ENT-1).
pub const ENTITLEMENT_WINDOW_SECS: u64 = 120;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BenchReport {
    pub schema: String,
    pub started_at: String,
    pub duration_ms: u64,
    pub environment: BenchEnvironment,
    pub config: BenchConfig,
    pub scale: Vec<ScaleResult>,
    pub steady: Option<SteadyResult>,
    pub restart: Option<RestartResult>,
    pub churn: Option<ChurnResult>,
    pub suite: Option<SuiteResult>,
    pub targets: Vec<TargetOutcome>,
    /// How each figure was measured, in plain words.
    pub methods: Vec<String>,
    /// Phases that could not be measured, with the reason.
    pub errors: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BenchEnvironment {
    /// The measured implementation's name (`--name`, `--compare-name`).
    #[serde(default)]
    pub implementation: String,
    /// Cargo profile of the bench binary (`debug` or `release`): its own overhead, not the
    /// operator's.
    pub profile: String,
    /// How the measured operator was built: the reference operator's own `--version` (which
    /// names its profile), or `as given` for a command line.
    #[serde(default)]
    pub operator_build: String,
    pub operator_command: String,
    pub cpus: usize,
    /// `/proc/loadavg` when the bench started: other load on the machine skews timings.
    pub load_average_at_start: Option<String>,
    pub simulated: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct BenchConfig {
    pub phases: Vec<String>,
    pub sizes: Vec<usize>,
    pub namespaces: usize,
    pub control_planes: usize,
    pub idle_secs: u64,
    pub settle_secs: u64,
    pub steady_size: usize,
    pub churn_size: usize,
    pub fault_window_secs: u64,
    pub ready_timeout_secs: u64,
}

/// coderd requests seen by the fake coderds (journal), over a phase.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CoderdTraffic {
    pub total: u64,
    pub per_cr: Option<f64>,
    /// Requests on the provisioner-key routes (list, create, delete).
    pub key_calls: u64,
    pub entitlement_calls: u64,
    /// Answered 429.
    pub rate_limited: u64,
    /// Provisioner keys coderd created (`POST …/provisionerkeys` answered 201).
    #[serde(default)]
    pub keys_created: u64,
    /// `METHOD route-template` → count.
    pub by_route: BTreeMap<String, u64>,
}

impl CoderdTraffic {
    pub fn from_journal(entries: &[JournalEntry], crs: usize) -> Self {
        let mut traffic = Self::default();
        for entry in entries {
            let route = entry.route.as_deref().unwrap_or("(unknown route)");
            traffic.total += 1;
            if route == routes::PROVISIONER_KEYS || route == routes::DELETE_KEY {
                traffic.key_calls += 1;
            }
            if route == routes::ENTITLEMENTS {
                traffic.entitlement_calls += 1;
            }
            if entry.status == 429 {
                traffic.rate_limited += 1;
            }
            if entry.method == "POST" && route == routes::PROVISIONER_KEYS && entry.status == 201 {
                traffic.keys_created += 1;
            }
            *traffic
                .by_route
                .entry(format!("{} {route}", entry.method))
                .or_default() += 1;
        }
        traffic.per_cr = per(traffic.total, crs);
        traffic
    }
}

/// Kubernetes API writes attributed to the operator over a phase (see `apimetrics`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ApiWrites {
    pub total: u64,
    pub per_cr: Option<f64>,
    /// Writes to `coderprovisioners/status`.
    pub cr_status_writes: u64,
    /// `VERB resource[/subresource]` → count.
    pub by_kind: BTreeMap<String, u64>,
}

impl ApiWrites {
    pub fn from_counts(counts: &WriteCounts, crs: usize) -> Self {
        let total = counts.values().sum();
        Self {
            total,
            per_cr: per(total, crs),
            cr_status_writes: counts
                .iter()
                .filter(|(kind, _)| kind.resource == "coderprovisioners/status")
                .map(|(_, n)| n)
                .sum(),
            by_kind: counts.iter().map(|(kind, n)| (kind.label(), *n)).collect(),
        }
    }
}

/// Operator resource use: peak RSS of the process so far, CPU spent during the phase.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct OperatorUse {
    pub peak_rss_kib: u64,
    pub cpu_seconds: f64,
}

impl OperatorUse {
    pub fn between(start: Footprint, end: Footprint) -> Self {
        Self {
            peak_rss_kib: end.peak_rss_kib,
            cpu_seconds: (end.cpu_seconds - start.cpu_seconds).max(0.0),
        }
    }
}

/// The processes of a CPU breakdown, in report order.
pub const CPU_PROCESSES: [&str; 5] = [
    "operator",
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "bench",
];

/// Where the CPU time of a phase went, by process, next to the phase's wall time.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CpuBreakdown {
    /// Wall time between the phase's first and last CPU reading.
    pub wall_ms: u64,
    /// Process → utime+stime of `/proc/<pid>/stat` consumed during the phase, seconds: the
    /// operator, the local control plane's kube-apiserver, etcd and kube-controller-manager (named
    /// by `/proc/<pid>/comm`), and the bench process itself (fake coderds, readiness simulator,
    /// watches). A process that could not be read at both ends is absent.
    pub cpu_seconds: BTreeMap<String, f64>,
}

impl CpuBreakdown {
    /// The difference of two readings (process → CPU seconds since it started), for the
    /// processes in both.
    pub fn between(
        start: &BTreeMap<String, f64>,
        end: &BTreeMap<String, f64>,
        wall_ms: u64,
    ) -> Self {
        Self {
            wall_ms,
            cpu_seconds: end
                .iter()
                .filter_map(|(name, end)| {
                    start
                        .get(name)
                        .map(|start| (name.clone(), (end - start).max(0.0)))
                })
                .collect(),
        }
    }

    /// CPU seconds of every process read.
    pub fn total(&self) -> f64 {
        self.cpu_seconds.values().sum()
    }

    /// The CPU seconds the machine had to give during the phase: wall time × `cpus`.
    pub fn available(&self, cpus: usize) -> f64 {
        self.wall_ms as f64 / 1000.0 * cpus as f64
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScaleResult {
    pub size: usize,
    /// CRs seen with `phase: Ready` before the deadline.
    pub ready: usize,
    /// The CRs not Ready at the deadline, counted by what their status showed (their first
    /// condition that is not `True`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub not_ready: BTreeMap<String, usize>,
    /// Time to send every create request.
    pub submit_ms: u64,
    /// First create sent → last CR Ready; `None` if not all became Ready.
    pub all_ready_ms: Option<u64>,
    /// Per CR: its create sent → first seen Ready.
    pub latency: Latency,
    pub coderd: CoderdTraffic,
    pub writes: ApiWrites,
    /// kube-apiserver requests from all clients (operator, readiness simulator, bench) in the phase.
    pub api_requests_all_clients: u64,
    /// The same by kind (`GET secrets`, `APPLY (dry run) secrets`): where the API server's time goes.
    #[serde(default)]
    pub api_requests_by_kind: BTreeMap<String, u64>,
    pub operator: OperatorUse,
    /// CPU seconds by process from the first create to the end of the settle window.
    #[serde(default)]
    pub cpu: CpuBreakdown,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SteadyResult {
    pub size: usize,
    pub idle_ms: u64,
    pub coderd: CoderdTraffic,
    pub writes: ApiWrites,
    /// kube-apiserver requests from all clients in the phase.
    pub api_requests_all_clients: u64,
    /// CoderProvisioner resourceVersion changes seen by the watch.
    pub cr_modifications: u64,
    pub ready_at_end: usize,
    /// Entitlement calls allowed: one per CoderControlPlane per started 2-minute window.
    pub entitlement_allowance: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RestartResult {
    pub size: usize,
    /// SIGKILL → the new process has reconciled as many times as there are CRs.
    pub reconciled_ms: Option<u64>,
    /// Observation window after that point, included in the counts.
    pub settle_ms: u64,
    pub coderd: CoderdTraffic,
    pub writes: ApiWrites,
    /// kube-apiserver requests from all clients in the phase.
    pub api_requests_all_clients: u64,
    pub cr_modifications: u64,
    pub ready_at_end: usize,
    pub operator: OperatorUse,
    /// CPU seconds by process from the SIGKILL to the end of the settle window (operator: the new
    /// process's whole life).
    #[serde(default)]
    pub cpu: CpuBreakdown,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ChurnRun {
    pub ready: usize,
    pub all_ready_ms: Option<u64>,
    pub latency: Latency,
    pub coderd: CoderdTraffic,
}

impl From<&ScaleResult> for ChurnRun {
    fn from(scale: &ScaleResult) -> Self {
        Self {
            ready: scale.ready,
            all_ready_ms: scale.all_ready_ms,
            latency: scale.latency.clone(),
            coderd: scale.coderd.clone(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ChurnResult {
    pub size: usize,
    pub fault_window_ms: u64,
    /// The 429 fault is switched on and off every this many milliseconds.
    pub toggle_ms: u64,
    /// Share of provisioner-key requests answered 429 while the faults were active.
    pub rate_limited_share: Option<f64>,
    pub faulted: ChurnRun,
    pub healthy: ChurnRun,
    /// faulted ÷ healthy coderd requests per CR.
    pub requests_ratio: Option<f64>,
    /// faulted ÷ healthy time until all Ready.
    pub time_ratio: Option<f64>,
}

impl ChurnResult {
    pub fn ratios(faulted: &ChurnRun, healthy: &ChurnRun) -> (Option<f64>, Option<f64>) {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        (
            ratio(faulted.coderd.per_cr, healthy.coderd.per_cr),
            ratio(
                faulted.all_ready_ms.map(|m| m as f64),
                healthy.all_ready_ms.map(|m| m as f64),
            ),
        )
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SuiteResult {
    pub exit_code: Option<i32>,
    /// Whole `conformance run`, control-plane start included.
    pub wall_ms: u64,
    /// Start of the process → the suite announced its fake coderd (control plane started, CRDs
    /// installed); `None` if the line never came.
    pub setup_ms: Option<u64>,
    pub without_setup_ms: Option<u64>,
    /// `CUCUMBER_FILTER_TAGS` the suite inherited: set means not the full suite.
    pub tag_filter: Option<String>,
    pub report_dir: String,
    /// The suite's own `Pace:` line: how many scenarios ran at once and how busy the CPUs were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TargetStatus {
    Met,
    Missed,
    NotMeasured,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TargetOutcome {
    pub target: String,
    pub measured: String,
    pub status: TargetStatus,
}

fn outcome(target: &str, measured: Option<(String, bool)>) -> TargetOutcome {
    let (measured, status) = match measured {
        Some((text, true)) => (text, TargetStatus::Met),
        Some((text, false)) => (text, TargetStatus::Missed),
        None => ("not measured".to_owned(), TargetStatus::NotMeasured),
    };
    TargetOutcome {
        target: target.to_owned(),
        measured,
        status,
    }
}

/// The project's performance targets, judged from whatever was measured.
pub fn evaluate_targets(report: &BenchReport) -> Vec<TargetOutcome> {
    let at = |size: usize| report.scale.iter().find(|s| s.size == size);
    let count = |n: u64, limit: u64| (n.to_string(), n <= limit);
    let mut targets = vec![outcome(
        "coderd requests per CR on create at N = 500 ≤ 2.5",
        at(500)
            .and_then(|s| s.coderd.per_cr)
            .map(|r| (format!("{r:.2}"), r <= 2.5)),
    )];
    if let Some(steady) = &report.steady {
        targets.push(outcome(
            "steady state: 0 provisioner-key calls",
            Some(count(steady.coderd.key_calls, 0)),
        ));
        targets.push(outcome(
            "steady state: 0 CoderProvisioner status writes",
            Some(count(steady.writes.cr_status_writes, 0)),
        ));
        targets.push(outcome(
            "steady state: ≤ 1 entitlements call per control plane per 2 minutes",
            Some((
                format!(
                    "{} (allowed {})",
                    steady.coderd.entitlement_calls, steady.entitlement_allowance
                ),
                steady.coderd.entitlement_calls <= steady.entitlement_allowance,
            )),
        ));
    } else {
        targets.push(outcome(
            "steady state: 0 provisioner-key calls, 0 status writes",
            None,
        ));
    }
    if let Some(restart) = &report.restart {
        targets.push(outcome(
            "after restart: 0 provisioner-key calls",
            Some(count(restart.coderd.key_calls, 0)),
        ));
        targets.push(outcome(
            "after restart: 0 CoderProvisioner status writes",
            Some(count(restart.writes.cr_status_writes, 0)),
        ));
        targets.push(outcome(
            "after restart: 0 Kubernetes API writes",
            Some(count(restart.writes.total, 0)),
        ));
    } else {
        targets.push(outcome(
            "after restart: 0 provisioner-key calls, 0 writes",
            None,
        ));
    }
    let all_ready_within = |size: usize, limit_ms: u64| {
        at(size).map(|s| match s.all_ready_ms {
            Some(ms) => (format!("{:.2} s", ms as f64 / 1000.0), ms <= limit_ms),
            None => (
                format!("{} of {size} Ready before the deadline", s.ready),
                false,
            ),
        })
    };
    targets.push(outcome(
        "N = 1 create → Ready ≤ 0.3 s",
        all_ready_within(1, 300),
    ));
    targets.push(outcome(
        "N = 1000 all Ready ≤ 25 s",
        all_ready_within(1000, 25_000),
    ));
    targets.push(outcome(
        "operator ≤ 5 % of all CPU seconds at N = 1000",
        at(1000).and_then(|s| {
            let operator = s.cpu.cpu_seconds.get("operator")?;
            let share = operator / s.cpu.total();
            Some((
                format!(
                    "{:.1} % ({operator:.1} of {:.1} s)",
                    share * 100.0,
                    s.cpu.total()
                ),
                share <= 0.05,
            ))
        }),
    ));
    targets.push(outcome(
        "operator peak RSS at N = 1000 ≤ 32 MiB",
        at(1000).map(|s| {
            let mib = s.operator.peak_rss_kib as f64 / 1024.0;
            (
                format!("{mib:.1} MiB"),
                s.operator.peak_rss_kib <= 32 * 1024,
            )
        }),
    ));
    targets.push(outcome(
        "churn under 429s: ≤ 1 key created per CR",
        report.churn.as_ref().map(|churn| {
            let per_cr = churn.faulted.coderd.keys_created as f64 / churn.size.max(1) as f64;
            (format!("{per_cr:.2}"), per_cr <= 1.0)
        }),
    ));
    targets
}

/// Entitlement calls a well-behaved operator may make while idle: one per CoderControlPlane
/// object per started refresh window.
pub fn entitlement_allowance(control_plane_objects: usize, idle_secs: u64) -> u64 {
    control_plane_objects as u64 * idle_secs.div_ceil(ENTITLEMENT_WINDOW_SECS).max(1)
}

#[cfg(test)]
pub(crate) mod tests {
    use rstest::rstest;

    use super::*;
    use crate::bench::apimetrics::RequestKind;

    fn entry(method: &str, route: Option<&str>, status: u16) -> JournalEntry {
        serde_json::from_value(serde_json::json!({
            "seq": 1, "at": "2026-11-29T19:00:00Z", "method": method, "path": "/x", "route": route,
            "status": status, "session_token_fingerprint": null, "daemon_key_fingerprint": null,
            "bypass_ratelimit": null, "body": null,
        }))
        .expect("journal entry")
    }

    pub(crate) fn sample_scale(
        size: usize,
        per_cr: f64,
        all_ready_ms: Option<u64>,
        rss_kib: u64,
    ) -> ScaleResult {
        ScaleResult {
            size,
            ready: if all_ready_ms.is_some() {
                size
            } else {
                size / 2
            },
            not_ready: if all_ready_ms.is_some() {
                BTreeMap::new()
            } else {
                BTreeMap::from([(
                    "OperatorAccessReady=False OperatorAccessNotReady".to_owned(),
                    size - size / 2,
                )])
            },
            submit_ms: 10,
            all_ready_ms,
            latency: Latency {
                samples: size,
                p50_ms: Some(100),
                p95_ms: Some(200),
                max_ms: Some(300),
            },
            coderd: CoderdTraffic {
                total: (per_cr * size as f64) as u64,
                per_cr: Some(per_cr),
                key_calls: size as u64 * 2,
                entitlement_calls: 0,
                rate_limited: 0,
                keys_created: size as u64,
                by_route: BTreeMap::from([(
                    "POST /api/v2/organizations/{organization}/provisionerkeys".to_owned(),
                    size as u64,
                )]),
            },
            writes: ApiWrites::default(),
            api_requests_all_clients: 1000,
            api_requests_by_kind: BTreeMap::from([("GET secrets".to_owned(), 1000)]),
            operator: OperatorUse {
                peak_rss_kib: rss_kib,
                cpu_seconds: 1.5,
            },
            cpu: CpuBreakdown {
                wall_ms: all_ready_ms.unwrap_or(600_000) + 10_000,
                cpu_seconds: BTreeMap::from([
                    ("operator".to_owned(), 1.5),
                    ("kube-apiserver".to_owned(), 4.25),
                    ("etcd".to_owned(), 2.0),
                    ("kube-controller-manager".to_owned(), 0.25),
                    ("bench".to_owned(), size as f64 / 100.0),
                ]),
            },
        }
    }

    pub(crate) fn sample_report() -> BenchReport {
        BenchReport {
            schema: SCHEMA.to_owned(),
            started_at: "2026-11-29T19:00:00Z".to_owned(),
            duration_ms: 1000,
            environment: BenchEnvironment {
                implementation: "reference".to_owned(),
                profile: "debug".to_owned(),
                operator_build: "coder-provisioner-operator 0.1.0 (debug build)".to_owned(),
                operator_command: "op run".to_owned(),
                cpus: 2,
                load_average_at_start: None,
                simulated: vec![],
            },
            config: BenchConfig {
                phases: vec!["scale".to_owned()],
                sizes: vec![1, 500, 1000],
                namespaces: 10,
                control_planes: 2,
                idle_secs: 300,
                settle_secs: 10,
                steady_size: 500,
                churn_size: 100,
                fault_window_secs: 30,
                ready_timeout_secs: 600,
            },
            scale: vec![
                sample_scale(1, 3.0, Some(900), 20_000),
                sample_scale(500, 2.0, Some(20_000), 30_000),
                sample_scale(1000, 2.0, Some(70_000), 70_000),
            ],
            steady: None,
            restart: None,
            churn: None,
            suite: None,
            targets: vec![],
            methods: vec![],
            errors: vec![],
        }
    }

    #[test]
    fn traffic_is_counted_by_route_and_kind() {
        let journal = [
            entry("GET", Some(routes::ORGANIZATION), 200),
            entry("GET", Some(routes::PROVISIONER_KEYS), 200),
            entry("POST", Some(routes::PROVISIONER_KEYS), 429),
            entry("POST", Some(routes::PROVISIONER_KEYS), 201),
            entry("DELETE", Some(routes::DELETE_KEY), 204),
            entry("GET", Some(routes::ENTITLEMENTS), 200),
            entry("GET", None, 404),
        ];
        let traffic = CoderdTraffic::from_journal(&journal, 2);
        assert_eq!(traffic.total, 7);
        assert_eq!(traffic.per_cr, Some(3.5));
        assert_eq!(traffic.key_calls, 4);
        assert_eq!(traffic.entitlement_calls, 1);
        assert_eq!(traffic.rate_limited, 1);
        assert_eq!(traffic.keys_created, 1, "only the create answered 201");
        assert_eq!(
            traffic.by_route[&format!("POST {}", routes::PROVISIONER_KEYS)],
            2
        );
        assert_eq!(traffic.by_route["GET (unknown route)"], 1);
    }

    #[test]
    fn writes_single_out_cr_status() {
        let counts = WriteCounts::from([
            (RequestKind::new("PATCH", "coderprovisioners/status"), 3),
            (RequestKind::new("APPLY", "deployments"), 2),
        ]);
        let writes = ApiWrites::from_counts(&counts, 2);
        assert_eq!(
            (writes.total, writes.cr_status_writes, writes.per_cr),
            (5, 3, Some(2.5))
        );
        assert_eq!(writes.by_kind["APPLY deployments"], 2);
    }

    #[rstest]
    #[case(20, 300, 60)]
    #[case(20, 120, 20)]
    #[case(2, 10, 2)]
    #[case(2, 0, 2)]
    fn entitlement_allowance_counts_started_windows(
        #[case] objects: usize,
        #[case] idle: u64,
        #[case] allowed: u64,
    ) {
        assert_eq!(entitlement_allowance(objects, idle), allowed);
    }

    #[test]
    fn targets_report_met_missed_and_unmeasured() {
        let targets = evaluate_targets(&sample_report());
        let status = |prefix: &str| {
            targets
                .iter()
                .find(|t| t.target.starts_with(prefix))
                .map(|t| t.status)
        };
        assert_eq!(status("coderd requests per CR"), Some(TargetStatus::Met));
        assert_eq!(status("N = 1000 all Ready"), Some(TargetStatus::Missed));
        assert_eq!(status("operator peak RSS"), Some(TargetStatus::Missed));
        assert_eq!(status("steady state"), Some(TargetStatus::NotMeasured));
        assert_eq!(status("churn under 429s"), Some(TargetStatus::NotMeasured));
        assert_eq!(status("after restart"), Some(TargetStatus::NotMeasured));
    }

    #[test]
    fn churn_ratios_compare_faulted_with_healthy() {
        let healthy = ChurnRun::from(&sample_scale(100, 2.0, Some(10_000), 1));
        let faulted = ChurnRun::from(&sample_scale(100, 3.0, Some(25_000), 1));
        assert_eq!(
            ChurnResult::ratios(&faulted, &healthy),
            (Some(1.5), Some(2.5))
        );
        let stuck = ChurnRun::from(&sample_scale(100, 3.0, None, 1));
        assert_eq!(ChurnResult::ratios(&stuck, &healthy).1, None);
    }

    #[test]
    fn the_cpu_breakdown_keeps_processes_read_at_both_ends() {
        let start = BTreeMap::from([
            ("operator".to_owned(), 1.0),
            ("etcd".to_owned(), 5.0),
            ("bench".to_owned(), 2.0),
        ]);
        let end = BTreeMap::from([
            ("operator".to_owned(), 3.5),
            // A restarted process: its counter went back, which is never negative CPU.
            ("etcd".to_owned(), 0.5),
            ("kube-apiserver".to_owned(), 9.0),
        ]);
        let cpu = CpuBreakdown::between(&start, &end, 2_000);
        assert_eq!(
            cpu.cpu_seconds,
            BTreeMap::from([("etcd".to_owned(), 0.0), ("operator".to_owned(), 2.5)])
        );
        assert_eq!(cpu.total(), 2.5);
        assert_eq!(cpu.available(2), 4.0);
    }

    #[test]
    fn an_older_document_without_cpu_breakdowns_still_parses() {
        let mut value = serde_json::to_value(sample_report()).expect("json");
        for scale in value["scale"].as_array_mut().expect("scale") {
            scale.as_object_mut().expect("object").remove("cpu");
        }
        let back: BenchReport = serde_json::from_value(value).expect("deserialize");
        assert_eq!(back.scale[0].cpu, CpuBreakdown::default());
    }

    #[test]
    fn the_document_round_trips_through_json() {
        let mut report = sample_report();
        report.targets = evaluate_targets(&report);
        let json = serde_json::to_string_pretty(&report).expect("serialize");
        let back: BenchReport = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, report);
        let value: serde_json::Value = serde_json::from_str(&json).expect("json");
        assert_eq!(value["schema"], SCHEMA);
        assert_eq!(value["scale"][0]["latency"]["p95_ms"], 200);
        assert_eq!(value["targets"][0]["status"], "met");
        assert_eq!(
            value["scale"][0]["cpu"]["cpu_seconds"]["kube-apiserver"],
            4.25
        );
    }
}
