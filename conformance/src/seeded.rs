//! Seeded bugs: proves the suite can fail.
//!
//! The reference operator built with its `seeded-bugs` feature carries deliberately broken
//! variants, one active at a time, selected by [`SEEDED_BUG_ENV`]. This runner runs the suite
//! against each variant — only the scenarios tagged with the rules that variant breaks — and
//! against the unbroken operator on the union of those tags. A variant is *caught* when at least
//! one scenario fails for it while the unbroken operator passes every selected scenario; a
//! variant with no failing scenario is *MISSED*, and the run fails.
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
}

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
    /// Cucumber tag expression selecting the scenarios of [`Variant::breaks`].
    pub fn tag_expression(&self) -> String {
        tag_expression(self.breaks.iter().copied())
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
    Variant { name: "deleted-without-finalizer-reconciled", breakage: Breakage::Code, breaks: &["R-DEL-11"] },
    Variant { name: "deployment-updated-despite-invalid-credentials", breakage: Breakage::Code, breaks: &["R-CRED-8", "R-CRED-9"] },
    Variant { name: "not-entitled-ignored", breakage: Breakage::Code, breaks: &["R-ENT-2", "R-ENT-5", "R-ENT-9"] },
    // Stability.
    Variant { name: "status-rewritten-every-reconcile", breakage: Breakage::Code, breaks: &["R-ST-7"] },
    Variant { name: "key-rotated-on-restart", breakage: Breakage::Code, breaks: &["R-KEY-4"] },
    Variant { name: "tags-ignored-on-drift", breakage: Breakage::Code, breaks: &["R-KEY-13"] },
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
    tags: String,
    operator: PathBuf,
    rbac: Option<PathBuf>,
    report_dir: PathBuf,
}

impl PlannedRun {
    fn label(&self) -> &str {
        self.variant.map_or("unbroken operator", |v| v.name)
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
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// These scenarios failed against the variant.
    Caught(Vec<ScenarioRef>),
    /// No selected scenario failed (maybe none was selected): the suite does not notice this bug.
    Missed { passed: usize, skipped: usize },
    /// The run itself failed; nothing can be concluded.
    Error(String),
}

/// The verdict for one variant's run.
pub fn verdict(outcome: &RunOutcome) -> Verdict {
    match outcome {
        RunOutcome::Error(why) => Verdict::Error(why.clone()),
        RunOutcome::Report {
            passed,
            failed,
            skipped,
        } => {
            if failed.is_empty() {
                Verdict::Missed {
                    passed: passed.len(),
                    skipped: skipped.len(),
                }
            } else {
                Verdict::Caught(failed.clone())
            }
        }
    }
}

/// Why the unbroken operator's run does not back the verdicts, if it does not.
pub fn reference_problem(outcome: &RunOutcome) -> Option<String> {
    match outcome {
        RunOutcome::Error(why) => Some(format!("the run failed: {why}")),
        RunOutcome::Report {
            passed,
            failed,
            skipped,
        } => {
            let mut problems = Vec::new();
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
    for object in &mut objects {
        if object
            .types
            .as_ref()
            .is_none_or(|t| t.kind != "ClusterRole")
        {
            continue;
        }
        let Some(rules) = object.data.get_mut("rules").and_then(Value::as_array_mut) else {
            continue;
        };
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

/// Writes `config/rbac/` minus the pod verbs into `dir` (one multi-document file).
fn write_rbac_variant(repo: &Path, dir: &Path) -> anyhow::Result<()> {
    let objects = without_pod_verbs(crate::manifests::read_dir(&repo.join("config/rbac"))?)?;
    let mut text = String::from(
        "# Generated by `conformance seeded-bugs`: config/rbac without the pod and PVC verbs.\n",
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
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = tokio::process::Command::new(cargo);
    command.args([
        "build",
        "-p",
        "operator",
        "--bin",
        REFERENCE_BINARY,
        "--message-format=json-render-diagnostics",
        "--locked",
    ]);
    if seeded {
        command.args(["--features", "seeded-bugs"]);
    }
    eprintln!(
        "seeded-bugs: cargo build -p operator{}",
        if seeded {
            " --features seeded-bugs"
        } else {
            ""
        }
    );
    let output = command
        .current_dir(repo)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .context("running cargo")?;
    if !output.status.success() {
        bail!(
            "building the operator failed ({}); see the messages above",
            output.status
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == REFERENCE_BINARY)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
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
    // The operator process inherits this environment: exactly one variant, or none.
    match run.variant {
        Some(Variant {
            name,
            breakage: Breakage::Code,
            ..
        }) => command.env(SEEDED_BUG_ENV, name),
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
        let _ = writeln!(
            text,
            "{:width$}  breaks {}",
            variant.name,
            variant.breaks.join(", ")
        );
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
    let rbac_variant = out_dir.join("rbac-without-pod-verbs");
    write_rbac_variant(&repo, &rbac_variant)?;

    let union = {
        let mut rules: Vec<&str> = variants
            .iter()
            .flat_map(|v| v.breaks.iter().copied())
            .collect();
        rules.sort_unstable();
        rules.dedup();
        tag_expression(rules.into_iter())
    };
    let reports = out_dir.join("reports");
    let mut runs = vec![PlannedRun {
        variant: None,
        tags: union,
        operator: reference_operator.clone(),
        rbac: None,
        report_dir: reports.join("unbroken-operator"),
    }];
    runs.extend(variants.iter().map(|variant| PlannedRun {
        variant: Some(*variant),
        tags: variant.tag_expression(),
        operator: match variant.breakage {
            Breakage::Code => seeded_operator.clone(),
            Breakage::RbacWithoutPodVerbs => reference_operator.clone(),
        },
        rbac: (variant.breakage == Breakage::RbacWithoutPodVerbs).then(|| rbac_variant.clone()),
        report_dir: reports.join(variant.name),
    }));

    eprintln!(
        "seeded-bugs: {} variants and the unbroken operator, {} suite runs at a time; logs and reports in {}",
        variants.len(),
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
        run.variant
            .map(|v| VARIANTS.iter().position(|known| known.name == v.name))
    });

    let (reference, variant_results) = results.split_first().ok_or_else(|| anyhow!("no runs"))?;
    let reference_problem = reference_problem(&reference.1);
    let verdicts: Vec<(Variant, Verdict)> = variant_results
        .iter()
        .filter_map(|(run, outcome)| Some((run.variant?, verdict(outcome))))
        .collect();
    print!("{}", table(&verdicts));
    let caught = verdicts
        .iter()
        .filter(|(_, v)| matches!(v, Verdict::Caught(_)))
        .count();
    println!("caught {caught} of {}", verdicts.len());
    match (&reference_problem, &reference.1) {
        (None, RunOutcome::Report { passed, .. }) => {
            println!(
                "unbroken operator: all {} selected scenarios passed",
                passed.len()
            )
        }
        (Some(problem), _) => {
            println!("unbroken operator: NOT CLEAN, so the catches prove nothing: {problem}")
        }
        (None, RunOutcome::Error(_)) => {}
    }
    println!(
        "took {}s; reports in {}",
        started.elapsed().as_secs(),
        reports.display()
    );
    Ok(if caught == verdicts.len() && reference_problem.is_none() {
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
        } => {
            format!(
                "{} passed, {} failed, {} skipped",
                passed.len(),
                failed.len(),
                skipped.len()
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
            Verdict::Missed {
                passed: 0,
                skipped: 0,
            } => [
                variant.name.to_owned(),
                "none (no scenario carries its rule tags)".to_owned(),
                "MISSED".to_owned(),
            ],
            Verdict::Missed { passed, skipped } => [
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
        }
    }

    #[rstest]
    #[case::caught(report(&[1], &[2, 3], &[]), "caught")]
    #[case::missed(report(&[1, 2], &[], &[]), "missed")]
    #[case::missed_when_only_skipped(report(&[], &[], &[4]), "missed")]
    #[case::nothing_selected(report(&[], &[], &[]), "missed")]
    #[case::run_failed(RunOutcome::Error("boom".into()), "error")]
    fn verdicts(#[case] outcome: RunOutcome, #[case] expected: &str) {
        let got = match verdict(&outcome) {
            Verdict::Caught(failed) => {
                assert_eq!(failed, vec![scenario(2), scenario(3)]);
                "caught"
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
    fn reference_must_pass_everything(#[case] outcome: RunOutcome, #[case] problem: Option<&str>) {
        let found = reference_problem(&outcome);
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
            assert!(
                !variant.breaks.is_empty(),
                "{} breaks no rule",
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
            for rule in variant.breaks {
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

    #[test]
    fn the_table_says_caught_or_missed_per_variant() {
        let verdicts = vec![
            (VARIANTS[2], Verdict::Caught(vec![scenario(11)])),
            (
                VARIANTS[3],
                Verdict::Missed {
                    passed: 2,
                    skipped: 0,
                },
            ),
            (
                VARIANTS[4],
                Verdict::Missed {
                    passed: 0,
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
    }
}
