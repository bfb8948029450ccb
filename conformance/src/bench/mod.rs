//! `conformance bench`: how much work the operator does for how many CoderProvisioners, measured
//! on the local tier with in-process fake coderds, never asserted.
//!
//! Phases (each on a fresh control plane, fake coderds and operator process, so one phase's
//! objects never load another's operator):
//! - **scale**: N CRs over the namespaces and control planes, created at once; per-CR create →
//!   first seen Ready (watch), coderd requests by route (fake journal), Kubernetes API writes
//!   (kube-apiserver `apiserver_request_total` deltas, see [`apimetrics`]), operator peak RSS and
//!   CPU (`/proc`).
//! - **steady**: with the steady size Ready, idle: coderd requests and writes.
//! - **restart**: SIGKILL and start the operator: time until it has reconciled every CR again,
//!   coderd key calls and writes.
//! - **churn**: the churn size created while 429 faults on the key routes toggle, against the same
//!   run without faults.
//! - **suite**: wall time of a full `conformance run`.
//!
//! Results: a table on stdout and `bench.txt`, `bench.json` ([`model::BenchReport`]) and
//! `bench.svg` in the output folder.
pub mod apimetrics;
pub mod harness;
pub mod model;
pub mod procfs;
pub mod stats;
pub mod suite;
pub mod svg;
pub mod table;
pub mod watch;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::ValueEnum;

use self::harness::{BenchRun, FaultPlan, Setup};
use self::model::{
    BenchConfig, BenchEnvironment, BenchReport, ChurnResult, ChurnRun, RestartResult, SCHEMA,
    ScaleResult, SteadyResult,
};
use self::stats::millis;
use crate::cli::parse_duration;

/// Which measurements to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    Scale,
    Steady,
    Restart,
    Churn,
    Suite,
}

impl Phase {
    fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Numbers of CoderProvisioners for the scale phase.
    #[arg(long, value_delimiter = ',', default_value = "1,100,500,1000")]
    pub sizes: Vec<usize>,
    /// Phases to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "scale,steady,restart,churn,suite"
    )]
    pub phases: Vec<Phase>,
    /// Namespaces the CRs are spread over.
    #[arg(long, default_value_t = 10)]
    pub namespaces: usize,
    /// Fake coderds ("control planes"); every namespace gets a CoderControlPlane for each.
    #[arg(long, default_value_t = 2)]
    pub control_planes: usize,
    /// Number of Ready CRs for the steady and restart phases.
    #[arg(long, default_value_t = 500)]
    pub steady_size: usize,
    /// How long the steady phase watches an idle operator (`90s`, `5m`).
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub idle: Duration,
    /// Observation window after all CRs are Ready (scale, churn) or reconciled again (restart),
    /// included in their counts.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub settle: Duration,
    /// Number of CRs for the churn phase.
    #[arg(long, default_value_t = 100)]
    pub churn_size: usize,
    /// How long the 429 faults toggle in the churn phase.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub fault_window: Duration,
    /// Fault on for this long, then off for this long, and so on (50 % of the window).
    #[arg(long, value_parser = parse_duration, default_value = "500ms")]
    pub fault_toggle: Duration,
    /// Give up waiting for Ready (or for the reconciles after a restart) after this long.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub ready_timeout: Duration,
    /// Results folder (created; files in it are overwritten).
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
}

impl BenchArgs {
    fn validate(&self) -> anyhow::Result<()> {
        if self.sizes.is_empty() || self.sizes.contains(&0) {
            bail!("--sizes needs positive numbers, e.g. 1,100,500,1000");
        }
        if self.namespaces == 0
            || self.control_planes == 0
            || self.steady_size == 0
            || self.churn_size == 0
        {
            bail!(
                "--namespaces, --control-planes, --steady-size and --churn-size must be at least 1"
            );
        }
        if self.fault_toggle.is_zero() {
            bail!("--fault-toggle must be longer than 0");
        }
        Ok(())
    }

    fn wants(&self, phase: Phase) -> bool {
        self.phases.contains(&phase)
    }
}

/// Plain-words description of every measurement, stored in the JSON next to the figures.
const METHODS: [&str; 9] = [
    "Every phase starts a fresh local control plane (etcd + kube-apiserver + GC/namespace controllers), \
     in-process fake coderds and the operator as a child process with the ServiceAccount of config/rbac.",
    "Time to Ready: a watch on CoderProvisioners records when each is first seen with status.phase Ready; \
     per-CR latency runs from sending its create request; 'all Ready' runs from the first create to the last Ready.",
    "Readiness is simulated (contract D-8): the suite's ReadinessSimulator sets Deployment status once the pod template could run.",
    "coderd requests: the fake coderds' journals over the phase, including a settle window after the last Ready.",
    "Kubernetes API writes: deltas of kube-apiserver's apiserver_request_total for POST/PUT/PATCH/APPLY/DELETE/DELETECOLLECTION, \
     without deployments/status (the readiness simulator), leases (kube-apiserver's own) and *reviews (not stored), \
     minus the bench's own CoderProvisioner creates; the counter has no user label, so attribution is by resource.",
    "Operator footprint: peak RSS is VmHWM of /proc/<pid>/status (whole process life); CPU is utime+stime of \
     /proc/<pid>/stat over the phase (for restart: the new process's whole life).",
    "CPU by process (scale, restart): utime+stime of /proc/<pid>/stat over the phase for the operator, the local control \
     plane's kube-apiserver, etcd and kube-controller-manager (named by /proc/<pid>/comm) and the bench process itself \
     (fake coderds, readiness simulator, watches); their total can be compared with the phase's wall time × CPUs.",
    "Restart: 'reconciled again' is when the new process's coder_provisioner_operator_reconciles_total reaches the number of CRs \
     (its initial list queues every CR once); the counts include the settle window after that point.",
    "Churn: sticky 429 faults on GET/POST …/provisionerkeys and DELETE …/provisionerkeys/{name} are switched on and off every \
     --fault-toggle for --fault-window from the first create (fake-coderd faults carry no Retry-After header). \
     The fakes' coderd-like rate limiter (512/min per user and endpoint) is switched off in every phase.",
];

/// Runs the selected phases and writes the results; a missed target is reported, not an error.
/// Fails only when no phase could be measured at all.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    args.validate()?;
    let started_at = jiff::Timestamp::now();
    let clock = Instant::now();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let out = args.out.canonicalize()?;
    let binaries = crate::cluster::binaries::resolve().await?;
    let operator_binary = crate::implementation::reference_operator_binary().await?;
    let setup = Setup {
        binaries,
        operator_binary,
        repo: crate::cli::repo_root()
            .canonicalize()
            .context("locating the repository root")?,
        namespaces: args.namespaces,
        control_planes: args.control_planes,
        ready_timeout: args.ready_timeout,
        settle: args.settle,
        logs: out.join("logs"),
    };
    let mut report = empty_report(&args, &setup, started_at);

    let steady_wanted = args.wants(Phase::Steady) || args.wants(Phase::Restart);
    let mut steady_attempted = false;
    if args.wants(Phase::Scale) {
        for &size in &args.sizes {
            eprintln!("bench: scale N = {size}");
            let label = format!("scale N = {size}");
            let Some(mut run) = record(
                &mut report,
                &label,
                BenchRun::start(&setup, &format!("scale-{size}")).await,
            ) else {
                continue;
            };
            let scale = run
                .scale(size, None)
                .await
                .inspect(|(scale, _)| print_progress(scale));
            if scale.is_ok() && steady_wanted && !steady_attempted && size == args.steady_size {
                steady_attempted = true;
                let follow_up = steady_and_restart(&args, &setup, &mut run, &mut report).await;
                record(&mut report, "steady state / restart", follow_up);
            }
            run.stop().await;
            if let Some((scale, _)) = record(&mut report, &label, scale) {
                report.scale.push(scale);
            }
        }
    }
    if steady_wanted && !steady_attempted {
        eprintln!(
            "bench: steady state and restart with N = {}",
            args.steady_size
        );
        let label = format!("steady-{}", args.steady_size);
        if let Some(mut run) = record(
            &mut report,
            "steady state / restart",
            BenchRun::start(&setup, &label).await,
        ) {
            let outcome = match run.scale(args.steady_size, None).await {
                Ok(_) => steady_and_restart(&args, &setup, &mut run, &mut report).await,
                Err(e) => Err(e),
            };
            run.stop().await;
            record(&mut report, "steady state / restart", outcome);
        }
    }
    if args.wants(Phase::Churn) {
        eprintln!(
            "bench: churn N = {} with 429 faults for {:?}",
            args.churn_size, args.fault_window
        );
        let outcome = churn(&args, &setup, &report.scale).await;
        report.churn = record(&mut report, "churn", outcome);
    }
    if args.wants(Phase::Suite) {
        eprintln!(
            "bench: timing a full `conformance run` (output in {})",
            out.join("suite.log").display()
        );
        let outcome = suite::measure(&out).await;
        report.suite = record(&mut report, "suite cost", outcome);
    }

    report.duration_ms = millis(clock.elapsed());
    report.targets = model::evaluate_targets(&report);
    let text = table::render(&report);
    print!("{text}");
    write_results(&out, &report, &text)?;
    println!("\nresults: {}", out.display());
    let measured = !report.scale.is_empty()
        || report.steady.is_some()
        || report.restart.is_some()
        || report.churn.is_some()
        || report.suite.is_some();
    if !measured {
        bail!("no phase could be measured: {}", report.errors.join("; "));
    }
    Ok(())
}

/// The document before any phase ran: environment, configuration and methods.
fn empty_report(args: &BenchArgs, setup: &Setup, started_at: jiff::Timestamp) -> BenchReport {
    BenchReport {
        schema: SCHEMA.to_owned(),
        started_at: started_at
            .round(jiff::Unit::Second)
            .unwrap_or(started_at)
            .to_string(),
        duration_ms: 0,
        environment: BenchEnvironment {
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .to_owned(),
            operator_command: setup
                .operator_command(0)
                .display()
                .replace("127.0.0.1:0", "127.0.0.1:<port>"),
            cpus: std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(1),
            load_average_at_start: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .map(|l| l.trim().to_owned()),
            simulated: vec![
                "Deployment readiness (no kubelets on the local tier; contract D-8)".to_owned(),
                "coderd (in-process fake coderds)".to_owned(),
            ],
        },
        config: BenchConfig {
            phases: args.phases.iter().map(|p| p.name()).collect(),
            sizes: args.sizes.clone(),
            namespaces: args.namespaces,
            control_planes: args.control_planes,
            idle_secs: args.idle.as_secs(),
            settle_secs: args.settle.as_secs(),
            steady_size: args.steady_size,
            churn_size: args.churn_size,
            fault_window_secs: args.fault_window.as_secs(),
            ready_timeout_secs: args.ready_timeout.as_secs(),
        },
        scale: Vec::new(),
        steady: None,
        restart: None,
        churn: None,
        suite: None,
        targets: Vec::new(),
        methods: METHODS.map(str::to_owned).to_vec(),
        errors: Vec::new(),
    }
}

fn print_progress(scale: &ScaleResult) {
    eprintln!(
        "bench:   {}/{} Ready, all after {}, {} coderd requests per CR",
        scale.ready,
        scale.size,
        table::seconds(scale.all_ready_ms),
        table::ratio(scale.coderd.per_cr)
    );
}

/// Keeps a phase's result, or notes why it is missing (later phases still run).
fn record<T>(report: &mut BenchReport, phase: &str, outcome: anyhow::Result<T>) -> Option<T> {
    match outcome {
        Ok(value) => Some(value),
        Err(error) => {
            eprintln!("bench: {phase} could not be measured: {error:#}");
            report.errors.push(format!("{phase}: {error:#}"));
            None
        }
    }
}

/// Steady state, then restart, on a run whose CRs are all Ready.
async fn steady_and_restart(
    args: &BenchArgs,
    setup: &Setup,
    run: &mut BenchRun,
    report: &mut BenchReport,
) -> anyhow::Result<()> {
    let size = run.crs();
    if args.wants(Phase::Steady) {
        eprintln!("bench: steady state, idle for {:?}", args.idle);
        let delta = run.idle(args.idle).await?;
        report.steady = Some(SteadyResult {
            size,
            idle_ms: millis(delta.elapsed),
            coderd: delta.coderd,
            writes: delta.writes,
            api_requests_all_clients: delta.api_requests,
            cr_modifications: delta.modifications,
            ready_at_end: run.ready_now(),
            entitlement_allowance: model::entitlement_allowance(
                setup.control_plane_objects(),
                args.idle.as_secs(),
            ),
        });
    }
    if args.wants(Phase::Restart) {
        eprintln!("bench: restart (SIGKILL) the operator");
        let (reconciled, delta) = run.restart().await?;
        report.restart = Some(RestartResult {
            size,
            reconciled_ms: reconciled.map(millis),
            settle_ms: millis(setup.settle),
            coderd: delta.coderd,
            writes: delta.writes,
            api_requests_all_clients: delta.api_requests,
            cr_modifications: delta.modifications,
            ready_at_end: run.ready_now(),
            operator: delta.operator,
            cpu: delta.cpu,
        });
    }
    Ok(())
}

async fn churn(
    args: &BenchArgs,
    setup: &Setup,
    scale: &[ScaleResult],
) -> anyhow::Result<ChurnResult> {
    let plan = FaultPlan {
        window: args.fault_window,
        toggle: args.fault_toggle,
    };
    let mut run = BenchRun::start(setup, &format!("churn-{}-faulted", args.churn_size)).await?;
    let from = jiff::Timestamp::now();
    let faulted = run.scale(args.churn_size, Some(plan)).await;
    run.stop().await;
    let (faulted, delta) = faulted?;
    let to = from.checked_add(jiff::SignedDuration::try_from(args.fault_window)?)?;
    let share = harness::rate_limited_share(&delta.journal, from, to);
    // The healthy baseline is the scale run of the same size when there is one.
    let healthy = match scale.iter().find(|s| s.size == args.churn_size) {
        Some(same) => ChurnRun::from(same),
        None => {
            let mut run =
                BenchRun::start(setup, &format!("churn-{}-healthy", args.churn_size)).await?;
            let healthy = run.scale(args.churn_size, None).await;
            run.stop().await;
            ChurnRun::from(&healthy?.0)
        }
    };
    let faulted = ChurnRun::from(&faulted);
    let (requests_ratio, time_ratio) = ChurnResult::ratios(&faulted, &healthy);
    Ok(ChurnResult {
        size: args.churn_size,
        fault_window_ms: millis(args.fault_window),
        toggle_ms: millis(args.fault_toggle),
        rate_limited_share: share,
        faulted,
        healthy,
        requests_ratio,
        time_ratio,
    })
}

fn write_results(out: &Path, report: &BenchReport, text: &str) -> anyhow::Result<()> {
    let write = |name: &str, contents: &str| {
        let path = out.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))
    };
    write("bench.json", &serde_json::to_string_pretty(report)?)?;
    write("bench.txt", text)?;
    write("bench.svg", &svg::render_chart(&report.scale))
}
