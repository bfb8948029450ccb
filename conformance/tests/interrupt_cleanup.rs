//! A suite that is interrupted (Ctrl-C) or killed leaves no control-plane process behind.
//!
//! The test re-runs its own executable as a helper that starts a local control plane and waits;
//! the parent then interrupts or kills that helper and checks what remains.
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conformance::cluster::children::is_alive;
use conformance::cluster::local::{LocalControlPlane, LocalOptions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const HELPER_ENV: &str = "CONFORMANCE_INTERRUPT_HELPER";
const TEST_NAME: &str = "interrupted_or_killed_suites_leave_no_control_plane_behind";
const DEADLINE: Duration = Duration::from_secs(30);

struct Helper {
    process: Child,
    pids: Vec<u32>,
    dir: PathBuf,
}

/// Starts the helper and reads the pids and folder it reports once its control plane is ready.
fn start_helper() -> anyhow::Result<Helper> {
    let mut process = Command::new(std::env::current_exe()?)
        .args(["--exact", TEST_NAME, "--nocapture"])
        .env(HELPER_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the helper")?;
    let stdout = process.stdout.take().context("helper stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(report) = line.strip_prefix("HELPER-READY ") {
            let (pids, dir) = report.split_once(' ').context("malformed helper report")?;
            let pids = pids
                .split(',')
                .map(str::parse)
                .collect::<Result<Vec<u32>, _>>()?;
            return Ok(Helper {
                process,
                pids,
                dir: PathBuf::from(dir),
            });
        }
    }
    bail!(
        "the helper ended without starting a control plane ({:?})",
        process.wait()?
    );
}

fn wait_until_gone(pids: &[u32]) -> anyhow::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    while pids.iter().any(|pid| is_alive(*pid)) {
        if Instant::now() >= deadline {
            bail!(
                "children still alive: {:?}",
                pids.iter().filter(|p| is_alive(**p)).collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[test]
fn interrupted_or_killed_suites_leave_no_control_plane_behind() -> anyhow::Result<()> {
    if std::env::var_os(HELPER_ENV).is_some() {
        return run_helper();
    }
    // Ctrl-C: the interrupt handler stops the children, removes the folder and exits with 130.
    let mut helper = start_helper()?;
    assert_eq!(helper.pids.len(), 3);
    kill(Pid::from_raw(helper.process.id() as i32), Signal::SIGINT)?;
    let status = helper.process.wait()?;
    assert_eq!(status.code(), Some(130), "{status:?}");
    wait_until_gone(&helper.pids)?;
    assert!(
        !helper.dir.exists(),
        "{} survived Ctrl-C",
        helper.dir.display()
    );

    // SIGKILL: nothing in the suite runs, the children still die (parent-death signal).
    let mut helper = start_helper()?;
    helper.process.kill()?;
    helper.process.wait()?;
    wait_until_gone(&helper.pids)?;
    // Files cannot be removed by a killed process; tidy up after the check.
    std::fs::remove_dir_all(&helper.dir)?;
    Ok(())
}

fn run_helper() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let plane = LocalControlPlane::start(LocalOptions::default()).await?;
        let pids: Vec<String> = plane.child_pids().iter().map(u32::to_string).collect();
        println!("HELPER-READY {} {}", pids.join(","), plane.dir().display());
        // Until the parent interrupts or kills this process.
        std::future::pending::<()>().await;
        drop(plane);
        Ok(())
    })
}
