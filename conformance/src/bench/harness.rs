//! One measured environment: a fresh local control plane, two in-process fake coderds (the two
//! "control planes" on the coderd side), a CoderControlPlane for each of them in every namespace,
//! the readiness stand-in (contract D-8), a watch on CoderProvisioners and the operator under
//! measurement ([`Contender`]) as a child process under the RBAC of `--operator-rbac`.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fake_coderd::{FakeCoderd, FaultKind, FaultSpec, JournalEntry, routes};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use super::apimetrics::{self, ApiScrape, RequestKind, WriteCounts};
use super::model::{ApiWrites, CoderdTraffic, CpuBreakdown, OperatorUse, ScaleResult};
use super::procfs::{self, Footprint};
use super::stats::{Latency, millis};
use super::watch::{Key, ProvisionerWatch};
use crate::cluster::local::{LocalControlPlane, LocalOptions};
use crate::crd_resources::{control_plane_resource, provisioner_resource};
use crate::implementation::{OperatorCommand, OperatorProcess, OperatorUnderTest};
use crate::kubelet::{ReadinessSimulator, WatchScope};

const FIELD_MANAGER: &str = "coder-provisioner-bench";
const POLL: Duration = Duration::from_millis(100);
const OPERATOR_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// An operator that serves no `/readyz` at its metrics address is measured from this long after
/// its start: nothing else tells when it has started watching.
const STARTUP_GRACE: Duration = Duration::from_secs(10);
/// Where a command operator is told to serve `/readyz` and `/metrics` (the reference operator
/// reads it too).
pub const METRICS_ADDR_ENV: &str = "METRICS_ADDR";
/// Create requests in flight at once: "created at once" without opening a thousand connections.
const CREATE_CONCURRENCY: usize = 32;
/// Operator counter that grows by one per finished reconcile (any result).
const RECONCILES_COUNTER: &str = "coder_provisioner_operator_reconciles_total";

/// What every run shares, whichever implementation it measures.
#[derive(Clone, Debug)]
pub struct Setup {
    pub binaries: PathBuf,
    /// CRDs installed on every control plane (`--crds`, else the suite's).
    pub crds: PathBuf,
    /// RBAC every operator runs under (`--operator-rbac`, else the suite's).
    pub rbac: PathBuf,
    pub namespaces: usize,
    pub control_planes: usize,
    pub ready_timeout: Duration,
    pub settle: Duration,
}

impl Setup {
    pub fn namespace(&self, index: usize) -> String {
        format!("bench-{index:02}")
    }

    /// The `index`-th CoderProvisioner: namespaces round-robin, then control planes.
    pub fn provisioner(&self, index: usize) -> (Key, String) {
        let namespace = self.namespace(index % self.namespaces);
        let control_plane = control_plane_name((index / self.namespaces) % self.control_planes);
        (
            (namespace, format!("provisioner-{index:05}")),
            control_plane,
        )
    }

    pub fn control_plane_objects(&self) -> usize {
        self.namespaces * self.control_planes
    }
}

/// How an implementation under measurement is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// The reference operator's binary, given its metrics address as a flag.
    Reference(PathBuf),
    /// A shell command line (`--operator-cmd`, `--compare`), started as `conformance run` starts
    /// it and told its metrics address in [`METRICS_ADDR_ENV`].
    Shell(String),
}

/// One implementation the bench measures.
#[derive(Clone, Debug)]
pub struct Contender {
    /// Its name in tables and file names.
    pub name: String,
    pub launch: Launch,
    /// Where its operator logs and suite report go.
    pub files: PathBuf,
    /// Its own RBAC folder (`--compare-rbac`); `None` = the bench's ([`Setup::rbac`]).
    pub rbac: Option<PathBuf>,
    /// Runs without write verbs on CoderControlPlanes (`--control-plane-access read-only`).
    pub read_only: bool,
    /// Applied before its operator starts (`--extra-manifests`).
    pub extra_manifests: Option<PathBuf>,
}

impl Contender {
    /// How its operator was built: the reference operator's `--version` names its profile; a
    /// command line is measured as given.
    pub async fn build(&self) -> String {
        let Launch::Reference(binary) = &self.launch else {
            return "as given".to_owned();
        };
        match tokio::process::Command::new(binary)
            .arg("--version")
            .output()
            .await
        {
            Ok(out) if out.status.success() => {
                String::from_utf8_lossy(&out.stdout).trim().to_owned()
            }
            Ok(out) => format!("unknown (`{} --version`: {})", binary.display(), out.status),
            Err(error) => format!("unknown (`{} --version`: {error})", binary.display()),
        }
    }

    /// The operator with `/readyz` and `/metrics` on `127.0.0.1:port`, under `rbac`.
    pub fn operator(&self, port: u16, rbac: &Path) -> anyhow::Result<OperatorUnderTest> {
        let address = format!("127.0.0.1:{port}");
        let (command, extra_env) = match &self.launch {
            Launch::Reference(binary) => (reference_command(binary, &address), Vec::new()),
            Launch::Shell(line) => (
                OperatorCommand::from_shell(line)?,
                vec![(METRICS_ADDR_ENV.to_owned(), address)],
            ),
        };
        let mut spec = OperatorUnderTest::new(command);
        spec.rbac_dir = rbac.to_path_buf();
        spec.extra_env = extra_env;
        Ok(spec)
    }

    /// The command line for reports: the port left open, secrets masked.
    pub fn command_line(&self) -> String {
        const ADDRESS: &str = "127.0.0.1:<port>";
        match &self.launch {
            Launch::Reference(binary) => reference_command(binary, ADDRESS).display(),
            Launch::Shell(line) => format!(
                "{METRICS_ADDR_ENV}={ADDRESS} {}",
                crate::setup::mask_secrets(line)
            ),
        }
    }
}

fn reference_command(binary: &Path, metrics_address: &str) -> OperatorCommand {
    OperatorCommand {
        program: binary.display().to_string(),
        args: [
            "run",
            "--leader-election=false",
            "--metrics-addr",
            metrics_address,
            "--log-format",
            "text",
        ]
        .map(str::to_owned)
        .to_vec(),
    }
}

pub fn control_plane_name(index: usize) -> String {
    format!("coderd-{index}")
}

fn token_secret_name(index: usize) -> String {
    format!("coderd-{index}-operator-token")
}

/// Records kube-apiserver's CPU profile over the next `seconds` (Go's pprof format) to `file`.
pub async fn apiserver_profile(
    admin: kube::Client,
    seconds: u64,
    file: PathBuf,
) -> anyhow::Result<PathBuf> {
    use futures::AsyncReadExt as _;
    let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
        .body(Vec::new())
        .context("building the profile request")?;
    let mut profile = Vec::new();
    admin
        .request_stream(request)
        .await
        .context("asking kube-apiserver for a CPU profile")?
        .read_to_end(&mut profile)
        .await
        .context("reading kube-apiserver's CPU profile")?;
    std::fs::write(&file, profile).with_context(|| format!("writing {}", file.display()))?;
    Ok(file)
}

/// A point in time to measure a phase from.
pub struct Mark {
    api: ApiScrape,
    footprint: Footprint,
    /// CPU seconds since start, by process (see [`BenchRun::cpu_readings`]).
    cpu: BTreeMap<String, f64>,
    modifications: u64,
    at: Instant,
}

/// What happened between a [`Mark`] and now.
pub struct Delta {
    pub coderd: CoderdTraffic,
    pub journal: Vec<JournalEntry>,
    pub writes: ApiWrites,
    /// kube-apiserver requests from every client (operator, simulator, bench, controllers).
    pub api_requests: u64,
    /// The same by kind (`GET secrets`), labelled.
    pub api_requests_by_kind: BTreeMap<String, u64>,
    pub operator: OperatorUse,
    pub footprint: Footprint,
    /// CPU seconds by process over the phase, with its wall time.
    pub cpu: CpuBreakdown,
    pub modifications: u64,
    pub elapsed: Duration,
}

/// A fault switched on and off while the CRs are created.
#[derive(Clone, Copy, Debug)]
pub struct FaultPlan {
    pub window: Duration,
    pub toggle: Duration,
}

pub struct BenchRun {
    setup: Setup,
    // Field order is drop order: the operator stops before the cluster it talks to.
    operator: OperatorProcess,
    watch: ProvisionerWatch,
    simulator: ReadinessSimulator,
    fakes: Vec<FakeCoderd>,
    admin: kube::Client,
    cluster: LocalControlPlane,
    metrics_url: String,
    http: reqwest::Client,
    keys: Vec<Key>,
}

impl BenchRun {
    pub async fn start(setup: &Setup, contender: &Contender, label: &str) -> anyhow::Result<Self> {
        let options = LocalOptions {
            binaries_dir: Some(setup.binaries.clone()),
            audit: false,
            profiling: true,
            ..LocalOptions::default()
        };
        let cluster = LocalControlPlane::start(options)
            .await
            .context("starting the local control plane")?;
        let admin = cluster.admin_client().await?;
        let crds = crate::manifests::install_crds(&admin, &setup.crds).await?;
        crate::manifests::wait_crds_established(&admin, &crds, Duration::from_secs(60)).await?;
        let mut fakes = Vec::new();
        for _ in 0..setup.control_planes {
            let fake = FakeCoderd::start()
                .await
                .context("starting a fake coderd")?;
            // The fake limits like coderd (512/min per user and endpoint); the bench measures the
            // operator, not coderd's limiter, so its figures stay comparable with earlier runs.
            fake.set_rate_limit(Some(fake_coderd::RateLimitSpec::Off));
            fakes.push(fake);
        }
        for n in 0..setup.namespaces {
            create_namespace_fixture(&admin, &setup.namespace(n), &fakes).await?;
        }
        let simulator = ReadinessSimulator::start(admin.clone(), WatchScope::AllNamespaces).await?;
        let watch = ProvisionerWatch::start(admin.clone());
        if let Some(dir) = &contender.extra_manifests {
            crate::setup::apply_extra_manifests(&admin, dir, setup.ready_timeout).await?;
        }
        let mut rbac = contender.rbac.clone().unwrap_or_else(|| setup.rbac.clone());
        if contender.read_only {
            rbac = crate::fixture_guard::write_read_only_rbac(&rbac, &contender.files)?;
        }
        let port = free_port()?;
        let mut spec = contender.operator(port, &rbac)?;
        spec.work_dir = Some(contender.files.join("logs").join(label));
        let operator = OperatorProcess::start(&admin, cluster.endpoint(), spec).await?;
        let mut run = Self {
            setup: setup.clone(),
            operator,
            watch,
            simulator,
            fakes,
            admin,
            cluster,
            metrics_url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            keys: Vec::new(),
        };
        run.wait_operator_ready().await?;
        run.wait_watch_synced().await?;
        run.warm_up_create_path().await?;
        Ok(run)
    }

    pub fn ready_now(&self) -> usize {
        self.watch.ready_now()
    }

    pub async fn mark(&self) -> anyhow::Result<Mark> {
        for fake in &self.fakes {
            fake.clear_journal();
        }
        Ok(Mark {
            api: apimetrics::scrape(&self.admin).await?,
            footprint: self.footprint()?,
            modifications: self.watch.modifications(),
            cpu: self.cpu_readings(),
            at: Instant::now(),
        })
    }

    /// Everything since `mark`; `bench_writes` are the API writes the bench itself made.
    pub async fn delta(
        &self,
        mark: &Mark,
        bench_writes: &WriteCounts,
        crs: usize,
    ) -> anyhow::Result<Delta> {
        let journal: Vec<JournalEntry> = self.fakes.iter().flat_map(FakeCoderd::journal).collect();
        let after = apimetrics::scrape(&self.admin).await?;
        let footprint = self.footprint()?;
        let cpu = self.cpu_readings();
        let elapsed = mark.at.elapsed();
        Ok(Delta {
            coderd: CoderdTraffic::from_journal(&journal, crs),
            journal,
            writes: ApiWrites::from_counts(
                &apimetrics::operator_writes(&mark.api.writes, &after.writes, bench_writes),
                crs,
            ),
            api_requests: after
                .total_requests()
                .saturating_sub(mark.api.total_requests()),
            api_requests_by_kind: apimetrics::increase(&mark.api.requests, &after.requests)
                .iter()
                .map(|(kind, n)| (kind.label(), *n))
                .collect(),
            operator: OperatorUse::between(mark.footprint, footprint),
            footprint,
            cpu: CpuBreakdown::between(&mark.cpu, &cpu, millis(elapsed)),
            modifications: self
                .watch
                .modifications()
                .saturating_sub(mark.modifications),
            elapsed,
        })
    }

    /// CPU seconds since start of the operator, the local control plane's processes (named by
    /// `/proc/<pid>/comm`) and this process; one that cannot be read is left out.
    fn cpu_readings(&self) -> BTreeMap<String, f64> {
        let mut readings = BTreeMap::new();
        if let Ok(operator) = self.footprint() {
            readings.insert("operator".to_owned(), operator.cpu_seconds);
        }
        for pid in self.cluster.child_pids() {
            if let (Some(name), Some(seconds)) = (
                procfs::read_process_name(pid),
                procfs::read_cpu_seconds(pid),
            ) {
                *readings.entry(name).or_default() += seconds;
            }
        }
        if let Some(seconds) = procfs::read_cpu_seconds(std::process::id()) {
            readings.insert("bench".to_owned(), seconds);
        }
        readings
    }

    /// The started command's whole process tree: a `--operator-cmd` runs behind `sh -c`.
    fn footprint(&self) -> anyhow::Result<Footprint> {
        let pid = self.operator.pid().context("the operator is not running")?;
        Footprint::read_tree(pid).with_context(|| format!("reading /proc/{pid} of the operator"))
    }

    /// The control plane's admin client.
    pub fn admin(&self) -> &kube::Client {
        &self.admin
    }

    /// Creates `size` CoderProvisioners at once and waits (up to the ready timeout) until each has
    /// been seen Ready; counts include a settle window after the last one.
    pub async fn scale(
        &mut self,
        size: usize,
        faults: Option<FaultPlan>,
    ) -> anyhow::Result<(ScaleResult, Delta)> {
        let mark = self.mark().await?;
        let toggler = faults.map(|plan| {
            tokio::spawn(toggle_faults(
                self.fakes.iter().map(FakeCoderd::admin).collect(),
                plan,
            ))
        });
        let started = Instant::now();
        let sent = match self.create_provisioners(size).await {
            Ok(sent) => sent,
            Err(e) => {
                toggler.iter().for_each(tokio::task::JoinHandle::abort);
                return Err(e);
            }
        };
        let submit = started.elapsed();
        let keys: Vec<Key> = sent.iter().map(|(k, _)| k.clone()).collect();
        let deadline = started + self.setup.ready_timeout;
        while self.watch.ever_ready(&keys) < keys.len() && Instant::now() < deadline {
            self.check_operator_running()?;
            tokio::time::sleep(POLL).await;
        }
        let ready = self.watch.ever_ready(&keys);
        let not_ready = self.watch.not_ready(&keys);
        let readies: Vec<(Instant, Instant)> = sent
            .iter()
            .filter_map(|(key, at)| self.watch.first_ready(key).map(|r| (*at, r)))
            .collect();
        let latencies: Vec<Duration> = readies
            .iter()
            .map(|(sent, ready)| ready.saturating_duration_since(*sent))
            .collect();
        let all_ready_ms = (ready == size)
            .then(|| {
                readies
                    .iter()
                    .map(|(_, r)| r.saturating_duration_since(started))
                    .max()
            })
            .flatten()
            .map(millis);
        if let Some(toggler) = toggler {
            // Faults must be off before the settle window, even if the window was longer than the run.
            toggler.await.context("the fault toggler panicked")??;
        }
        self.settle().await?;
        let bench_writes =
            WriteCounts::from([(RequestKind::new("POST", "coderprovisioners"), size as u64)]);
        let delta = self.delta(&mark, &bench_writes, size).await?;
        self.keys.extend(keys);
        let result = ScaleResult {
            size,
            ready,
            not_ready,
            submit_ms: millis(submit),
            all_ready_ms,
            latency: Latency::of(&latencies),
            coderd: delta.coderd.clone(),
            writes: delta.writes.clone(),
            api_requests_all_clients: delta.api_requests,
            api_requests_by_kind: delta.api_requests_by_kind.clone(),
            operator: OperatorUse {
                peak_rss_kib: delta.footprint.peak_rss_kib,
                cpu_seconds: delta.operator.cpu_seconds,
            },
            cpu: delta.cpu.clone(),
        };
        Ok((result, delta))
    }

    /// Observes for the settle window (the measured quiet period, not a wait for a condition).
    pub async fn settle(&mut self) -> anyhow::Result<()> {
        tokio::time::sleep(self.setup.settle).await;
        self.check_operator_running()
    }

    /// Observes an idle operator for `idle`.
    pub async fn idle(&mut self, idle: Duration) -> anyhow::Result<Delta> {
        let mark = self.mark().await?;
        tokio::time::sleep(idle).await;
        self.check_operator_running()?;
        self.delta(&mark, &WriteCounts::new(), self.keys.len())
            .await
    }

    /// SIGKILLs the operator, starts it again and waits until the new process has finished as
    /// many reconciles as there are CRs (its initial list queues each CR once), then observes
    /// the settle window. Returns the time to that point and the counts including the window.
    /// An operator without that counter (another implementation) is observed from when it is
    /// ready again, and the time is `None`.
    pub async fn restart(&mut self) -> anyhow::Result<(Option<Duration>, Delta)> {
        let counts_reconciles = self.reconciles().await.is_some();
        let mark = self.mark().await?;
        let killed = Instant::now();
        self.operator.kill().await;
        self.operator.restart().await?;
        let reconciled = if counts_reconciles {
            self.wait_reconciled(killed).await?
        } else {
            self.wait_operator_ready().await?;
            None
        };
        self.settle().await?;
        let mut delta = self
            .delta(&mark, &WriteCounts::new(), self.keys.len())
            .await?;
        // A new process: its whole CPU time and peak belong to this phase.
        delta.operator = OperatorUse::between(Footprint::default(), delta.footprint);
        delta
            .cpu
            .cpu_seconds
            .insert("operator".to_owned(), delta.operator.cpu_seconds);
        Ok((reconciled, delta))
    }

    pub fn crs(&self) -> usize {
        self.keys.len()
    }

    pub async fn stop(self) {
        let Self {
            mut operator,
            simulator,
            cluster,
            ..
        } = self;
        operator.stop().await;
        simulator.stop().await;
        cluster.stop().await;
    }

    /// Time from `killed` until the new process has finished a reconcile per CR; `None` if it
    /// did not within the ready timeout.
    async fn wait_reconciled(&mut self, killed: Instant) -> anyhow::Result<Option<Duration>> {
        let deadline = killed + self.setup.ready_timeout;
        while Instant::now() < deadline {
            self.check_operator_running()?;
            if self
                .reconciles()
                .await
                .is_some_and(|n| n >= self.keys.len() as f64)
            {
                return Ok(Some(killed.elapsed()));
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(None)
    }

    /// The operator's [`RECONCILES_COUNTER`]; `None` while it is not served, and always for an
    /// operator that has no such counter.
    async fn reconciles(&self) -> Option<f64> {
        let response = self
            .http
            .get(format!("{}/metrics", self.metrics_url))
            .send()
            .await
            .ok()?;
        let text = response.error_for_status().ok()?.text().await.ok()?;
        apimetrics::counter_sum(&text, RECONCILES_COUNTER)
    }

    fn check_operator_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.operator.exit_status() {
            bail!(
                "the operator exited ({status}); the end of its log:\n{}",
                self.operator.log_tail(20)
            );
        }
        if !self.watch.is_running() || !self.simulator.is_running() {
            bail!("the bench's CoderProvisioner watch or the readiness simulator stopped");
        }
        Ok(())
    }

    /// Until `/readyz` at the metrics address answers 200; when nothing is served there (no
    /// answer, or 404), until [`STARTUP_GRACE`] after the start.
    async fn wait_operator_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let deadline = started + OPERATOR_READY_TIMEOUT;
        let url = format!("{}/readyz", self.metrics_url);
        loop {
            self.check_operator_running()?;
            let served = match self.http.get(&url).send().await {
                Ok(response) if response.status().is_success() => return Ok(()),
                Ok(response) => response.status() != reqwest::StatusCode::NOT_FOUND,
                Err(_) => false,
            };
            if !served && started.elapsed() >= STARTUP_GRACE {
                eprintln!(
                    "bench:   nothing answers {url}: measuring from {} s after the operator started",
                    STARTUP_GRACE.as_secs()
                );
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the operator's {url} did not answer 200 in time; its log:\n{}",
                    self.operator.log_tail(20)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_watch_synced(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + OPERATOR_READY_TIMEOUT;
        while !self.watch.is_synced() {
            if Instant::now() >= deadline {
                bail!("the bench's CoderProvisioner watch did not sync in time");
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// Sends the creates for CRs `self.keys.len()..+size`, returning when each was sent.
    async fn create_provisioners(&self, size: usize) -> anyhow::Result<Vec<(Key, Instant)>> {
        let first = self.keys.len();
        let results: Vec<anyhow::Result<(Key, Instant)>> =
            futures::stream::iter(first..first + size)
                .map(|index| async move {
                    let ((namespace, name), api, object) = self.provisioner_object(index)?;
                    let at = Instant::now();
                    api.create(&PostParams::default(), &object)
                        .await
                        .with_context(|| format!("creating CoderProvisioner {namespace}/{name}"))?;
                    Ok(((namespace, name), at))
                })
                .buffer_unordered(CREATE_CONCURRENCY)
                .collect()
                .await;
        results.into_iter().collect()
    }

    /// A server-side dry-run create before any timed one: kube-apiserver prepares a new CRD's
    /// create path on first use (about 2 s here), which would otherwise land on the first CR's
    /// time to Ready although the operator has no part in it.
    async fn warm_up_create_path(&self) -> anyhow::Result<()> {
        let (_, api, object) = self.provisioner_object(0)?;
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        api.create(&dry_run, &object)
            .await
            .context("dry-run create of a CoderProvisioner")?;
        Ok(())
    }

    fn provisioner_object(
        &self,
        index: usize,
    ) -> anyhow::Result<(Key, Api<DynamicObject>, DynamicObject)> {
        let ((namespace, name), control_plane) = self.setup.provisioner(index);
        let api = Api::namespaced_with(self.admin.clone(), &namespace, &provisioner_resource());
        let object = serde_json::from_value(json!({
            "apiVersion": "coder.com/v1alpha1",
            "kind": "CoderProvisioner",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"controlPlaneRef": {"name": control_plane}, "replicas": 1, "tags": {"scope": "organization"}},
        }))?;
        Ok(((namespace, name), api, object))
    }
}

/// A namespace with, for each fake coderd, its operator token Secret and a Ready
/// CoderControlPlane pointing at it (a fresh `entitled` check, as the suite's fixture writes).
async fn create_namespace_fixture(
    admin: &kube::Client,
    namespace: &str,
    fakes: &[FakeCoderd],
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let object: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
    namespaces
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating namespace {namespace}"))?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), namespace);
    let control_planes: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), namespace, &control_plane_resource());
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    for (index, fake) in fakes.iter().enumerate() {
        let secret_name = token_secret_name(index);
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret_name, "namespace": namespace},
            "type": "Opaque",
            "stringData": {"token": fake.operator_token()},
        });
        secrets
            .patch(&secret_name, &apply, &Patch::Apply(&secret))
            .await
            .context("writing an operator token Secret")?;
        let name = control_plane_name(index);
        let control_plane = json!({
            "apiVersion": "coder.com/v1alpha1", "kind": "CoderControlPlane",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {},
        });
        control_planes
            .patch(&name, &apply, &Patch::Apply(&control_plane))
            .await
            .context("creating a CoderControlPlane")?;
        let status = json!({"status": {
            "phase": "Ready",
            "url": fake.url(),
            "operatorAccessReady": true,
            "operatorTokenSecretRef": {"name": secret_name, "key": "token"},
            "externalProvisionerDaemonsEntitlement": "entitled",
            "entitlementsLastChecked": crate::steps::fixture::now_rfc3339(),
        }});
        control_planes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .context("writing a CoderControlPlane status")?;
    }
    Ok(())
}

/// The provisioner-key routes a 429 fault is put on.
fn key_faults() -> [FaultSpec; 3] {
    let rate_limited = |method: &str, route: &str| FaultSpec {
        method: method.to_owned(),
        route: route.to_owned(),
        kind: FaultKind::Status {
            status: 429,
            body: Some(
                json!({"message": "You've been rate limited for sending more than 512 requests in 1m0s."}),
            ),
        },
        times: None,
        apply_then_fail: false,
        session_token_fingerprint: None,
        key_organization: None,
        after: None,
    };
    [
        rate_limited("GET", routes::PROVISIONER_KEYS),
        rate_limited("POST", routes::PROVISIONER_KEYS),
        rate_limited("DELETE", routes::DELETE_KEY),
    ]
}

/// Switches sticky 429 faults on the key routes on and off every `plan.toggle` for
/// `plan.window`, then leaves them off.
async fn toggle_faults(
    admins: Vec<fake_coderd::AdminClient>,
    plan: FaultPlan,
) -> anyhow::Result<()> {
    let end = Instant::now() + plan.window;
    let mut on = false;
    while Instant::now() < end {
        on = !on;
        for admin in &admins {
            if on {
                for fault in key_faults() {
                    admin.inject_fault(fault).await?;
                }
            } else {
                admin.clear_faults().await?;
            }
        }
        tokio::time::sleep(
            plan.toggle
                .min(end.saturating_duration_since(Instant::now())),
        )
        .await;
    }
    for admin in &admins {
        admin.clear_faults().await?;
    }
    Ok(())
}

/// Share of provisioner-key requests answered 429 between `from` and `to` (journal times).
pub fn rate_limited_share(
    journal: &[JournalEntry],
    from: jiff::Timestamp,
    to: jiff::Timestamp,
) -> Option<f64> {
    let in_window: Vec<&JournalEntry> = journal
        .iter()
        .filter(|e| {
            matches!(
                e.route.as_deref(),
                Some(routes::PROVISIONER_KEYS | routes::DELETE_KEY)
            )
        })
        .filter(|e| {
            e.at.parse::<jiff::Timestamp>()
                .is_ok_and(|at| at >= from && at <= to)
        })
        .collect();
    let limited = in_window.iter().filter(|e| e.status == 429).count();
    super::stats::per(limited as u64, in_window.len())
}

fn free_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup {
        Setup {
            binaries: PathBuf::new(),
            crds: PathBuf::new(),
            rbac: PathBuf::from("/rbac"),
            namespaces: 10,
            control_planes: 2,
            ready_timeout: Duration::from_secs(1),
            settle: Duration::ZERO,
        }
    }

    fn contender(launch: Launch) -> Contender {
        Contender {
            name: "x".to_owned(),
            launch,
            files: PathBuf::new(),
            rbac: None,
            read_only: false,
            extra_manifests: None,
        }
    }

    #[test]
    fn provisioners_spread_over_namespaces_then_control_planes() {
        let setup = setup();
        let placed: Vec<(String, String)> = [0, 1, 9, 10, 19, 20]
            .iter()
            .map(|i| {
                let ((namespace, _), control_plane) = setup.provisioner(*i);
                (namespace, control_plane)
            })
            .collect();
        let expected = [
            ("bench-00", "coderd-0"),
            ("bench-01", "coderd-0"),
            ("bench-09", "coderd-0"),
            ("bench-00", "coderd-1"),
            ("bench-09", "coderd-1"),
            ("bench-00", "coderd-0"),
        ];
        assert_eq!(placed, expected.map(|(n, c)| (n.to_owned(), c.to_owned())));
        assert_eq!(setup.provisioner(7).0.1, "provisioner-00007");
        assert_eq!(setup.control_plane_objects(), 20);
    }

    #[test]
    fn the_reference_operator_gets_a_fixed_metrics_port_as_a_flag() {
        let reference = contender(Launch::Reference(PathBuf::from("/bin/op")));
        let spec = reference.operator(4242, &setup().rbac).expect("spec");
        assert_eq!(spec.command.program, "/bin/op");
        assert!(
            spec.command
                .args
                .windows(2)
                .any(|w| w == ["--metrics-addr", "127.0.0.1:4242"])
        );
        assert_eq!(spec.rbac_dir, PathBuf::from("/rbac"));
        assert!(
            reference
                .command_line()
                .ends_with("--metrics-addr 127.0.0.1:<port> --log-format text")
        );
    }

    #[test]
    fn a_command_operator_runs_through_the_shell_and_learns_its_metrics_address() {
        let command = contender(Launch::Shell("./op --token s3cr3t run".to_owned()));
        let spec = command.operator(4242, &setup().rbac).expect("spec");
        assert_eq!(
            spec.command,
            OperatorCommand::from_shell("./op --token s3cr3t run").expect("command")
        );
        assert_eq!(
            spec.extra_env,
            [(METRICS_ADDR_ENV.to_owned(), "127.0.0.1:4242".to_owned())]
        );
        let shown = command.command_line();
        assert!(
            shown.starts_with("METRICS_ADDR=127.0.0.1:<port> ./op"),
            "{shown}"
        );
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }

    fn entry(at: &str, route: &str, status: u16) -> JournalEntry {
        serde_json::from_value(json!({
            "seq": 1, "at": at, "method": "POST", "path": "/x", "route": route, "status": status,
            "session_token_fingerprint": null, "daemon_key_fingerprint": null, "bypass_ratelimit": null, "body": null,
        }))
        .expect("entry")
    }

    #[test]
    fn the_rate_limited_share_counts_key_requests_inside_the_window() {
        let journal = [
            entry("2026-11-29T19:00:01Z", routes::PROVISIONER_KEYS, 429),
            entry("2026-11-29T19:00:02Z", routes::PROVISIONER_KEYS, 201),
            entry("2026-11-29T19:00:03Z", routes::DELETE_KEY, 429),
            entry("2026-11-29T19:00:04Z", routes::ORGANIZATION, 429),
            entry("2026-11-29T19:00:09Z", routes::PROVISIONER_KEYS, 201),
        ];
        let from: jiff::Timestamp = "2026-11-29T19:00:00Z".parse().expect("ts");
        let to: jiff::Timestamp = "2026-11-29T19:00:05Z".parse().expect("ts");
        let share = rate_limited_share(&journal, from, to).expect("share");
        assert!((share - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(rate_limited_share(&[], from, to), None);
    }
}
