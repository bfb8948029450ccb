//! The operator's footprint from `/proc/<pid>`: peak resident set (`VmHWM`) and CPU time
//! (`utime + stime`).
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
        let ticks = parse_cpu_ticks(&stat)
            .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat has no utime/stime fields"))?;
        Ok(Self {
            peak_rss_kib,
            cpu_seconds: ticks as f64 / USER_HZ,
        })
    }
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
    fn this_process_has_a_footprint() {
        let footprint = Footprint::read(std::process::id()).expect("own /proc entry");
        assert!(footprint.peak_rss_kib > 0);
    }
}
