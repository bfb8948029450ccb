//! The operator's footprint from `/proc/<pid>`: peak resident set (`VmHWM`) and CPU time
//! (`utime + stime`), summed over its process tree; the CPU time and name of any process (for the
//! CPU breakdown by process).
use serde::{Deserialize, Serialize};

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`, fixed at 100 in Linux's ABI).
const USER_HZ: f64 = 100.0;

/// One reading of a process's resource use.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct Footprint {
    /// Peak resident set size since the process started, KiB.
    pub peak_rss_kib: u64,
    /// User + system CPU time since the process started, seconds.
    pub cpu_seconds: f64,
}

impl Footprint {
    /// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`.
    pub fn read(pid: u32) -> anyhow::Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let peak_rss_kib = parse_vm_hwm_kib(&status)
            .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/status has no VmHWM line"))?;
        let cpu_seconds = parse_cpu_seconds(&stat)
            .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat has no utime/stime fields"))?;
        Ok(Self {
            peak_rss_kib,
            cpu_seconds,
        })
    }

    /// The sum over `pid` and its descendants (an operator behind a shell wrapper). The peaks of
    /// different processes add up to at least the tree's real peak; a wrapper adds its own ~1 MiB.
    pub fn read_tree(pid: u32) -> anyhow::Result<Self> {
        let mut total = Self::read(pid)?;
        // A descendant that exits between the listing and the reading is left out.
        for child in descendants(pid) {
            if let Ok(footprint) = Self::read(child) {
                total.peak_rss_kib += footprint.peak_rss_kib;
                total.cpu_seconds += footprint.cpu_seconds;
            }
        }
        Ok(total)
    }
}

/// Every process below `pid`, from the parent pids in `/proc/*/stat`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|child| {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            Some((child, parse_parent_pid(&stat)?))
        })
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (child, _) in parents.iter().filter(|(_, p)| *p == parent) {
            found.push(*child);
            frontier.push(*child);
        }
    }
    found
}

/// User + system CPU time of `pid` since it started, seconds; `None` if it cannot be read (the
/// process is gone, or the file is not in the expected format).
pub fn read_cpu_seconds(pid: u32) -> Option<f64> {
    parse_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The breakdown's name for `pid`, from `/proc/<pid>/comm`; `None` if it cannot be read.
pub fn read_process_name(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(process_name(&comm))
}

/// `/proc/<pid>/comm` → the process's name: the kernel cuts `comm` to 15 bytes, so
/// `kube-controller` stands for `kube-controller-manager`.
pub fn process_name(comm: &str) -> String {
    match comm.trim_end() {
        "kube-controller" => "kube-controller-manager".to_owned(),
        name => name.to_owned(),
    }
}

/// utime + stime of `/proc/<pid>/stat`, in seconds.
pub fn parse_cpu_seconds(stat: &str) -> Option<f64> {
    parse_cpu_ticks(stat).map(|ticks| ticks as f64 / USER_HZ)
}

/// `VmHWM:     12345 kB` → 12345.
pub fn parse_vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// utime (field 14) + stime (field 15) of `/proc/<pid>/stat`.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let utime: u64 = stat_field(stat, 14)?.parse().ok()?;
    let stime: u64 = stat_field(stat, 15)?.parse().ok()?;
    Some(utime + stime)
}

/// ppid (field 4) of `/proc/<pid>/stat`.
pub fn parse_parent_pid(stat: &str) -> Option<u32> {
    stat_field(stat, 4)?.parse().ok()
}

/// Field `n` (1-based, as in proc(5)) of a `/proc/<pid>/stat` line. The command name (field 2)
/// may contain spaces and parentheses, so fields are counted after its last `)`.
fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // after_name starts at field 3 (state).
    after_name.split_whitespace().nth(n.checked_sub(3)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_comes_from_vm_hwm() {
        let status = "Name:\top\nVmPeak:\t  999 kB\nVmHWM:\t   20480 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_vm_hwm_kib(status), Some(20480));
        assert_eq!(parse_vm_hwm_kib("Name:\top\n"), None);
    }

    #[test]
    fn cpu_ticks_skip_a_command_name_with_spaces_and_parentheses() {
        let stat =
            "4242 (op (x) y) S 1 4242 4242 0 -1 4194560 500 0 0 0 150 25 0 0 20 0 9 0 100 1000 200";
        assert_eq!(parse_cpu_ticks(stat), Some(175));
        assert_eq!(parse_cpu_ticks("4242 (op) S 1"), None);
        assert_eq!(parse_cpu_ticks("no parenthesis"), None);
    }

    #[test]
    fn the_parent_pid_is_read_after_the_command_name() {
        let stat = "4242 (sh (x) 1) S 77 4242 4242 0 -1 4194560 500 0 0 0 150 25";
        assert_eq!(parse_parent_pid(stat), Some(77));
        assert_eq!(parse_parent_pid("4242 (op) S"), None);
    }

    #[test]
    fn a_shell_wrapped_process_counts_with_its_shell() {
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 30; true"])
            .spawn()
            .expect("sh");
        let pid = shell.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while descendants(pid).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let below = descendants(pid);
        let alone = Footprint::read(pid).expect("the shell");
        let tree = Footprint::read_tree(pid).expect("the tree");
        shell.kill().expect("kill");
        let _ = shell.wait();
        for child in &below {
            // The shell's sleep outlives the shell.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*child as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert_eq!(below.len(), 1, "the shell's sleep: {below:?}");
        assert!(tree.peak_rss_kib > alone.peak_rss_kib);
        assert!(descendants(u32::MAX).is_empty());
    }

    #[test]
    fn cpu_seconds_are_ticks_over_user_hz() {
        let stat = "7 (etcd) S 1 7 7 0 -1 4194560 500 0 0 0 1234 66 0 0 20 0 9 0 100 1000 200";
        assert_eq!(parse_cpu_seconds(stat), Some(13.0));
        assert_eq!(parse_cpu_seconds("7 (etcd) S 1"), None);
    }

    #[test]
    fn the_truncated_controller_manager_comm_gets_its_full_name() {
        assert_eq!(process_name("kube-controller\n"), "kube-controller-manager");
        assert_eq!(process_name("kube-apiserver\n"), "kube-apiserver");
        assert_eq!(process_name("etcd\n"), "etcd");
    }

    #[test]
    fn this_process_has_cpu_time_and_a_name_and_a_missing_one_has_none() {
        let pid = std::process::id();
        assert!(read_cpu_seconds(pid).is_some_and(|s| s >= 0.0));
        assert!(read_process_name(pid).is_some_and(|name| !name.is_empty()));
        // Above the largest pid Linux hands out (2^22).
        assert_eq!(read_cpu_seconds(u32::MAX), None);
        assert_eq!(read_process_name(u32::MAX), None);
    }

    #[test]
    fn this_process_has_a_footprint() {
        let footprint = Footprint::read(std::process::id()).expect("own /proc entry");
        assert!(footprint.peak_rss_kib > 0);
    }
}
