//! Suite cost: the wall time of a full `conformance run` on the local tier, as a subprocess.
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use super::model::SuiteResult;
use super::stats::millis;

/// What `conformance run` prints once the control plane is up and the CRDs are installed.
pub const SETUP_DONE_LINE: &str = "conformance: fake coderd at";

/// The suite's `--tags` default; inherited by the subprocess, so it is reported.
const TAG_FILTER_ENV: &str = "CUCUMBER_FILTER_TAGS";

/// Runs this executable's `run` subcommand with its report in `out/suite-report` and its output in
/// `out/suite.log`; `setup_ms` is the time until [`SETUP_DONE_LINE`] appeared on stderr.
pub async fn measure(out: &Path) -> anyhow::Result<SuiteResult> {
    let exe = std::env::current_exe().context("locating the conformance executable")?;
    let report_dir = out.join("suite-report");
    let log_path = out.join("suite.log");
    let mut log = tokio::fs::File::create(&log_path)
        .await
        .with_context(|| format!("creating {}", log_path.display()))?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&exe)
        .arg("run")
        .arg("--report-dir")
        .arg(&report_dir)
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
    while let Some(line) = lines.next().await {
        if setup.is_none() && line.starts_with(SETUP_DONE_LINE) {
            setup = Some(started.elapsed());
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
