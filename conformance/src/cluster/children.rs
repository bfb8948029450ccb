//! Child processes (etcd, kube-apiserver, the operator under test …) that never outlive the suite.
//!
//! Three layers, because each covers a way the suite can end:
//! - normal end: [`ManagedChild`] stops its process group on `stop`/drop (SIGTERM, then SIGKILL
//!   after a grace period);
//! - Ctrl-C / SIGTERM: [`install_interrupt_handler`] (called by every spawn) stops every registered
//!   group, removes registered scratch folders and exits with 130;
//! - the suite is killed (SIGKILL, panic=abort …): children carry `PR_SET_PDEATHSIG=SIGKILL`.
//!   Linux delivers it when the *thread* that spawned the child ends, so spawn from async tasks
//!   (runtime worker threads), not from `spawn_blocking`.
use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// How long a child gets between SIGTERM and SIGKILL by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

static PROCESS_GROUPS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());
static SCRATCH_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Commands the interrupt handler runs (e.g. `kind delete cluster`), by id.
static CLEANUP_COMMANDS: Mutex<Vec<(String, Vec<String>)>> = Mutex::new(Vec::new());
static HANDLER: OnceLock<()> = OnceLock::new();

/// A child process in its own process group, with stdout and stderr appended to a log file.
#[derive(Debug)]
pub struct ManagedChild {
    name: String,
    pid: u32,
    child: tokio::process::Child,
    exit: Option<ExitStatus>,
}

impl ManagedChild {
    /// Spawns `command` (its stdio is replaced) with output appended to `log`.
    pub fn spawn(
        name: &str,
        mut command: tokio::process::Command,
        log: &Path,
    ) -> anyhow::Result<Self> {
        install_interrupt_handler();
        let log_file = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening log file {}", log.display()))?;
        let log_err = log_file
            .try_clone()
            .with_context(|| format!("duplicating log file {}", log.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file))
            .stderr(Stdio::from(log_err))
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
        // async-signal-safe; it allocates nothing and touches no locks.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let pid = child
            .id()
            .with_context(|| format!("{name} exited before its pid was known"))?;
        lock(&PROCESS_GROUPS).insert(pid_i32(pid));
        Ok(Self {
            name: name.to_owned(),
            pid,
            child,
            exit: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `Some(status)` once the process has exited (it is reaped here).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
            if self.exit.is_some() {
                self.unregister();
            }
        }
        self.exit
    }

    /// SIGSTOP to the group: the process stops where it is, its timers and peers do not.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// SIGCONT to the group, after [`Self::pause`].
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// SIGTERM to the group, as a kubelet stops a pod's processes; wait up to `grace` until
    /// every process of the group has exited (a wrapper shell dies at once, the program behind it
    /// may still be releasing its Lease), then SIGKILL what is left and wait for the exit.
    pub async fn stop(&mut self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        // A paused process handles SIGTERM only once it runs again.
        self.signal(Signal::SIGCONT);
        let deadline = Instant::now() + grace;
        while self.group_runs() && Instant::now() < deadline {
            tokio::time::sleep(POLL).await;
        }
        self.kill().await;
    }

    /// Whether the child or any other process of its group still runs.
    fn group_runs(&mut self) -> bool {
        self.exit_status().is_none() || group_has_live_process(pid_i32(self.pid))
    }

    /// SIGKILL to the group (a crash, as far as the process can tell) and wait for the exit.
    pub async fn kill(&mut self) {
        if self.exit_status().is_none() {
            self.signal(Signal::SIGKILL);
            if let Ok(status) = self.child.wait().await {
                self.exit = Some(status);
            }
        }
        // The leader is gone; helpers it left in its group go too.
        self.signal(Signal::SIGKILL);
        self.unregister();
    }

    /// `stop` for places that cannot await (Drop).
    pub fn stop_blocking(&mut self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        self.signal(Signal::SIGCONT);
        let deadline = Instant::now() + grace;
        while self.group_runs() && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        if self.exit_status().is_none() {
            self.signal(Signal::SIGKILL);
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.exit_status().is_none() && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
        }
        self.signal(Signal::SIGKILL);
        self.unregister();
    }

    fn signal(&self, signal: Signal) {
        // ESRCH (already gone) is the expected outcome of a late signal.
        let _ = killpg(Pid::from_raw(pid_i32(self.pid)), signal);
    }

    fn unregister(&self) {
        lock(&PROCESS_GROUPS).remove(&pid_i32(self.pid));
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        if self.exit.is_none() {
            self.stop_blocking(DEFAULT_GRACE);
        }
        self.unregister();
    }
}

/// Registers a scratch folder that the interrupt handler removes.
pub fn register_scratch_dir(dir: &Path) {
    lock(&SCRATCH_DIRS).push(dir.to_path_buf());
}

/// Forgets a folder registered with [`register_scratch_dir`] (its owner removes it).
pub fn unregister_scratch_dir(dir: &Path) {
    lock(&SCRATCH_DIRS).retain(|d| d != dir);
}

/// Registers a command (program and arguments) that the interrupt handler runs after stopping
/// the children, e.g. deleting a kind cluster; `id` names it for [`unregister_cleanup_command`].
/// Installs the handler.
pub fn register_cleanup_command(id: &str, command: Vec<String>) {
    install_interrupt_handler();
    let mut commands = lock(&CLEANUP_COMMANDS);
    commands.retain(|(known, _)| known != id);
    commands.push((id.to_owned(), command));
}

/// Forgets a command registered with [`register_cleanup_command`] (its owner ran it, or keeps
/// what it would remove).
pub fn unregister_cleanup_command(id: &str) {
    lock(&CLEANUP_COMMANDS).retain(|(known, _)| known != id);
}

/// Pids (= process group ids) of every child currently registered.
pub fn registered_pids() -> Vec<u32> {
    lock(&PROCESS_GROUPS)
        .iter()
        .filter_map(|pid| u32::try_from(*pid).ok())
        .collect()
}

/// True while a process of group `group` has not exited (zombies count as exited), e.g. the
/// program a wrapper shell started after the shell itself died.
pub fn group_has_live_process(group: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // No /proc: whether any member of the group can still be signalled.
        return killpg(Pid::from_raw(group), None).is_ok();
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .any(|stat| {
            // After the parenthesised command: state, ppid, pgrp.
            let mut fields = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace())
                .into_iter()
                .flatten();
            let state = fields.next().unwrap_or("X");
            let pgrp = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
            pgrp == Some(group) && state != "Z" && state != "X"
        })
}

/// True while `pid` names a process that has not exited (zombies count as exited).
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 is the state; the command name before it is parenthesised and may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) if Path::new("/proc/self").exists() => false,
        Err(_) => nix::sys::signal::kill(Pid::from_raw(pid_i32(pid)), None).is_ok(),
    }
}

/// Installs (once per process) a Ctrl-C / SIGTERM handler that stops every registered child,
/// removes registered scratch folders and exits with status 130. It runs on a thread of its own
/// (with a one-thread runtime), so it outlives whichever runtime spawned the first child.
pub fn install_interrupt_handler() {
    HANDLER.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("conformance-interrupt".to_owned())
            .spawn(|| {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        tracing::warn!(error = %e, "no interrupt handler: children rely on PDEATHSIG");
                        return;
                    }
                };
                runtime.block_on(async {
                    wait_for_interrupt().await;
                    eprintln!("interrupted: stopping child processes and removing scratch folders");
                    terminate_registered(DEFAULT_GRACE).await;
                });
                std::process::exit(130);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no interrupt handler: children rely on PDEATHSIG");
        }
    });
}

async fn wait_for_interrupt() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn terminate_registered(grace: Duration) {
    let groups: Vec<i32> = lock(&PROCESS_GROUPS).iter().copied().collect();
    for group in &groups {
        let _ = killpg(Pid::from_raw(*group), Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && groups.iter().any(|g| u32::try_from(*g).is_ok_and(is_alive))
    {
        tokio::time::sleep(POLL).await;
    }
    for group in &groups {
        let _ = killpg(Pid::from_raw(*group), Signal::SIGKILL);
    }
    let dirs: Vec<PathBuf> = lock(&SCRATCH_DIRS).drain(..).collect();
    for dir in dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
    let commands: Vec<(String, Vec<String>)> = lock(&CLEANUP_COMMANDS).drain(..).collect();
    for (id, command) in commands {
        let Some((program, args)) = command.split_first() else {
            continue;
        };
        eprintln!("interrupted: {id}: {}", command.join(" "));
        match std::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .status()
        {
            Ok(status) if status.success() => {}
            Ok(status) => eprintln!("interrupted: {id} failed ({status})"),
            Err(error) => eprintln!("interrupted: {id} could not run: {error}"),
        }
    }
}

fn pid_i32(pid: u32) -> i32 {
    // Linux pids are at most 2^22; the conversion cannot fail for a real pid.
    i32::try_from(pid).unwrap_or(i32::MAX)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data behind; keep using it.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Last `n` lines of a text file (empty when it does not exist yet).
pub fn tail_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    last_lines(&text, n)
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a\n", 5), "a");
        assert_eq!(last_lines("", 3), "");
    }

    #[tokio::test]
    async fn stop_ends_the_child_and_its_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("child.log");
        let mut command = tokio::process::Command::new("sh");
        // The shell ignores SIGTERM so the SIGKILL escalation is exercised; `sleep` is a
        // grandchild in the same group.
        command.args(["-c", "trap '' TERM; echo started; sleep 600 & wait"]);
        let mut child = ManagedChild::spawn("sleeper", command, &log).expect("spawn");
        let pid = child.pid();
        assert!(is_alive(pid));
        assert!(registered_pids().contains(&pid));
        // Wait until the trap is installed, else SIGTERM would end the shell at once.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tail_lines(&log, 5).contains("started") {
            assert!(
                Instant::now() < deadline,
                "the child never wrote to its log"
            );
            tokio::time::sleep(POLL).await;
        }
        child.stop(Duration::from_millis(300)).await;
        assert!(child.exit_status().is_some());
        assert!(!is_alive(pid));
        assert!(!registered_pids().contains(&pid));
    }

    /// `sh -c 'operator; exit $?'`: SIGTERM ends the shell at once while the program behind it
    /// still winds down (releasing its Lease); the program gets its grace, not a SIGKILL.
    #[tokio::test]
    async fn stop_waits_for_the_program_behind_a_wrapper_shell() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("child.log");
        let done = dir.path().join("wound-down");
        let program = format!(
            "trap 'sleep 1; touch {}; exit 0' TERM; echo started; while :; do sleep 0.1; done",
            done.display()
        );
        let mut command = tokio::process::Command::new("sh");
        command.args(["-c", &format!("sh -c \"{program}\"; exit $?")]);
        let mut child = ManagedChild::spawn("wrapped", command, &log).expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tail_lines(&log, 5).contains("started") {
            assert!(Instant::now() < deadline, "the program never started");
            tokio::time::sleep(POLL).await;
        }
        let group = pid_i32(child.pid());
        child.stop(Duration::from_secs(10)).await;
        assert!(done.exists(), "the program was killed before it wound down");
        assert!(!group_has_live_process(group));
    }
}
