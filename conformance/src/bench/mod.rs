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
//! The operator is the reference operator or `--operator-cmd`; with `--compare` a second
//! implementation goes through the same phases in the same invocation, each phase and size run
//! for both back to back, alternating which goes first, so drift in the machine's load hits both.
//!
//! Results: a table on stdout and `bench.txt`, `bench.json` ([`model::BenchReport`], or
//! [`compare::Comparison`] with both reports) and `bench.svg` in the output folder.
pub mod apimetrics;
pub mod compare;
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

use self::harness::{BenchRun, Contender, FaultPlan, Launch, Setup};
use self::model::{
    BenchConfig, BenchEnvironment, BenchReport, ChurnResult, ChurnRun, RestartResult, SCHEMA,
    ScaleResult, SteadyResult,
};
use self::stats::millis;
use crate::run::args::ControlPlaneAccess;
use crate::shared_args::{StartedOperatorArgs, parse_duration};

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
    /// Also record a CPU profile of kube-apiserver over the first SECONDS of each scale size, to
    /// `kube-apiserver-N<size>.pprof` beside the results (read it with `go tool pprof -top`).
    #[arg(long, value_name = "SECONDS")]
    pub apiserver_profile: Option<u64>,
    #[command(flatten)]
    pub started: StartedOperatorArgs,
    /// Also measure this operator command line (run like --operator-cmd, with the same CRDs) and
    /// put the two side by side, with the ratio of its figures to the first's.
    #[arg(long, value_name = "COMMAND")]
    pub compare: Option<String>,
    /// RBAC manifests the --compare operator runs under (default: those of the first).
    #[arg(long, value_name = "DIR", requires = "compare")]
    pub compare_rbac: Option<PathBuf>,
    /// Name of the first operator in tables and folders (default: `reference`, or `operator`
    /// with --operator-cmd).
    #[arg(long)]
    pub name: Option<String>,
    /// Name of the --compare operator in tables and folders.
    #[arg(long, default_value = "compared")]
    pub compare_name: String,
    /// What the first operator may do to CoderControlPlanes, as `run --control-plane-access`:
    /// `read-only` runs it under its RBAC without write verbs on them (an operator that also
    /// reconciles control planes would otherwise rewrite the bench's).
    #[arg(long, value_enum, default_value_t = ControlPlaneAccess::ReadWrite)]
    pub control_plane_access: ControlPlaneAccess,
    /// The same for the --compare operator (default: the first's).
    #[arg(long, value_enum, requires = "compare")]
    pub compare_control_plane_access: Option<ControlPlaneAccess>,
    /// Manifests the first operator needs, applied before it starts, as `run --extra-manifests`.
    #[arg(long, value_name = "DIR")]
    pub extra_manifests: Option<PathBuf>,
    /// The same for the --compare operator (default: none).
    #[arg(long, value_name = "DIR", requires = "compare")]
    pub compare_extra_manifests: Option<PathBuf>,
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
        for (flag, dir) in [
            ("--compare-rbac", &self.compare_rbac),
            ("--extra-manifests", &self.extra_manifests),
            ("--compare-extra-manifests", &self.compare_extra_manifests),
        ] {
            if let Some(dir) = dir
                && !dir.is_dir()
            {
                bail!("{flag} {} is not a folder", dir.display());
            }
        }
        if self.compare.is_some()
            && folder_name(&self.first_name()) == folder_name(&self.compare_name)
        {
            bail!(
                "--name {:?} and --compare-name {:?} must differ: they name the two result folders",
                self.first_name(),
                self.compare_name
            );
        }
        Ok(())
    }

    fn first_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            if self.started.operator_cmd.is_some() {
                "operator"
            } else {
                "reference"
            }
            .to_owned()
        })
    }

    /// The implementations to measure: the first (reference or --operator-cmd), and --compare.
    /// Alone, its files go straight into `out`; side by side, each gets a folder named after it.
    async fn contenders(&self, out: &Path) -> anyhow::Result<Vec<Contender>> {
        let first = match &self.started.operator_cmd {
            Some(line) => Launch::Shell(line.clone()),
            None => Launch::Reference(crate::implementation::reference_operator_binary().await?),
        };
        let mut launches = vec![(
            self.first_name(),
            first,
            None,
            self.control_plane_access,
            self.extra_manifests.clone(),
        )];
        if let Some(line) = &self.compare {
            launches.push((
                self.compare_name.clone(),
                Launch::Shell(line.clone()),
                self.compare_rbac.clone(),
                self.compare_control_plane_access
                    .unwrap_or(self.control_plane_access),
                self.compare_extra_manifests.clone(),
            ));
        }
        let alone = launches.len() == 1;
        Ok(launches
            .into_iter()
            .map(|(name, launch, rbac, access, extra_manifests)| Contender {
                files: if alone {
                    out.to_path_buf()
                } else {
                    out.join(folder_name(&name))
                },
                name,
                launch,
                rbac,
                read_only: access == ControlPlaneAccess::ReadOnly,
                extra_manifests,
            })
            .collect())
    }

    fn wants(&self, phase: Phase) -> bool {
        self.phases.contains(&phase)
    }

    /// Steady and restart share a run of the steady size.
    fn wants_steady(&self) -> bool {
        self.wants(Phase::Steady) || self.wants(Phase::Restart)
    }
}

/// Plain-words description of every measurement, stored in the JSON next to the figures.
const METHODS: [&str; 11] = [
    "Every phase starts a fresh local control plane (etcd + kube-apiserver + GC/namespace controllers), \
     in-process fake coderds and the operator as a child process with the ServiceAccount of --operator-rbac \
     (default config/rbac).",
    "Operator start: measuring begins once /readyz at the operator's metrics address answers 200 (a command operator \
     is told the address in METRICS_ADDR); an operator that serves nothing there is measured from 10 s after its start.",
    "Time to Ready: a watch on CoderProvisioners records when each is first seen with status.phase Ready; \
     per-CR latency runs from sending its create request; 'all Ready' runs from the first create to the last Ready.",
    "Readiness is simulated (contract D-8): the suite's ReadinessSimulator sets Deployment status once the pod template could run.",
    "coderd requests: the fake coderds' journals over the phase, including a settle window after the last Ready.",
    "Kubernetes API writes: deltas of kube-apiserver's apiserver_request_total for POST/PUT/PATCH/APPLY/DELETE/DELETECOLLECTION, \
     without deployments/status (the readiness simulator), leases (kube-apiserver's own) and *reviews (not stored), \
     minus the bench's own CoderProvisioner creates; the counter has no user label, so attribution is by resource.",
    "Operator footprint: peak RSS is VmHWM of /proc/<pid>/status (whole process life); CPU is utime+stime of \
     /proc/<pid>/stat over the phase (for restart: the new process's whole life); both summed over the started \
     command's process tree (a --operator-cmd runs behind sh -c, whose own ~1 MiB is included).",
    "CPU by process (scale, restart): utime+stime of /proc/<pid>/stat over the phase for the operator, the local control \
     plane's kube-apiserver, etcd and kube-controller-manager (named by /proc/<pid>/comm) and the bench process itself \
     (fake coderds, readiness simulator, watches); their total can be compared with the phase's wall time × CPUs.",
    "Restart: 'reconciled again' is when the new process's coder_provisioner_operator_reconciles_total reaches the number of CRs \
     (its initial list queues every CR once); the counts include the settle window after that point. An operator without \
     that counter gets no time; its counts run from the SIGKILL to the end of the settle window after it is ready again.",
    "Side by side (--compare): each phase and size runs for both operators back to back on fresh control planes, \
     alternating which goes first; ratios are the second's figure divided by the first's.",
    "Churn: sticky 429 faults on GET/POST …/provisionerkeys and DELETE …/provisionerkeys/{name} are switched on and off every \
     --fault-toggle for --fault-window from the first create (fake-coderd faults carry no Retry-After header). \
     The fakes' coderd-like rate limiter (512/min per user and endpoint) is switched off in every phase.",
];

/// Runs the selected phases for every implementation and writes the results; a missed target is
/// reported, not an error. Fails only when no phase could be measured at all.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    args.validate()?;
    let started_at = jiff::Timestamp::now();
    let clock = Instant::now();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let out = args.out.canonicalize()?;
    // Holds the embedded CRDs and RBAC on disk for the whole bench.
    let inputs = args.started.inputs(None)?;
    let setup = Setup {
        binaries: crate::cluster::binaries::resolve().await?,
        crds: inputs.crds.clone(),
        rbac: inputs.rbac.clone(),
        namespaces: args.namespaces,
        control_planes: args.control_planes,
        ready_timeout: args.ready_timeout,
        settle: args.settle,
    };
    let contenders = args.contenders(&out).await?;
    let mut reports = Vec::with_capacity(contenders.len());
    for contender in &contenders {
        let build = contender.build().await;
        reports.push(empty_report(&args, contender, build, started_at));
    }
    let mut turns = Turns::new(contenders.len());

    let mut steady_attempted = vec![false; contenders.len()];
    if args.wants(Phase::Scale) {
        for &size in &args.sizes {
            for i in turns.next() {
                let steady_pending = args.wants_steady() && !steady_attempted[i];
                steady_attempted[i] |= scale_turn(
                    &args,
                    &setup,
                    &contenders[i],
                    size,
                    steady_pending,
                    &mut reports[i],
                )
                .await;
            }
        }
    }
    if args.wants_steady() {
        for i in turns.next() {
            if !steady_attempted[i] {
                steady_turn(&args, &setup, &contenders[i], &mut reports[i]).await;
            }
        }
    }
    if args.wants(Phase::Churn) {
        for i in turns.next() {
            eprintln!(
                "bench: churn N = {} with 429 faults for {:?} ({})",
                args.churn_size, args.fault_window, contenders[i].name
            );
            let outcome = churn(&args, &setup, &contenders[i], &reports[i].scale).await;
            reports[i].churn = record(&mut reports[i], "churn", outcome);
        }
    }
    if args.wants(Phase::Suite) {
        for i in turns.next() {
            eprintln!(
                "bench: timing a full `conformance run` of {} (output in {})",
                contenders[i].name,
                contenders[i].files.join(suite::LOG_FILE).display()
            );
            let outcome = suite::measure(&contenders[i], &args.started).await;
            reports[i].suite = record(&mut reports[i], "suite cost", outcome);
        }
    }

    let duration_ms = millis(clock.elapsed());
    for report in &mut reports {
        report.duration_ms = duration_ms;
        report.targets = model::evaluate_targets(report);
    }
    let measured = reports.iter().any(|report| {
        !report.scale.is_empty()
            || report.steady.is_some()
            || report.restart.is_some()
            || report.churn.is_some()
            || report.suite.is_some()
    });
    let errors: Vec<String> = reports.iter().flat_map(|r| r.errors.clone()).collect();
    let logs: Vec<String> = contenders
        .iter()
        .map(|c| c.files.join("logs").display().to_string())
        .collect();
    write_results(&out, reports, &logs)?;
    if !measured {
        bail!("no phase could be measured: {}", errors.join("; "));
    }
    Ok(())
}

/// Which implementation goes first in each phase or size: the order flips every turn (A B, B A,
/// A B …), so a drift in the machine's load does not always land on the same one.
struct Turns {
    contenders: usize,
    taken: usize,
}

impl Turns {
    fn new(contenders: usize) -> Self {
        Self {
            contenders,
            taken: 0,
        }
    }

    fn next(&mut self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.contenders).collect();
        if self.taken % 2 == 1 {
            order.reverse();
        }
        self.taken += 1;
        order
    }
}

/// One size of the scale phase for one implementation. With `steady_pending` and the steady
/// size, the run goes on into the steady and restart phases; returns whether it did.
async fn scale_turn(
    args: &BenchArgs,
    setup: &Setup,
    contender: &Contender,
    size: usize,
    steady_pending: bool,
    report: &mut BenchReport,
) -> bool {
    eprintln!("bench: scale N = {size} ({})", contender.name);
    let label = format!("scale N = {size}");
    let Some(mut run) = record(
        report,
        &label,
        BenchRun::start(setup, contender, &format!("scale-{size}")).await,
    ) else {
        return false;
    };
    let scale = match args.apiserver_profile {
        None => run.scale(size, None).await,
        Some(seconds) => {
            let file = contender
                .files
                .join(format!("kube-apiserver-N{size}.pprof"));
            let profile = harness::apiserver_profile(run.admin().clone(), seconds, file);
            let (scale, profiled) = tokio::join!(run.scale(size, None), profile);
            match profiled {
                Ok(file) => eprintln!("bench:   kube-apiserver profile: {}", file.display()),
                Err(e) => eprintln!("bench:   no kube-apiserver profile: {e:#}"),
            }
            scale
        }
    }
    .inspect(|(scale, _)| print_progress(scale));
    let follow_up = steady_pending && scale.is_ok() && size == args.steady_size;
    if follow_up {
        let outcome = steady_and_restart(args, setup, &mut run, report).await;
        record(report, "steady state / restart", outcome);
    }
    run.stop().await;
    if let Some((scale, _)) = record(report, &label, scale) {
        report.scale.push(scale);
    }
    follow_up
}

/// The steady and restart phases on a run of their own.
async fn steady_turn(
    args: &BenchArgs,
    setup: &Setup,
    contender: &Contender,
    report: &mut BenchReport,
) {
    eprintln!(
        "bench: steady state and restart with N = {} ({})",
        args.steady_size, contender.name
    );
    let label = format!("steady-{}", args.steady_size);
    if let Some(mut run) = record(
        report,
        "steady state / restart",
        BenchRun::start(setup, contender, &label).await,
    ) {
        let outcome = match run.scale(args.steady_size, None).await {
            Ok(_) => steady_and_restart(args, setup, &mut run, report).await,
            Err(e) => Err(e),
        };
        run.stop().await;
        record(report, "steady state / restart", outcome);
    }
}

/// The document before any phase ran: environment, configuration and methods.
fn empty_report(
    args: &BenchArgs,
    contender: &Contender,
    operator_build: String,
    started_at: jiff::Timestamp,
) -> BenchReport {
    BenchReport {
        schema: SCHEMA.to_owned(),
        started_at: started_at
            .round(jiff::Unit::Second)
            .unwrap_or(started_at)
            .to_string(),
        duration_ms: 0,
        environment: BenchEnvironment {
            implementation: contender.name.clone(),
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .to_owned(),
            operator_build,
            operator_command: contender.command_line(),
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
    contender: &Contender,
    scale: &[ScaleResult],
) -> anyhow::Result<ChurnResult> {
    let plan = FaultPlan {
        window: args.fault_window,
        toggle: args.fault_toggle,
    };
    let mut run = BenchRun::start(
        setup,
        contender,
        &format!("churn-{}-faulted", args.churn_size),
    )
    .await?;
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
            let mut run = BenchRun::start(
                setup,
                contender,
                &format!("churn-{}-healthy", args.churn_size),
            )
            .await?;
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

/// One implementation: its report, the table and the line chart of its scale phase. Side by
/// side: the comparison with both reports, its table followed by each report's, and its chart.
/// Side by side, a phase where either side did not bring every CR to Ready gets no ratio, and
/// the run fails after writing its results, saying which side and why (`logs`: each side's
/// log folder).
fn write_results(out: &Path, mut reports: Vec<BenchReport>, logs: &[String]) -> anyhow::Result<()> {
    let mut broken = Vec::new();
    let (json, text, chart) = if reports.len() == 1 {
        let report = reports.remove(0);
        (
            serde_json::to_string_pretty(&report)?,
            table::render(&report),
            svg::render_chart(&report.scale),
        )
    } else {
        let mut comparison = compare::compare(reports);
        broken = compare::withhold_broken_ratios(&mut comparison, logs);
        (
            serde_json::to_string_pretty(&comparison)?,
            compare::render(&comparison),
            svg::render_comparison(&comparison),
        )
    };
    print!("{text}");
    for (name, contents) in [
        ("bench.json", &json),
        ("bench.txt", &text),
        ("bench.svg", &chart),
    ] {
        let path = out.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("\nresults: {}", out.display());
    if !broken.is_empty() {
        bail!("the comparison is not valid:\n  {}", broken.join("\n  "));
    }
    Ok(())
}

/// A folder name for an implementation's name.
fn folder_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn bench_args(line: &[&str]) -> BenchArgs {
        let cli = Cli::try_parse_from(["conformance", "bench"].iter().chain(line))
            .expect("valid command line");
        match cli.command {
            Command::Bench(args) => *args,
            other => panic!("not bench: {other:?}"),
        }
    }

    #[test]
    fn the_two_implementations_take_turns_going_first() {
        let mut turns = Turns::new(2);
        let order: Vec<Vec<usize>> = (0..4).map(|_| turns.next()).collect();
        assert_eq!(order, [vec![0, 1], vec![1, 0], vec![0, 1], vec![1, 0]]);
        let mut alone = Turns::new(1);
        assert_eq!((alone.next(), alone.next()), (vec![0], vec![0]));
    }

    #[tokio::test]
    async fn side_by_side_each_implementation_gets_a_named_folder() {
        let args = bench_args(&[
            "--operator-cmd",
            "./mine run",
            "--compare",
            "env BUG=x ./naive run",
            "--compare-name",
            "naive build",
            "--compare-rbac",
            "/",
        ]);
        args.validate().expect("valid");
        let contenders = args
            .contenders(Path::new("/out"))
            .await
            .expect("contenders");
        let seen: Vec<(&str, &Launch, &Path, Option<&Path>)> = contenders
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    &c.launch,
                    c.files.as_path(),
                    c.rbac.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "operator",
                    &Launch::Shell("./mine run".to_owned()),
                    Path::new("/out/operator"),
                    None
                ),
                (
                    "naive build",
                    &Launch::Shell("env BUG=x ./naive run".to_owned()),
                    Path::new("/out/naive-build"),
                    Some(Path::new("/"))
                ),
            ]
        );
        let alone = bench_args(&["--operator-cmd", "./mine run", "--name", "mine"]);
        let contenders = alone
            .contenders(Path::new("/out"))
            .await
            .expect("contender");
        assert_eq!(contenders.len(), 1);
        assert_eq!(
            (contenders[0].name.as_str(), contenders[0].files.as_path()),
            ("mine", Path::new("/out"))
        );
    }

    #[test]
    fn two_implementations_with_one_folder_name_are_refused() {
        let args = bench_args(&["--compare", "./naive run", "--compare-name", "reference"]);
        let error = args.validate().expect_err("same names");
        assert!(error.to_string().contains("must differ"), "{error}");
    }

    #[test]
    fn bench_reads_the_operator_options_as_run_does() {
        let args = bench_args(&[
            "--operator-cmd",
            "./op",
            "--operator-rbac",
            "/rbac",
            "--crds",
            "/crds",
        ]);
        assert_eq!(
            (
                args.started.operator_cmd.as_deref(),
                args.started.operator_rbac.as_deref(),
                args.started.crds.as_deref()
            ),
            (
                Some("./op"),
                Some(Path::new("/rbac")),
                Some(Path::new("/crds"))
            )
        );
    }
}
