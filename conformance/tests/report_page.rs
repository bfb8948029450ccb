//! The report page in a real browser: `conformance report --html` renders a sample report (passes,
//! one failure, one skip), and headless Chromium loads it from a file, takes a screenshot and
//! dumps its DOM.
//!
//! Chromium is `$CHROMIUM`, else `chromium` or `chromium-browser` on the PATH (`.ci/run` installs
//! Debian's `chromium`). Without it the test FAILS, unless `CONFORMANCE_SKIP_BROWSER_TEST` names
//! the reason to skip it, which is printed. `CONFORMANCE_REPORT_SCREENSHOT=<file.png>` keeps a copy
//! of the screenshot (how docs/images/report.png was made).
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use conformance::report::model::{
    ConformanceReport, Environment, FeatureFile, Implementation, Level, ManifestSet, RuleCoverage,
    RuleScenario, RuleVerdict, SCHEMA, ScenarioResult, Setup, SetupTimeouts, Status, Suite,
    files_digest, sha256_hex, summarise,
};

/// How long one Chromium run may take before the test gives up on it.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// `$CHROMIUM` (which must exist when set), else `chromium` or `chromium-browser` on the PATH.
fn find_chromium() -> Result<PathBuf, String> {
    if let Some(named) = std::env::var_os("CHROMIUM").filter(|v| !v.is_empty()) {
        let named = PathBuf::from(named);
        return on_path(&named).ok_or_else(|| {
            format!(
                "$CHROMIUM is {}, which is not an executable",
                named.display()
            )
        });
    }
    ["chromium", "chromium-browser"]
        .iter()
        .find_map(|name| on_path(Path::new(name)))
        .ok_or_else(|| {
            "no Chromium: neither $CHROMIUM nor chromium or chromium-browser on the PATH".to_owned()
        })
}

/// `program` itself when it is a path, else the first match on the PATH.
fn on_path(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Runs `command` to its end, killing it after [`BROWSER_TIMEOUT`].
fn run_with_timeout(mut command: Command) -> Output {
    let described = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {described}: {e}"));
    // Read the pipes while waiting, so that a full pipe cannot stall the browser.
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let read = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let (stdout, stderr) = (read(Box::new(stdout)), read(Box::new(stderr)));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the browser") {
            break status;
        }
        if started.elapsed() > BROWSER_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{described} did not finish within {BROWSER_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn file(path: &str) -> FeatureFile {
    FeatureFile {
        path: path.to_owned(),
        sha256: sha256_hex(path.as_bytes()),
    }
}

fn manifests(source: &str, paths: &[&str]) -> ManifestSet {
    let files: Vec<FeatureFile> = paths.iter().map(|p| file(p)).collect();
    ManifestSet {
        source: source.to_owned(),
        sha256: files_digest(&files),
        files,
    }
}

fn scenario(
    feature: &str,
    line: usize,
    name: &str,
    level: Level,
    rules: &[&str],
    duration_ms: u64,
) -> ScenarioResult {
    ScenarioResult {
        feature: feature.to_owned(),
        scenario: name.to_owned(),
        line,
        level: Some(level),
        rules: rules.iter().map(|r| (*r).to_owned()).collect(),
        tags: [if level == Level::Core {
            "core"
        } else {
            "extended"
        }]
        .into_iter()
        .chain(rules.iter().copied())
        .map(str::to_owned)
        .collect(),
        status: Status::Passed,
        flaky: false,
        attempts: 1,
        duration_ms,
        reason: None,
        coderd_calls: None,
        diagnostics: None,
        failed_step: None,
        failed_rules: Vec::new(),
    }
}

/// What a scenario says of one of its rules.
fn verdict_on(result: &ScenarioResult, rule: &str) -> RuleVerdict {
    match result.status {
        Status::Passed => RuleVerdict::Passed,
        Status::Skipped if result.attempts == 0 => RuleVerdict::NotRun,
        Status::Skipped => RuleVerdict::NotReached,
        Status::Failed if result.failed_rules.iter().any(|r| r == rule) => RuleVerdict::Failed,
        Status::Failed => RuleVerdict::Passed,
    }
}

/// A vendor's operator on the local tier: passes, one Core failure with its diagnostics, one
/// Extended skip (leader election needs `--replica-cmd`), and a rule no scenario can observe.
fn sample_report() -> ConformanceReport {
    let mut results = vec![
        scenario(
            "crd.feature",
            8,
            "The CRDs are Established",
            Level::Core,
            &["R-CRD-1", "R-CRD-2"],
            1353,
        ),
        scenario(
            "key_lifecycle.feature",
            8,
            "The first reconcile creates exactly one key and stores it",
            Level::Core,
            &["R-KEY-1", "R-KEY-2", "R-KEY-3"],
            16943,
        ),
        scenario(
            "key_lifecycle.feature",
            40,
            "A provisioner without tags creates its key with none",
            Level::Core,
            &["R-KEY-3"],
            8612,
        ),
        scenario(
            "key_secret.feature",
            7,
            "The operator creates and owns the key Secret",
            Level::Core,
            &["R-SEC-1", "R-SEC-2"],
            4456,
        ),
        scenario(
            "cleanup.feature",
            12,
            "Deleting the provisioner deletes its key in coderd",
            Level::Core,
            &["R-DEL-2", "R-DEL-4"],
            12043,
        ),
        scenario(
            "stability.feature",
            32,
            "A steady provisioner makes no coderd requests",
            Level::Core,
            &["R-KEY-4", "R-KEY-9"],
            13124,
        ),
        scenario(
            "rbac.feature",
            11,
            "The provisioner's Role, RoleBinding and ServiceAccount",
            Level::Core,
            &["R-RBAC-1", "R-RBAC-2"],
            5186,
        ),
        scenario(
            "crd.feature",
            15,
            "kubectl shows the phase, the ready replicas and the age",
            Level::Extended,
            &["R-CRD-3"],
            366,
        ),
        scenario(
            "rate_limit.feature",
            8,
            "A rate-limited key request is reported and retried later",
            Level::Extended,
            &["R-RL-1", "R-RL-4"],
            20990,
        ),
        scenario(
            "leader_election.feature",
            23,
            "A leader paused in the middle of a pass changes nothing when it wakes",
            Level::Extended,
            &["R-HA-1", "R-HA-2"],
            0,
        ),
    ];
    let failed = &mut results[5];
    failed.status = Status::Failed;
    failed.failed_step = Some(36);
    failed.failed_rules = vec!["R-KEY-9".to_owned()];
    failed.reason = Some(
        "step \"Then coderd receives no request with the operator's token for 8 s\" failed: \
         2 requests within the hold window: POST /api/v2/organizations/default/provisionerkeys (2)"
            .to_owned(),
    );
    failed.diagnostics =
        Some("diagnostics/stability-32-a-steady-provisioner-makes-no-coderd-requests".to_owned());
    let skipped = &mut results[9];
    skipped.status = Status::Skipped;
    skipped.attempts = 0;
    skipped.reason = Some(
        "runs two leader-elected replicas of the operator: the suite starts them only for an operator it starts \
         itself (not on kind, k3s or --operator installed), and for --operator-cmd only with --replica-cmd"
            .to_owned(),
    );
    results[8].flaky = true;
    results[8].attempts = 2;

    let mut rules: Vec<(String, Level)> = Vec::new();
    for result in &results {
        for rule in &result.rules {
            if !rules.iter().any(|(r, _)| r == rule) {
                rules.push((rule.clone(), result.level.expect("a level")));
            }
        }
    }
    let mut coverage: Vec<RuleCoverage> = rules
        .into_iter()
        .map(|(rule, level)| {
            let scenarios: Vec<RuleScenario> = results
                .iter()
                .filter(|r| r.rules.contains(&rule))
                .map(|r| RuleScenario {
                    feature: r.feature.clone(),
                    line: r.line,
                    status: r.status,
                    verdict: Some(verdict_on(r, &rule)),
                })
                .collect();
            RuleCoverage {
                verdict: Some(RuleVerdict::combine(
                    scenarios.iter().filter_map(|s| s.verdict),
                )),
                level,
                seeded_variants: if rule == "R-KEY-9" {
                    vec!["steady-state-rotates-key".to_owned()]
                } else {
                    Vec::new()
                },
                rule,
                scenarios,
                unobservable: None,
            }
        })
        .collect();
    coverage.push(RuleCoverage {
        rule: "R-W-3".to_owned(),
        level: Level::Extended,
        verdict: Some(RuleVerdict::NotRun),
        scenarios: Vec::new(),
        seeded_variants: Vec::new(),
        unobservable: Some(
            "reconciling a deleted CR is a no-op with no observable output; the suite only sees that the operator keeps running"
                .to_owned(),
        ),
    });
    coverage.sort_by(|a, b| a.rule.cmp(&b.rule));

    let features = [
        "cleanup.feature",
        "crd.feature",
        "key_lifecycle.feature",
        "key_secret.feature",
        "leader_election.feature",
        "rate_limit.feature",
        "rbac.feature",
        "stability.feature",
    ];
    ConformanceReport {
        schema: SCHEMA.to_owned(),
        implementation: Implementation {
            name: "acme-operator".to_owned(),
            version: "1.2.3".to_owned(),
            url: "https://example.com/acme-operator".to_owned(),
            contact: "team@example.com".to_owned(),
            mode: "command".to_owned(),
        },
        suite: Suite {
            version: "0.1.0".to_owned(),
            git_commit: "b6a4abf0c1d2e3f405162738495a6b7c8d9e0f1a".to_owned(),
            features_source: "embedded".to_owned(),
            features: features.iter().map(|f| file(f)).collect(),
        },
        environment: Environment {
            tier: "local".to_owned(),
            coderd: "fake".to_owned(),
            simulated: vec![
                "Deployment readiness: the control plane has no kubelet, so the suite sets Deployment status \
                 (readyReplicas) once the pod template is valid (contract D-8); provisioner pods never run"
                    .to_owned(),
            ],
        },
        setup: Some(Setup {
            mode: "command".to_owned(),
            operator_command: Some(
                "./bin/manager --leader-elect=false --kubeconfig \"$KUBECONFIG\" --token ********".to_owned(),
            ),
            rbac: Some(manifests(
                "./config/rbac",
                &["role.yaml", "role_binding.yaml", "service_account.yaml"],
            )),
            crds: manifests(
                "embedded",
                &["coder.com_codercontrolplanes.yaml", "coder.com_coderprovisioners.yaml"],
            ),
            extra_manifests: None,
            control_plane_access: "read-write".to_owned(),
            tier: "local".to_owned(),
            timeouts: SetupTimeouts {
                eventually_ms: 30_000,
                hold_window_ms: 8_000,
                hold_window_measured: None,
                interval_ms: 200,
                reach_and_hold: 2,
                hold_observations: 3,
                timeout_scale: None,
            },
            retries: 1,
            concurrency: 16,
        }),
        aborted: None,
        started_at: "2026-12-05T13:02:37Z".to_owned(),
        duration_ms: 96_412,
        summary: summarise(&[]),
        results,
        coverage,
        digest: String::new(),
    }
    .seal()
    .expect("sealing the sample report")
}

#[test]
fn the_report_page_renders_in_chromium() {
    let chromium = match find_chromium() {
        Ok(path) => path,
        Err(missing) => match std::env::var("CONFORMANCE_SKIP_BROWSER_TEST") {
            Ok(reason) if !reason.trim().is_empty() => {
                // Straight to stderr: the test harness captures println! of a passing test.
                let _ = writeln!(
                    std::io::stderr(),
                    "report_page: SKIPPED on purpose ({missing}): {reason}"
                );
                return;
            }
            _ => panic!(
                "{missing}. Install it (Debian: apt-get install -y chromium), point $CHROMIUM at it, or set \
                 CONFORMANCE_SKIP_BROWSER_TEST to the reason for skipping this test"
            ),
        },
    };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let yaml = dir.path().join("conformance-report.yaml");
    std::fs::write(&yaml, sample_report().to_yaml().expect("YAML")).expect("writing the YAML");

    // The subcommand, with its default output beside the YAML.
    let rendered = Command::new(env!("CARGO_BIN_EXE_conformance"))
        .arg("report")
        .arg("--html")
        .arg(&yaml)
        .output()
        .expect("running conformance report");
    assert!(
        rendered.status.success(),
        "conformance report --html failed: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let page = dir.path().join("report.html");
    assert!(page.is_file(), "no report.html beside the YAML");
    let url = url::Url::from_file_path(&page).expect("a file URL");

    let browser = |extra: &[&str]| {
        let mut command = Command::new(&chromium);
        command
            .args([
                "--headless=new",
                "--disable-gpu",
                "--no-sandbox",
                "--hide-scrollbars",
                "--no-first-run",
                // Paint everything (and let the layout settle) before the screenshot.
                "--run-all-compositor-stages-before-draw",
                "--virtual-time-budget=5000",
                "--window-size=1280,1600",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.path().join("profile").display()
            ))
            .args(extra)
            .arg(url.as_str());
        run_with_timeout(command)
    };

    let screenshot = dir.path().join("report.png");
    let shot = browser(&[&format!("--screenshot={}", screenshot.display())]);
    assert!(
        shot.status.success(),
        "chromium --screenshot failed ({}): {}",
        shot.status,
        String::from_utf8_lossy(&shot.stderr)
    );
    let size = std::fs::metadata(&screenshot)
        .unwrap_or_else(|e| {
            panic!(
                "no screenshot at {} ({e}); chromium said: {}",
                screenshot.display(),
                String::from_utf8_lossy(&shot.stderr)
            )
        })
        .len();
    assert!(size > 0, "the screenshot is empty");
    let png = std::fs::read(&screenshot).expect("reading the screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "the screenshot is not a PNG"
    );
    if let Some(keep) = std::env::var_os("CONFORMANCE_REPORT_SCREENSHOT").filter(|v| !v.is_empty())
    {
        std::fs::copy(&screenshot, &keep).expect("copying the screenshot");
        println!(
            "report_page: screenshot copied to {}",
            PathBuf::from(keep).display()
        );
    }

    let dumped = browser(&["--dump-dom"]);
    assert!(
        dumped.status.success(),
        "chromium --dump-dom failed ({}): {}",
        dumped.status,
        String::from_utf8_lossy(&dumped.stderr)
    );
    let dom = String::from_utf8_lossy(&dumped.stdout);
    for expected in [
        "<h2 id=\"summary\">Summary and claims</h2>",
        "Conformance report: acme-operator",
        "1 Core scenario failed",
        "href=\"#rule-R-KEY-9\"",
        "diagnostics/stability-32-a-steady-provisioner-makes-no-coderd-requests/",
        "runs two leader-elected replicas of the operator",
    ] {
        assert!(
            dom.contains(expected),
            "{expected:?} not in the dumped DOM:\n{dom}"
        );
    }
}
