//! Suite cost: the wall time of a full `conformance run` on the local tier, as a subprocess.
use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use super::harness::{Contender, Launch};
use super::model::SuiteResult;
use super::stats::millis;
use crate::shared_args::StartedOperatorArgs;

/// What `conformance run` prints once the control plane is up and the CRDs are installed (the
/// fake's release and URL follow).
pub const SETUP_DONE_LINE: &str = "conformance: fake coderd ";
/// The start of the summary line that says how the run used the machine.
const PACE_LINE: &str = "Pace:";

/// The suite's `--tags` default; inherited by the subprocess, so it is reported.
const TAG_FILTER_ENV: &str = "CUCUMBER_FILTER_TAGS";
/// The suite's output, in the implementation's folder.
pub const LOG_FILE: &str = "suite.log";

/// `run` against `contender`, with the RBAC and CRDs the bench was given for it.
pub fn suite_args(
    report_dir: &Path,
    contender: &Contender,
    started: &StartedOperatorArgs,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["run".into(), "--report-dir".into(), report_dir.into()];
    if let Launch::Shell(line) = &contender.launch {
        args.extend(["--operator-cmd".into(), line.into()]);
    }
    for (flag, folder) in [
        (
            "--operator-rbac",
            contender.rbac.as_ref().or(started.operator_rbac.as_ref()),
        ),
        ("--crds", started.crds.as_ref()),
    ] {
        if let Some(folder) = folder {
            args.extend([flag.into(), folder.into()]);
        }
    }
    if contender.read_only {
        args.extend(["--control-plane-access".into(), "read-only".into()]);
    }
    if let Some(dir) = &contender.extra_manifests {
        args.extend(["--extra-manifests".into(), dir.into()]);
    }
    args
}

/// Runs this executable's `run` subcommand against `contender`, with its report in
/// `suite-report` and its output in [`LOG_FILE`] of the contender's folder; `setup_ms` is the
/// time until [`SETUP_DONE_LINE`] appeared on stderr.
pub async fn measure(
    contender: &Contender,
    bench_operator: &StartedOperatorArgs,
) -> anyhow::Result<SuiteResult> {
    let exe = std::env::current_exe().context("locating the conformance executable")?;
    let report_dir = contender.files.join("suite-report");
    std::fs::create_dir_all(&contender.files)
        .with_context(|| format!("creating {}", contender.files.display()))?;
    let log_path = contender.files.join(LOG_FILE);
    let mut log = tokio::fs::File::create(&log_path)
        .await
        .with_context(|| format!("creating {}", log_path.display()))?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&exe)
        .args(suite_args(&report_dir, contender, bench_operator))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} run", exe.display()))?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let mut lines = futures::stream::select(
        tokio_stream_lines(BufReader::new(stdout)),
        tokio_stream_lines(BufReader::new(stderr)),
    );
    let mut setup: Option<Duration> = None;
    let mut pace = None;
    while let Some(line) = lines.next().await {
        if setup.is_none() && line.starts_with(SETUP_DONE_LINE) {
            setup = Some(started.elapsed());
        }
        if let Some(rest) = line.strip_prefix(PACE_LINE) {
            pace = Some(rest.trim().to_owned());
        }
        log.write_all(line.as_bytes()).await?;
        log.write_all(b"\n").await?;
    }
    let status = child.wait().await.context("waiting for the suite")?;
    let wall = started.elapsed();
    Ok(SuiteResult {
        exit_code: status.code(),
        wall_ms: millis(wall),
        setup_ms: setup.map(millis),
        without_setup_ms: setup.map(|s| millis(wall.saturating_sub(s))),
        tag_filter: std::env::var(TAG_FILTER_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty()),
        report_dir: report_dir.display().to_string(),
        pace,
    })
}

fn tokio_stream_lines<R: tokio::io::AsyncBufRead + Unpin + Send + 'static>(
    reader: R,
) -> futures::stream::BoxStream<'static, String> {
    futures::stream::unfold(reader.lines(), |mut lines| async move {
        match lines.next_line().await {
            Ok(Some(line)) => Some((line, lines)),
            _ => None,
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn the_suite_runs_the_command_operator_under_the_benchs_rbac_and_crds() {
        let contender = Contender {
            name: "naive".to_owned(),
            launch: Launch::Shell("env BUG=x ./op run".to_owned()),
            files: PathBuf::from("/out/naive"),
            rbac: None,
            read_only: false,
            extra_manifests: None,
        };
        let started = StartedOperatorArgs {
            operator_rbac: Some(PathBuf::from("/rbac")),
            ..StartedOperatorArgs::default()
        };
        let args = suite_args(Path::new("/out/naive/suite-report"), &contender, &started);
        assert_eq!(
            args,
            [
                "run",
                "--report-dir",
                "/out/naive/suite-report",
                "--operator-cmd",
                "env BUG=x ./op run",
                "--operator-rbac",
                "/rbac"
            ]
            .map(OsString::from)
        );
        let reference = Contender {
            launch: Launch::Reference(PathBuf::from("/bin/op")),
            ..contender
        };
        let args = suite_args(Path::new("/r"), &reference, &StartedOperatorArgs::default());
        assert_eq!(args, ["run", "--report-dir", "/r"].map(OsString::from));
        let own_rbac = Contender {
            rbac: Some(PathBuf::from("/its-rbac")),
            ..reference
        };
        let args = suite_args(Path::new("/r"), &own_rbac, &started);
        assert!(
            args.windows(2)
                .any(|w| w == ["--operator-rbac", "/its-rbac"].map(OsString::from)),
            "{args:?}"
        );
        // An operator as shipped: control planes read-only, its other manifests first.
        let shipped = Contender {
            read_only: true,
            extra_manifests: Some(PathBuf::from("/extras")),
            ..own_rbac
        };
        let args = suite_args(Path::new("/r"), &shipped, &started);
        for pair in [
            ["--control-plane-access", "read-only"],
            ["--extra-manifests", "/extras"],
        ] {
            assert!(
                args.windows(2).any(|w| w == pair.map(OsString::from)),
                "{args:?}"
            );
        }
    }
}
