//! The operator's footprint from `/proc/<pid>`: peak resident set (`VmHWM`) and CPU time
//! (`utime + stime`); the CPU time and name of any process (for the CPU breakdown by process).
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

/// utime (field 14) + stime (field 15) of `/proc/<pid>/stat`. The command name (field 2) may
/// contain spaces and parentheses, so fields are counted after its last `)`.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state): field n is at index n - 3.
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
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
