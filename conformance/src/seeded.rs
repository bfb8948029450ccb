//! Seeded bugs: proves the suite can fail.
//!
//! The reference operator built with its `seeded-bugs` feature carries deliberately broken
//! variants, one active at a time, selected by [`SEEDED_BUG_ENV`]. This runner runs the suite
//! against each variant — only the scenarios tagged with the rules that variant breaks — and
//! against the unbroken operator on the union of those tags. A variant is *caught* when at least
//! one scenario fails for it while the unbroken operator passes every selected scenario; a
//! variant with no failing scenario is *MISSED*, and the run fails. A variant that writes the
//! control plane ([`Breakage::ControlPlaneWriter`]) breaks the suite's fixture, not a rule: it is
//! caught when the fixture guard stops its run, and the same variant under
//! `--control-plane-access read-only` must pass every selected scenario.
//!
//! [`VARIANTS`] is the one table of variants: name, how it is made, and the rule ids it breaks
//! (which are also the tags that select its scenarios).
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context as _, anyhow, bail};
use clap::Args;
use futures::StreamExt as _;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::fixture_guard::is_fixture_change;
use crate::implementation::{REFERENCE_BINARY, REFERENCE_BINARY_ENV, reference_operator_binary};
use crate::report::model::{ConformanceReport, Status};

/// The environment variable a `seeded-bugs` build of the reference operator reads.
pub const SEEDED_BUG_ENV: &str = "CODER_OPERATOR_SEEDED_BUG";

/// How a variant is produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breakage {
    /// The seeded-bugs build with [`SEEDED_BUG_ENV`] set to the variant's name.
    Code,
    /// The unbroken operator under `config/rbac/` minus the pod and PVC verbs (the PR's first
    /// bug: creating the provisioner's Role is then rejected as privilege escalation).
    RbacWithoutPodVerbs,
    /// The seeded-bugs build with [`SEEDED_BUG_ENV`] set to the variant's name, writing the
    /// control planes it reads, under `config/rbac/` plus the write it needs (which
    /// `config/rbac/` does not grant). It breaks no rule, so its [`Variant::breaks`] is empty
    /// and it runs the scenarios of [`CONTROL_PLANE_READERS`].
    ControlPlaneWriter,
}

impl Breakage {
    /// Whether the variant is the seeded-bugs build with [`SEEDED_BUG_ENV`] set to its name.
    pub fn is_seeded_code(self) -> bool {
        matches!(self, Self::Code | Self::ControlPlaneWriter)
    }

    /// The changed copy of `config/rbac/` the variant runs under, if any.
    fn rbac_variant(self) -> Option<RbacVariant> {
        match self {
            Self::Code => None,
            Self::RbacWithoutPodVerbs => Some(RbacVariant {
                dir: "rbac-without-pod-verbs",
                change: "without the pod and PVC verbs",
                apply: without_pod_verbs,
            }),
            Self::ControlPlaneWriter => Some(RbacVariant {
                dir: "rbac-with-control-plane-status-patch",
                change: "plus patch on codercontrolplanes/status",
                apply: with_control_plane_status_patch,
            }),
        }
    }
}

/// A changed copy of `config/rbac/`, generated into the runner's working folder.
#[derive(Clone, Copy)]
struct RbacVariant {
    /// Folder name in the working folder.
    dir: &'static str,
    /// What differs from `config/rbac/`, for the generated file's header.
    change: &'static str,
    apply: fn(Vec<DynamicObject>) -> anyhow::Result<Vec<DynamicObject>>,
}

/// The rules whose scenarios a [`Breakage::ControlPlaneWriter`] runs: the operator reads a usable
/// control plane (so it watches one), in scenarios lasting seconds (so the fixture guard, which
/// looks every 500 ms, sees the write before the namespace is gone).
pub const CONTROL_PLANE_READERS: &[&str] = &["R-PRE-11"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Kebab-case, named after what it breaks; for [`Breakage::Code`] the value of
    /// [`SEEDED_BUG_ENV`].
    pub name: &'static str,
    pub breakage: Breakage,
    /// Contract rule ids the variant breaks; the scenarios tagged with any of them are run.
    pub breaks: &'static [&'static str],
}

impl Variant {
    /// Rule ids whose scenarios run against the variant: [`Variant::breaks`], or
    /// [`CONTROL_PLANE_READERS`] for a [`Breakage::ControlPlaneWriter`], which breaks none.
    pub fn selecting_rules(&self) -> &'static [&'static str] {
        match self.breakage {
            Breakage::ControlPlaneWriter => CONTROL_PLANE_READERS,
            Breakage::Code | Breakage::RbacWithoutPodVerbs => self.breaks,
        }
    }

    /// Cucumber tag expression selecting the scenarios of [`Variant::selecting_rules`].
    pub fn tag_expression(&self) -> String {
        tag_expression(self.selecting_rules().iter().copied())
    }
}

fn tag_expression<'a>(rules: impl Iterator<Item = &'a str>) -> String {
    rules
        .map(|rule| format!("@{rule}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Every seeded variant. The code variants match `operator::seeded::Bug` (checked by the
/// operator's tests).
#[rustfmt::skip]
pub const VARIANTS: &[Variant] = &[
    // The PR's three bugs.
    Variant { name: "rbac-without-pod-verbs", breakage: Breakage::RbacWithoutPodVerbs, breaks: &["R-RES-6"] },
    Variant { name: "key-status-not-persisted-early", breakage: Breakage::Code, breaks: &["R-KEY-7", "R-KEY-8"] },
    Variant { name: "daemon-without-coder-command", breakage: Breakage::Code, breaks: &["R-POD-9"] },
    Variant { name: "daemon-with-organization-env", breakage: Breakage::Code, breaks: &["R-POD-14"] },
    // The tutorial's rules.
    Variant { name: "unowned-key-secret-adopted", breakage: Breakage::Code, breaks: &["R-SEC-8", "R-SEC-10", "R-SEC-11", "D-3"] },
    Variant { name: "key-secret-of-another-provisioner-adopted", breakage: Breakage::Code, breaks: &["R-SEC-12"] },
    Variant { name: "credential-secrets-unchecked", breakage: Breakage::Code, breaks: &["R-CRED-3", "R-CRED-5", "R-CRED-7", "D-2"] },
    Variant { name: "credential-origin-prefix-match", breakage: Breakage::Code, breaks: &["R-CRED-6", "D-2"] },
    Variant { name: "cleanup-by-spec-key-name", breakage: Breakage::Code, breaks: &["R-DEL-3"] },
    Variant { name: "cleanup-without-key-calls-coderd", breakage: Breakage::Code, breaks: &["R-DEL-5"] },
    Variant { name: "finalizer-kept-while-coderd-down", breakage: Breakage::Code, breaks: &["R-DEL-8"] },
    Variant { name: "rate-limited-cleanup-retried", breakage: Breakage::Code, breaks: &["R-DEL-8"] },
    Variant { name: "error-body-decoded-strictly", breakage: Breakage::Code, breaks: &["R-KEY-19"] },
    Variant { name: "replacement-announced-after-delete", breakage: Breakage::Code, breaks: &["D-5"] },
    Variant { name: "unstored-key-left-in-coderd", breakage: Breakage::Code, breaks: &["R-KEY-18"] },
    Variant { name: "child-refusal-only-logged", breakage: Breakage::Code, breaks: &["R-ST-5"] },
    Variant { name: "hanging-coderd-starves-others", breakage: Breakage::Code, breaks: &["R-ENT-8"] },
    // Two replicas (leader_election.feature).
    Variant { name: "paused-leader-unfenced", breakage: Breakage::Code, breaks: &["R-KEY-4"] },
    Variant { name: "fence-trusts-term-token", breakage: Breakage::Code, breaks: &["R-KEY-4"] },
    Variant { name: "standby-waits-for-expiry", breakage: Breakage::Code, breaks: &["R-KEY-4"] },
    Variant { name: "deleted-without-finalizer-reconciled", breakage: Breakage::Code, breaks: &["R-DEL-11"] },
    Variant { name: "deployment-updated-despite-invalid-credentials", breakage: Breakage::Code, breaks: &["R-CRED-8", "R-CRED-9"] },
    Variant { name: "not-entitled-ignored", breakage: Breakage::Code, breaks: &["R-ENT-2", "R-ENT-5", "R-ENT-9"] },
    // Stability.
    Variant { name: "status-rewritten-every-reconcile", breakage: Breakage::Code, breaks: &["R-ST-7"] },
    Variant { name: "key-rotated-on-restart", breakage: Breakage::Code, breaks: &["R-KEY-4"] },
    Variant { name: "tags-ignored-on-drift", breakage: Breakage::Code, breaks: &["R-KEY-13"] },
    Variant { name: "metadata-edits-reconciled", breakage: Breakage::Code, breaks: &["R-W-4"] },
    // Rate limiting.
    Variant { name: "rate-limit-retried-without-backoff", breakage: Breakage::Code, breaks: &["R-RL-2"] },
    Variant { name: "backoff-not-reset-after-success", breakage: Breakage::Code, breaks: &["R-RL-3"] },
    // Which key is deleted, and when.
    Variant { name: "cleanup-by-recorded-name", breakage: Breakage::Code, breaks: &["R-DEL-3", "R-DEL-4", "D-5"] },
    Variant { name: "drift-rotation-by-recorded-name", breakage: Breakage::Code, breaks: &["R-KEY-24"] },
    Variant { name: "cleanup-in-background", breakage: Breakage::Code, breaks: &["R-DEL-2"] },
    Variant { name: "cleanup-organization-from-spec", breakage: Breakage::Code, breaks: &["R-DEL-3"] },
    Variant { name: "rotation-stops-on-delete-failure", breakage: Breakage::Code, breaks: &["R-KEY-16"] },
    // Secrets and credentials.
    Variant { name: "session-token-logged", breakage: Breakage::Code, breaks: &["R-SEC-14"] },
    Variant { name: "credential-origin-port-ignored", breakage: Breakage::Code, breaks: &["R-CRED-6", "R-CRED-10"] },
    Variant { name: "refused-secret-lists-keys", breakage: Breakage::Code, breaks: &["R-SEC-11", "D-3"] },
    Variant { name: "secret-key-ignored", breakage: Breakage::Code, breaks: &["R-SEC-1", "R-SEC-6", "R-KEY-5"] },
    Variant { name: "key-secret-without-block-owner-deletion", breakage: Breakage::Code, breaks: &["R-SEC-3"] },
    // Status and entitlement.
    Variant { name: "phase-ready-when-deployment-exists", breakage: Breakage::Code, breaks: &["R-ST-2", "R-ST-5"] },
    Variant { name: "tags-hash-over-keys-only", breakage: Breakage::Code, breaks: &["R-KEY-13", "R-ST-8"] },
    Variant { name: "transition-time-always-now", breakage: Breakage::Code, breaks: &["R-ST-4"] },
    Variant { name: "observed-generation-frozen", breakage: Breakage::Code, breaks: &["R-ST-4"] },
    Variant { name: "entitlements-unauthorized-as-query-failure", breakage: Breakage::Code, breaks: &["R-ENT-7"] },
    // The suite's own fixture.
    Variant { name: "control-plane-status-rewritten", breakage: Breakage::ControlPlaneWriter, breaks: &[] },
];

#[derive(Args, Debug, Clone)]
pub struct SeededArgs {
    /// Only these variants (comma-separated names); default: all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Print the variants with the rule ids they break (the tags selecting their scenarios).
    #[arg(long)]
    pub list: bool,
    /// Suite runs at the same time; each starts its own local control plane.
    #[arg(long, default_value_t = 3)]
    pub jobs: usize,
    /// Scenarios at the same time within one suite run.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Multiplies every wait deadline of the suite (slow machines).
    #[arg(long)]
    pub timeout_scale: Option<f64>,
    /// Working folder: the seeded binary, the RBAC variant and one report folder per run
    /// (default: target/seeded-bugs of this repository).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// A seeded-bugs build of the operator to use instead of building one.
    #[arg(long)]
    pub seeded_operator: Option<PathBuf>,
    /// The unbroken operator (default: found as `conformance run` finds the reference operator).
    #[arg(long)]
    pub reference_operator: Option<PathBuf>,
    /// The `conformance` executable that runs the suite (default: this executable).
    #[arg(long)]
    pub suite_bin: Option<PathBuf>,
    /// Folder with the feature files.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../features"))]
    pub features: PathBuf,
}

/// One `conformance run`.
#[derive(Clone, Debug)]
struct PlannedRun {
    /// `None` = the unbroken operator on the union of the variants' tags.
    variant: Option<Variant>,
    /// With `--control-plane-access read-only`: a run that must pass, not a verdict.
    read_only: bool,
    tags: String,
    operator: PathBuf,
    rbac: Option<PathBuf>,
    report_dir: PathBuf,
}

impl PlannedRun {
    fn label(&self) -> String {
        match (self.variant, self.read_only) {
            (None, _) => "unbroken operator".to_owned(),
            (Some(variant), false) => variant.name.to_owned(),
            (Some(variant), true) => format!("{} (control-plane access read-only)", variant.name),
        }
    }
}

/// A scenario as the report names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScenarioRef {
    pub feature: String,
    pub line: usize,
    pub name: String,
    /// Why it failed or was skipped (the failing step and its error), from the report.
    pub reason: Option<String>,
}

impl std::fmt::Display for ScenarioRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} \"{}\"", self.feature, self.line, self.name)
    }
}

/// What one suite run found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    Report {
        passed: Vec<ScenarioRef>,
        failed: Vec<ScenarioRef>,
        /// Selected by the tags but skipped (e.g. missing prerequisites): not a pass.
        skipped: Vec<ScenarioRef>,
        /// Why the run was stopped before its end (the report's `aborted`).
        aborted: Option<String>,
    },
    /// The suite produced no report (setup failed); nothing can be concluded.
    Error(String),
}

/// The summary of a report: selected scenarios by outcome.
pub fn outcome_of(report: &ConformanceReport) -> RunOutcome {
    let mut passed = Vec::new();
    let mut failed = Vec::new();
    let mut skipped = Vec::new();
    for result in &report.results {
        let scenario = ScenarioRef {
            feature: result.feature.clone(),
            line: result.line,
            name: result.scenario.clone(),
            reason: result.reason.clone(),
        };
        match result.status {
            Status::Passed => passed.push(scenario),
            Status::Failed => failed.push(scenario),
            Status::Skipped
                if result
                    .reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(crate::cli::NOT_SELECTED)) => {}
            Status::Skipped => skipped.push(scenario),
        }
    }
    RunOutcome::Report {
        passed,
        failed,
        skipped,
        aborted: report.aborted.clone(),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// These scenarios failed against the variant.
    Caught(Vec<ScenarioRef>),
    /// The fixture guard stopped the run with this message: how a
    /// [`Breakage::ControlPlaneWriter`] is caught.
    Stopped(String),
    /// Not caught (maybe no scenario was selected): the suite does not notice this bug.
    Missed {
        passed: usize,
        failed: usize,
        skipped: usize,
    },
    /// The run itself failed; nothing can be concluded.
    Error(String),
}

/// The verdict for one variant's run: a failed scenario catches a bug in the operator's
/// behaviour, only the fixture guard's stop catches a control-plane writer, and a run stopped for
/// anything else proves nothing.
pub fn verdict(breakage: Breakage, outcome: &RunOutcome) -> Verdict {
    let writer = breakage == Breakage::ControlPlaneWriter;
    match outcome {
        RunOutcome::Error(why) => Verdict::Error(why.clone()),
        RunOutcome::Report {
            aborted: Some(why), ..
        } if writer && is_fixture_change(why) => Verdict::Stopped(why.clone()),
        RunOutcome::Report {
            aborted: Some(why), ..
        } => Verdict::Error(format!("the run was stopped: {why}")),
        RunOutcome::Report { failed, .. } if !writer && !failed.is_empty() => {
            Verdict::Caught(failed.clone())
        }
        RunOutcome::Report {
            passed,
            failed,
            skipped,
            aborted: None,
        } => Verdict::Missed {
            passed: passed.len(),
            failed: failed.len(),
            skipped: skipped.len(),
        },
    }
}

/// Why a run that must pass every selected scenario (the unbroken operator, which backs the
/// verdicts; a control-plane writer under read-only access) does not, if it does not.
pub fn unclean_run_problem(outcome: &RunOutcome) -> Option<String> {
    match outcome {
        RunOutcome::Error(why) => Some(format!("the run failed: {why}")),
        RunOutcome::Report {
            passed,
            failed,
            skipped,
            aborted,
        } => {
            let mut problems = Vec::new();
            if let Some(why) = aborted {
                problems.push(format!("the run was stopped: {why}"));
            }
            if passed.is_empty() {
                problems.push("no scenario passed".to_owned());
            }
            let with_reason = |verb: &str, s: &ScenarioRef| {
                let reason = s.reason.as_deref().unwrap_or("no reason recorded");
                format!("{verb} {s}: {reason}")
            };
            problems.extend(failed.iter().map(|s| with_reason("failed", s)));
            problems.extend(skipped.iter().map(|s| with_reason("skipped", s)));
            (!problems.is_empty()).then(|| problems.join("; "))
        }
    }
}

/// Removes the core-group `pods` and `persistentvolumeclaims` rules from every ClusterRole,
/// keeping everything else. Fails when there was nothing to remove, so the variant can never
/// silently equal the unbroken RBAC.
pub fn without_pod_verbs(mut objects: Vec<DynamicObject>) -> anyhow::Result<Vec<DynamicObject>> {
    const REMOVED: [&str; 2] = ["pods", "persistentvolumeclaims"];
    let mut removed = 0;
    for rules in cluster_role_rules(&mut objects) {
        for rule in rules.iter_mut() {
            let core_group = rule["apiGroups"]
                .as_array()
                .is_some_and(|groups| groups.iter().any(|g| g == ""));
            if let (true, Some(resources)) = (core_group, rule["resources"].as_array_mut()) {
                let before = resources.len();
                resources.retain(|r| !REMOVED.iter().any(|gone| r == gone));
                removed += before - resources.len();
            }
        }
        rules.retain(|rule| rule["resources"].as_array().is_none_or(|r| !r.is_empty()));
    }
    if removed == 0 {
        bail!(
            "no ClusterRole rule grants pods or persistentvolumeclaims; the RBAC variant would equal the original"
        );
    }
    Ok(objects)
}

/// Adds patch on codercontrolplanes/status to every ClusterRole: the write a
/// [`Breakage::ControlPlaneWriter`] makes. Fails when there is no ClusterRole, so the variant can
/// never silently equal the unbroken RBAC.
pub fn with_control_plane_status_patch(
    mut objects: Vec<DynamicObject>,
) -> anyhow::Result<Vec<DynamicObject>> {
    let mut granted = 0;
    for rules in cluster_role_rules(&mut objects) {
        rules.push(serde_json::json!({
            "apiGroups": ["coder.com"],
            "resources": ["codercontrolplanes/status"],
            "verbs": ["patch"],
        }));
        granted += 1;
    }
    if granted == 0 {
        bail!("no ClusterRole with rules to grant the control-plane status write in");
    }
    Ok(objects)
}

/// The `rules` of every ClusterRole among `objects`.
fn cluster_role_rules(objects: &mut [DynamicObject]) -> impl Iterator<Item = &mut Vec<Value>> {
    objects
        .iter_mut()
        .filter(|object| {
            object
                .types
                .as_ref()
                .is_some_and(|t| t.kind == "ClusterRole")
        })
        .filter_map(|object| object.data.get_mut("rules").and_then(Value::as_array_mut))
}

/// Writes `config/rbac/` changed by `variant` into `dir` (one multi-document file).
fn write_rbac_variant(repo: &Path, variant: RbacVariant, dir: &Path) -> anyhow::Result<()> {
    let objects = (variant.apply)(crate::manifests::read_dir(&repo.join("config/rbac"))?)?;
    let mut text = format!(
        "# Generated by `conformance seeded-bugs`: config/rbac {}.\n",
        variant.change
    );
    for object in &objects {
        text.push_str("---\n");
        text.push_str(&serde_saphyr::to_string(object).context("serialising the RBAC variant")?);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("rbac.yaml");
    std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))
}

/// Builds the operator with `--features seeded-bugs`, copies it into `out_dir`, then rebuilds the
/// normal binary so `target/debug` keeps holding the unbroken operator.
async fn build_seeded_operator(repo: &Path, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let seeded = cargo_build_operator(repo, true).await?;
    let copy = out_dir.join(REFERENCE_BINARY);
    std::fs::copy(&seeded, &copy)
        .with_context(|| format!("copying {} to {}", seeded.display(), copy.display()))?;
    cargo_build_operator(repo, false).await?;
    Ok(copy)
}

async fn cargo_build_operator(repo: &Path, seeded: bool) -> anyhow::Result<PathBuf> {
    let mut args = vec![
        "build",
        "-p",
        "operator",
        "--bin",
        REFERENCE_BINARY,
        "--message-format=json-render-diagnostics",
        "--locked",
    ];
    if seeded {
        args.extend(["--features", "seeded-bugs"]);
    }
    eprintln!("seeded-bugs: cargo {}", args.join(" "));
    let output = crate::implementation::workspace_cargo(repo, &args)
        .output()
        .await
        .context("running cargo")?;
    if !output.status.success() {
        bail!(
            "building the operator failed ({}); see the messages above",
            output.status
        );
    }
    crate::implementation::built_executable(&String::from_utf8_lossy(&output.stdout))
        .ok_or_else(|| anyhow!("cargo reported no {REFERENCE_BINARY} executable"))
}

/// Runs the suite once; its output goes to `suite.log` in the run's report folder.
async fn run_suite(args: &SeededArgs, suite_bin: &Path, run: &PlannedRun) -> RunOutcome {
    match try_run_suite(args, suite_bin, run).await {
        Ok(outcome) => outcome,
        Err(error) => RunOutcome::Error(format!("{error:#}")),
    }
}

async fn try_run_suite(
    args: &SeededArgs,
    suite_bin: &Path,
    run: &PlannedRun,
) -> anyhow::Result<RunOutcome> {
    if run.report_dir.exists() {
        std::fs::remove_dir_all(&run.report_dir)
            .with_context(|| format!("clearing {}", run.report_dir.display()))?;
    }
    std::fs::create_dir_all(&run.report_dir)
        .with_context(|| format!("creating {}", run.report_dir.display()))?;
    let log_path = run.report_dir.join("suite.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut command = tokio::process::Command::new(suite_bin);
    command
        .arg("run")
        .args(["--cluster", "local", "--tags", &run.tags])
        .arg("--report-dir")
        .arg(&run.report_dir)
        .arg("--features")
        .arg(&args.features)
        .args(["--concurrency", &args.concurrency.to_string()])
        .args([
            "--impl-name",
            &format!("coder-provisioner-operator ({})", run.label()),
        ])
        .env(REFERENCE_BINARY_ENV, &run.operator)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(scale) = args.timeout_scale {
        command.args(["--timeout-scale", &scale.to_string()]);
    }
    if let Some(rbac) = &run.rbac {
        command.arg("--operator-rbac").arg(rbac);
    }
    if run.read_only {
        command.args(["--control-plane-access", "read-only"]);
    }
    // The operator process inherits this environment: exactly one variant, or none.
    match run.variant {
        Some(variant) if variant.breakage.is_seeded_code() => {
            command.env(SEEDED_BUG_ENV, variant.name)
        }
        _ => command.env_remove(SEEDED_BUG_ENV),
    };
    let status = command
        .status()
        .await
        .with_context(|| format!("starting {}", suite_bin.display()))?;
    let report_path = run.report_dir.join(crate::cli::REPORT_FILE);
    let Ok(text) = std::fs::read_to_string(&report_path) else {
        bail!(
            "the suite exited with {status} without a report; see {}",
            log_path.display()
        );
    };
    Ok(outcome_of(&ConformanceReport::from_yaml(&text)?))
}

fn repo_root() -> anyhow::Result<PathBuf> {
    crate::cli::repo_root()
        .canonicalize()
        .context("locating the repository root")
}

fn selected_variants(only: &[String]) -> anyhow::Result<Vec<Variant>> {
    if only.is_empty() {
        return Ok(VARIANTS.to_vec());
    }
    only.iter()
        .map(|name| {
            VARIANTS
                .iter()
                .copied()
                .find(|v| v.name == name)
                .ok_or_else(|| {
                    anyhow!(
                        "unknown variant {name:?}; known: {}",
                        VARIANTS
                            .iter()
                            .map(|v| v.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        })
        .collect()
}

/// The variant table as text (`--list`, and the README's list).
pub fn variant_list(variants: &[Variant]) -> String {
    let width = variants.iter().map(|v| v.name.len()).max().unwrap_or(0);
    let mut text = String::new();
    for variant in variants {
        let what = match variant.breakage {
            Breakage::ControlPlaneWriter => format!(
                "breaks the suite's control-plane fixture (runs the scenarios of {})",
                variant.selecting_rules().join(", ")
            ),
            Breakage::Code | Breakage::RbacWithoutPodVerbs => {
                format!("breaks {}", variant.breaks.join(", "))
            }
        };
        let _ = writeln!(text, "{:width$}  {what}", variant.name);
    }
    text
}

/// Runs every selected variant and the unbroken operator; prints the table.
pub async fn run(args: SeededArgs) -> anyhow::Result<ExitCode> {
    let variants = selected_variants(&args.only)?;
    if args.list {
        print!("{}", variant_list(&variants));
        return Ok(ExitCode::SUCCESS);
    }
    let started = Instant::now();
    let repo = repo_root()?;
    let out_dir = args
        .out_dir
        .clone()
        .unwrap_or_else(|| repo.join("target/seeded-bugs"));
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let out_dir = out_dir.canonicalize()?;
    let suite_bin = match &args.suite_bin {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("locating this executable")?,
    };

    let seeded_operator = match &args.seeded_operator {
        Some(path) => path.clone(),
        None => build_seeded_operator(&repo, &out_dir).await?,
    };
    let reference_operator = match &args.reference_operator {
        Some(path) => path.clone(),
        None => reference_operator_binary().await?,
    };
    for rbac in variants.iter().filter_map(|v| v.breakage.rbac_variant()) {
        write_rbac_variant(&repo, rbac, &out_dir.join(rbac.dir))?;
    }

    let union = {
        let mut rules: Vec<&str> = variants
            .iter()
            .flat_map(|v| v.selecting_rules().iter().copied())
            .collect();
        rules.sort_unstable();
        rules.dedup();
        tag_expression(rules.into_iter())
    };
    let reports = out_dir.join("reports");
    let mut runs = vec![PlannedRun {
        variant: None,
        read_only: false,
        tags: union,
        operator: reference_operator.clone(),
        rbac: None,
        report_dir: reports.join("unbroken-operator"),
    }];
    let variant_run = |variant: &Variant| PlannedRun {
        variant: Some(*variant),
        read_only: false,
        tags: variant.tag_expression(),
        operator: if variant.breakage.is_seeded_code() {
            seeded_operator.clone()
        } else {
            reference_operator.clone()
        },
        rbac: variant
            .breakage
            .rbac_variant()
            .map(|rbac| out_dir.join(rbac.dir)),
        report_dir: reports.join(variant.name),
    };
    runs.extend(variants.iter().map(variant_run));
    runs.extend(
        variants
            .iter()
            .filter(|v| v.breakage == Breakage::ControlPlaneWriter)
            .map(|variant| PlannedRun {
                read_only: true,
                report_dir: reports.join(format!("{}-read-only", variant.name)),
                ..variant_run(variant)
            }),
    );

    eprintln!(
        "seeded-bugs: {} variants, the unbroken operator and {} read-only control-plane access check(s), {} suite runs at a time; logs and reports in {}",
        variants.len(),
        runs.iter().filter(|run| run.read_only).count(),
        args.jobs.max(1),
        reports.display()
    );
    let total = runs.len();
    let mut finished = 0;
    let mut results: Vec<(PlannedRun, RunOutcome)> = futures::stream::iter(runs)
        .map(|run| {
            let (args, suite_bin) = (&args, &suite_bin);
            async move {
                let clock = Instant::now();
                let outcome = run_suite(args, suite_bin, &run).await;
                (run, outcome, clock.elapsed())
            }
        })
        .buffer_unordered(args.jobs.max(1))
        .map(|(run, outcome, took)| {
            finished += 1;
            eprintln!(
                "seeded-bugs: [{finished}/{total}] {} finished in {}s: {}",
                run.label(),
                took.as_secs(),
                short(&outcome)
            );
            (run, outcome)
        })
        .collect()
        .await;
    results.sort_by_key(|(run, _)| {
        (
            run.variant
                .map(|v| VARIANTS.iter().position(|known| known.name == v.name)),
            run.read_only,
        )
    });

    let (reference, variant_results) = results.split_first().ok_or_else(|| anyhow!("no runs"))?;
    let verdicts: Vec<(Variant, Verdict)> = variant_results
        .iter()
        .filter(|(run, _)| !run.read_only)
        .filter_map(|(run, outcome)| {
            let variant = run.variant?;
            Some((variant, verdict(variant.breakage, outcome)))
        })
        .collect();
    print!("{}", table(&verdicts));
    let caught = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Caught(_) | Verdict::Stopped(_)))
        .count();
    println!("caught {caught} of {}", verdicts.len());
    let mut all_clean = true;
    let read_only_runs = variant_results.iter().filter(|(run, _)| run.read_only);
    for (run, outcome) in std::iter::once(reference).chain(read_only_runs) {
        let problem = unclean_run_problem(outcome);
        all_clean &= problem.is_none();
        match (problem, outcome) {
            (None, RunOutcome::Report { passed, .. }) => {
                println!(
                    "{}: all {} selected scenarios passed",
                    run.label(),
                    passed.len()
                )
            }
            (Some(problem), _) if run.variant.is_none() => {
                println!("unbroken operator: NOT CLEAN, so the catches prove nothing: {problem}")
            }
            (Some(problem), _) => println!(
                "{}: NOT CLEAN, so read-only access does not neutralise it: {problem}",
                run.label()
            ),
            (None, RunOutcome::Error(_)) => {}
        }
    }
    println!(
        "took {}s; reports in {}",
        started.elapsed().as_secs(),
        reports.display()
    );
    Ok(if caught == verdicts.len() && all_clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn short(outcome: &RunOutcome) -> String {
    match outcome {
        RunOutcome::Report {
            passed,
            failed,
            skipped,
            aborted,
        } => {
            format!(
                "{} passed, {} failed, {} skipped{}",
                passed.len(),
                failed.len(),
                skipped.len(),
                if aborted.is_some() { ", STOPPED" } else { "" }
            )
        }
        RunOutcome::Error(why) => format!("ERROR {why}"),
    }
}

/// variant → scenarios that failed → caught / MISSED.
pub fn table(verdicts: &[(Variant, Verdict)]) -> String {
    const SHOWN: usize = 3;
    let rows: Vec<[String; 3]> = verdicts
        .iter()
        .map(|(variant, verdict)| match verdict {
            Verdict::Caught(failed) => {
                let mut shown: Vec<String> =
                    failed.iter().take(SHOWN).map(ToString::to_string).collect();
                if failed.len() > SHOWN {
                    shown.push(format!("(+{} more)", failed.len() - SHOWN));
                }
                [
                    variant.name.to_owned(),
                    shown.join(", "),
                    "caught".to_owned(),
                ]
            }
            // The guard's message is long; its first sentence names the change.
            Verdict::Stopped(message) => [
                variant.name.to_owned(),
                format!(
                    "none; the run was stopped: {}",
                    message.split(". ").next().unwrap_or(message)
                ),
                "caught".to_owned(),
            ],
            Verdict::Missed {
                passed: 0,
                failed: 0,
                skipped: 0,
            } => [
                variant.name.to_owned(),
                "none (no scenario carries its rule tags)".to_owned(),
                "MISSED".to_owned(),
            ],
            Verdict::Missed {
                passed,
                failed,
                skipped,
            } if variant.breakage == Breakage::ControlPlaneWriter => [
                variant.name.to_owned(),
                format!(
                    "the fixture guard did not stop the run ({passed} passed, {failed} failed, {skipped} skipped)"
                ),
                "MISSED".to_owned(),
            ],
            Verdict::Missed {
                passed, skipped, ..
            } => [
                variant.name.to_owned(),
                format!("none ({passed} passed, {skipped} skipped)"),
                "MISSED".to_owned(),
            ],
            Verdict::Error(why) => [variant.name.to_owned(), why.clone(), "ERROR".to_owned()],
        })
        .collect();
    let width = rows
        .iter()
        .map(|r| r[0].len())
        .max()
        .unwrap_or(0)
        .max("variant".len());
    let mut text = format!("{:width$}  {:7}  failed scenarios\n", "variant", "verdict");
    for [name, failed, verdict] in rows {
        let _ = writeln!(text, "{name:width$}  {verdict:7}  {failed}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn scenario(line: usize) -> ScenarioRef {
        ScenarioRef {
            feature: "f.feature".into(),
            line,
            name: format!("s{line}"),
            reason: Some(format!("step {line} failed")),
        }
    }

    fn report(passed: &[usize], failed: &[usize], skipped: &[usize]) -> RunOutcome {
        let refs = |lines: &[usize]| lines.iter().copied().map(scenario).collect();
        RunOutcome::Report {
            passed: refs(passed),
            failed: refs(failed),
            skipped: refs(skipped),
            aborted: None,
        }
    }

    fn stopped(outcome: RunOutcome, why: &str) -> RunOutcome {
        match outcome {
            RunOutcome::Report {
                passed,
                failed,
                skipped,
                ..
            } => RunOutcome::Report {
                passed,
                failed,
                skipped,
                aborted: Some(why.to_owned()),
            },
            error => error,
        }
    }

    fn guard_message() -> String {
        crate::fixture_guard::message(
            "ns",
            "cp",
            &["status rewritten by field manager \"op\" (status)".into()],
        )
    }

    #[rstest]
    #[case::caught(Breakage::Code, report(&[1], &[2, 3], &[]), "caught")]
    #[case::missed(Breakage::Code, report(&[1, 2], &[], &[]), "missed")]
    #[case::missed_when_only_skipped(Breakage::Code, report(&[], &[], &[4]), "missed")]
    #[case::nothing_selected(Breakage::Code, report(&[], &[], &[]), "missed")]
    #[case::run_failed(Breakage::Code, RunOutcome::Error("boom".into()), "error")]
    #[case::writer_stopped_by_the_guard(Breakage::ControlPlaneWriter, stopped(report(&[1], &[], &[]), &guard_message()), "stopped")]
    #[case::writer_stopped_for_another_reason(Breakage::ControlPlaneWriter, stopped(report(&[1], &[], &[]), "the operator exited"), "error")]
    #[case::writer_failing_scenarios_unstopped(Breakage::ControlPlaneWriter, report(&[1], &[2, 3], &[]), "missed")]
    #[case::code_variant_stopped_by_the_guard(Breakage::Code, stopped(report(&[1], &[2, 3], &[]), &guard_message()), "error")]
    fn verdicts(#[case] breakage: Breakage, #[case] outcome: RunOutcome, #[case] expected: &str) {
        let got = match verdict(breakage, &outcome) {
            Verdict::Caught(failed) => {
                assert_eq!(failed, vec![scenario(2), scenario(3)]);
                "caught"
            }
            Verdict::Stopped(message) => {
                assert_eq!(message, guard_message());
                "stopped"
            }
            Verdict::Missed { .. } => "missed",
            Verdict::Error(_) => "error",
        };
        assert_eq!(got, expected);
    }

    #[rstest]
    #[case::clean(report(&[1, 2], &[], &[]), None)]
    #[case::a_failure(report(&[1], &[2], &[]), Some("failed f.feature:2 \"s2\": step 2 failed"))]
    #[case::a_skip(report(&[1], &[], &[3]), Some("skipped f.feature:3"))]
    #[case::nothing_ran(report(&[], &[], &[]), Some("no scenario passed"))]
    #[case::run_failed(RunOutcome::Error("boom".into()), Some("boom"))]
    #[case::stopped(stopped(report(&[1, 2], &[], &[]), "fixture changed"), Some("the run was stopped: fixture changed"))]
    fn clean_runs_pass_everything(#[case] outcome: RunOutcome, #[case] problem: Option<&str>) {
        let found = unclean_run_problem(&outcome);
        match problem {
            None => assert_eq!(found, None),
            Some(fragment) => assert!(
                found.as_deref().is_some_and(|p| p.contains(fragment)),
                "{found:?}"
            ),
        }
    }

    #[test]
    fn variant_names_are_unique_kebab_case_and_select_by_rule_tags() {
        let mut names: Vec<&str> = VARIANTS.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARIANTS.len());
        for variant in VARIANTS {
            assert!(
                variant
                    .name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '-'),
                "{}",
                variant.name
            );
            assert_eq!(
                variant.breaks.is_empty(),
                variant.breakage == Breakage::ControlPlaneWriter,
                "{}: only a control-plane writer breaks no rule",
                variant.name
            );
            assert!(
                variant
                    .tag_expression()
                    .parse::<cucumber::gherkin::tagexpr::TagOperation>()
                    .is_ok()
            );
        }
        assert_eq!(VARIANTS[1].tag_expression(), "@R-KEY-7 or @R-KEY-8");
    }

    /// Every rule a variant names selects at least one scenario of the suite, so no variant's
    /// run can be empty by a typo.
    #[test]
    fn every_rule_of_every_variant_tags_a_scenario() {
        let features = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../features"));
        let mut text = String::new();
        for entry in std::fs::read_dir(features).expect("features folder") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "feature") {
                text.push_str(&std::fs::read_to_string(&path).expect("feature file"));
            }
        }
        let tags: std::collections::BTreeSet<&str> = text
            .split_whitespace()
            .filter_map(|word| word.strip_prefix('@'))
            .collect();
        for variant in VARIANTS {
            for rule in variant.selecting_rules() {
                assert!(
                    tags.contains(rule),
                    "{}: no scenario is tagged @{rule}",
                    variant.name
                );
            }
        }
    }

    #[test]
    fn unknown_variants_are_refused_with_the_known_names() {
        let error = selected_variants(&["no-such-bug".to_owned()]).expect_err("unknown");
        assert!(
            error.to_string().contains("tags-ignored-on-drift"),
            "{error}"
        );
        assert_eq!(selected_variants(&[]).expect("all").len(), VARIANTS.len());
    }

    #[test]
    fn the_rbac_variant_drops_exactly_the_pod_verbs() {
        let original = crate::manifests::read_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/rbac"),
        )
        .expect("config/rbac");
        let variant = without_pod_verbs(original.clone()).expect("something removed");
        assert_eq!(variant.len(), original.len());
        let resources = |objects: &[DynamicObject]| -> Vec<String> {
            objects
                .iter()
                .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "ClusterRole"))
                .flat_map(|o| o.data["rules"].as_array().cloned().unwrap_or_default())
                .flat_map(|rule| rule["resources"].as_array().cloned().unwrap_or_default())
                .filter_map(|r| r.as_str().map(str::to_owned))
                .collect()
        };
        let (before, after) = (resources(&original), resources(&variant));
        assert!(
            before.contains(&"pods".to_owned())
                && before.contains(&"persistentvolumeclaims".to_owned())
        );
        assert!(
            !after.contains(&"pods".to_owned())
                && !after.contains(&"persistentvolumeclaims".to_owned())
        );
        let kept: Vec<&String> = before
            .iter()
            .filter(|r| *r != "pods" && *r != "persistentvolumeclaims")
            .collect();
        assert_eq!(
            after.iter().collect::<Vec<_>>(),
            kept,
            "everything else is kept"
        );
        // Applying it twice finds nothing more to remove.
        assert!(without_pod_verbs(variant).is_err());
    }

    /// The writer's RBAC grants one write on control planes, and read-only access takes exactly
    /// that away again.
    #[test]
    fn read_only_access_removes_what_the_writer_rbac_adds() {
        let original = crate::manifests::read_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/rbac"),
        )
        .expect("config/rbac");
        let as_json = |objects: Vec<DynamicObject>| -> Vec<Value> {
            objects
                .into_iter()
                .map(|o| serde_json::to_value(o).expect("JSON"))
                .collect()
        };
        let writer = with_control_plane_status_patch(original.clone()).expect("a ClusterRole");
        let granted = |objects: &[Value]| -> Vec<Value> {
            objects
                .iter()
                .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
                .filter(|rule| {
                    rule["resources"] == serde_json::json!(["codercontrolplanes/status"])
                })
                .collect()
        };
        let (original, writer) = (as_json(original), as_json(writer));
        assert_eq!(granted(&original), Vec::<Value>::new());
        assert_eq!(granted(&writer).len(), 1);
        assert_eq!(
            crate::fixture_guard::read_only_control_planes(writer),
            crate::fixture_guard::read_only_control_planes(original)
        );
    }

    #[test]
    fn the_table_says_caught_or_missed_per_variant() {
        let verdicts = vec![
            (VARIANTS[2], Verdict::Caught(vec![scenario(11)])),
            (
                VARIANTS[3],
                Verdict::Missed {
                    passed: 2,
                    failed: 0,
                    skipped: 0,
                },
            ),
            (
                VARIANTS[4],
                Verdict::Missed {
                    passed: 0,
                    failed: 0,
                    skipped: 0,
                },
            ),
            (writer(), Verdict::Stopped(guard_message())),
            (
                writer(),
                Verdict::Missed {
                    passed: 1,
                    failed: 1,
                    skipped: 0,
                },
            ),
        ];
        let text = table(&verdicts);
        assert!(
            text.contains("daemon-without-coder-command")
                && text.contains("caught")
                && text.contains("f.feature:11 \"s11\""),
            "{text}"
        );
        assert!(
            text.contains("MISSED") && text.contains("none (2 passed, 0 skipped)"),
            "{text}"
        );
        assert!(text.contains("no scenario carries its rule tags"), "{text}");
        assert!(
            text.contains("caught   none; the run was stopped: someone other than the suite changed its control-plane fixture CoderControlPlane ns/cp: status rewritten by field manager \"op\" (status)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "MISSED   the fixture guard did not stop the run (1 passed, 1 failed, 0 skipped)"
            ),
            "{text}"
        );
    }

    fn writer() -> Variant {
        *VARIANTS
            .iter()
            .find(|v| v.breakage == Breakage::ControlPlaneWriter)
            .expect("a control-plane writer")
    }
}
