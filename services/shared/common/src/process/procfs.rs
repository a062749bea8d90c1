//! What Linux's `/proc` says about a process and the machine: CPU time,
//! memory figures, the open files limit. Each reader fails (rather than
//! guessing) where the file is missing or not as expected.

use std::io::{Error, ErrorKind, Result};
use std::time::Duration;

/// One clock tick of `/proc`'s CPU times (`USER_HZ`, 1/100 s on Linux).
pub const CLOCK_TICK: Duration = Duration::from_millis(10);

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::new(e.kind(), format!("reading {path}: {e}")))
}

fn malformed(what: String) -> Error {
    Error::new(ErrorKind::InvalidData, what)
}

/// CPU time `pid` has used (user + system, all its threads), in clock
/// ticks ([`CLOCK_TICK`]).
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = read(&path)?;
    // After the command's name, in parentheses (which may hold spaces):
    // state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| malformed(format!("no command name in {path}")))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |at: usize| -> Result<u64> {
        let field = fields
            .get(at)
            .ok_or_else(|| malformed(format!("a short {path}")))?;
        field
            .parse()
            .map_err(|_| malformed(format!("cannot read {field:?} in {path}")))
    };
    Ok(tick(11)? + tick(12)?)
}

/// A memory figure of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`, the
/// peak RSS so far, …).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = read(&path)?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| malformed(format!("no {field} in {path}")))
}

/// The whole machine's CPU time since boot, all cores, in clock ticks:
/// (busy, total), where idle and iowait are not busy (`/proc/stat`).
pub fn machine_ticks() -> Result<(u64, u64)> {
    let stat = read("/proc/stat")?;
    let line = stat
        .lines()
        .find(|line| line.starts_with("cpu "))
        .ok_or_else(|| malformed("no cpu line in /proc/stat".into()))?;
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| malformed(format!("cannot read {line:?}")))?;
    if ticks.len() != 8 {
        return Err(malformed(format!("a short cpu line: {line:?}")));
    }
    let total: u64 = ticks.iter().sum();
    Ok((total - ticks[3] - ticks[4], total))
}

/// The soft and hard limits on open files of `pid` (this process: `None`).
pub fn open_files_limit(pid: Option<u32>) -> Result<(u64, u64)> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/limits"),
        None => "/proc/self/limits".to_owned(),
    };
    let limits = read(&path)?;
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .ok_or_else(|| malformed(format!("no open files limit in {path}")))?;
    let value = |raw: &str| {
        if raw == "unlimited" {
            Some(u64::MAX)
        } else {
            raw.parse().ok()
        }
    };
    let fields: Vec<&str> = line["Max open files".len()..].split_whitespace().collect();
    match (
        fields.first().and_then(|f| value(f)),
        fields.get(1).and_then(|f| value(f)),
    ) {
        (Some(soft), Some(hard)) => Ok((soft, hard)),
        _ => Err(malformed(format!("cannot read {line:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn reads_this_process_s_limits_and_memory() {
        let (soft, hard) = open_files_limit(None).unwrap();
        assert!(soft > 0 && soft <= hard);
        let pid = std::process::id();
        let rss = status_kib(pid, "VmRSS").unwrap();
        assert!(rss > 0);
        assert!(status_kib(pid, "VmHWM").unwrap() >= rss);
        assert!(status_kib(pid, "NoSuchField").is_err());
    }

    #[test]
    fn reads_cpu_time_of_this_process_and_the_machine() {
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_ticks(std::process::id()).unwrap() > 0);
        let (busy, total) = machine_ticks().unwrap();
        assert!(busy > 0 && busy <= total);
    }
}
