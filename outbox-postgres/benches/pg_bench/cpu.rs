//! CPU time per message, which is steadier than throughput on a shared machine: the
//! bench process's own CPU (the relays or the peer client), the CPU of the processes it
//! ran and waited for (pgbench), and the server's (every `postgres` process, with the
//! time of the backends its postmaster reaped), read from `/proc` before and after a
//! run. Linux only; elsewhere every figure is 0.

use std::fs;

/// Clock ticks of CPU (user + system) at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sample {
    own: u64,
    children: u64,
    server: u64,
}

/// CPU spent between two samples, in microseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spent {
    /// This process plus the children it waited for (pgbench).
    pub(crate) client_us: f64,
    /// Every `postgres` process of the machine.
    pub(crate) server_us: f64,
}

impl Spent {
    /// Client and server microseconds per message for `n` messages.
    pub(crate) fn per_message(&self, n: u64) -> (f64, f64) {
        let n = n as f64;
        (self.client_us / n, self.server_us / n)
    }
}

/// Read the counters now.
pub(crate) fn sample() -> Sample {
    let own = stat_fields("/proc/self/stat");
    let mut server = 0;
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let path = entry.path().join("stat");
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            // With the reaped children's time (cutime, cstime): the postmaster's grows
            // by the whole life of every backend that exits, so backends that end
            // during a run (pgbench's, at its end) still count.
            if comm(&text) == Some("postgres") {
                server += fields(&text).iter().sum::<u64>();
            }
        }
    }
    Sample {
        own: own.first().copied().unwrap_or(0) + own.get(1).copied().unwrap_or(0),
        children: own.get(2).copied().unwrap_or(0) + own.get(3).copied().unwrap_or(0),
        server,
    }
}

/// CPU spent since `before`.
pub(crate) fn since(before: Sample) -> Spent {
    let after = sample();
    let us = |ticks: u64| ticks as f64 * 1e6 / ticks_per_second();
    Spent {
        client_us: us((after.own + after.children).saturating_sub(before.own + before.children)),
        server_us: us(after.server.saturating_sub(before.server)),
    }
}

/// `utime stime cutime cstime` of a `/proc/<pid>/stat` file.
fn stat_fields(path: &str) -> Vec<u64> {
    fs::read_to_string(path)
        .map(|text| fields(&text))
        .unwrap_or_default()
}

/// The process name, between the parentheses.
fn comm(stat: &str) -> Option<&str> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    stat.get(open + 1..close)
}

/// Fields 14 to 17 (utime, stime, cutime, cstime), counted after the name.
fn fields(stat: &str) -> Vec<u64> {
    let Some(close) = stat.rfind(')') else {
        return Vec::new();
    };
    stat[close + 1..]
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(0))
        .collect()
}

/// `sysconf(_SC_CLK_TCK)`: 100 on every Linux this runs on (`getconf CLK_TCK`).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}
