//! CPU time per unit of work, for the benchmarks: steadier than throughput on a shared
//! machine. Reads `/proc` before and after a run: this process (with the children it
//! waited for, such as `pgbench`) and every process of the database server on this
//! machine (with the children they reaped: PostgreSQL's postmaster gains the whole life
//! of every backend that exits, so backends that end during a run still count).
//! Linux only; elsewhere every figure is 0.
//!
//! ```no_run
//! use outbox_testkit::cpu::{self, Server};
//!
//! let before = cpu::sample(Server::Postgres);
//! // ... publish 1,000 messages ...
//! let (client_us, server_us) = cpu::since(before).per(1_000);
//! ```

use std::fs;

/// `USER_HZ`: the unit of `/proc/<pid>/stat`'s times, 100 on Linux whatever the
/// kernel's own tick rate.
const TICKS_PER_SECOND: f64 = 100.0;

/// Which processes are the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Server {
    /// Every process named `postgres` (the postmaster, backends, walsenders).
    Postgres,
    /// Every process named `mariadbd` or `mysqld`.
    MySql,
    /// Every Java process running `DynamoDBLocal.jar`.
    DynamoDbLocal,
    /// Every process named `nats-server`.
    Nats,
    /// Every Erlang VM (`beam.smp`) running RabbitMQ.
    RabbitMq,
    /// No server on this machine: only this process is measured.
    None,
}

impl Server {
    /// Whether the process whose `/proc/<pid>` is `dir`, with `stat` read from it, is
    /// one of the server's.
    fn matches(self, dir: &std::path::Path, stat: &str) -> bool {
        match self {
            Server::Postgres => comm(stat) == Some("postgres"),
            Server::MySql => matches!(comm(stat), Some("mariadbd" | "mysqld")),
            Server::DynamoDbLocal => fs::read(dir.join("cmdline"))
                .is_ok_and(|c| c.windows(13).any(|w| w == b"DynamoDBLocal")),
            Server::Nats => comm(stat) == Some("nats-server"),
            Server::RabbitMq => {
                comm(stat) == Some("beam.smp")
                    && fs::read(dir.join("cmdline"))
                        .is_ok_and(|c| c.windows(6).any(|w| w == b"rabbit"))
            }
            Server::None => false,
        }
    }
}

/// Clock ticks of CPU (user + system, with waited-for children) at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    server_kind: Server,
    own: u64,
    server: u64,
}

/// CPU spent between a [`Sample`] and [`since`], in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spent {
    /// This process, plus the children it waited for.
    pub client_us: f64,
    /// The server's processes on this machine.
    pub server_us: f64,
}

impl Spent {
    /// Client and server microseconds per unit, for `units` units of work.
    pub fn per(&self, units: u64) -> (f64, f64) {
        let n = units.max(1) as f64;
        (self.client_us / n, self.server_us / n)
    }
}

/// Read the counters now.
pub fn sample(server: Server) -> Sample {
    let own = fs::read_to_string("/proc/self/stat").map_or(0, |t| ticks(&t));
    let mut total = 0;
    if server != Server::None {
        if let Ok(entries) = fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let pid = entry.file_name();
                if !pid.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                let dir = entry.path();
                let Ok(stat) = fs::read_to_string(dir.join("stat")) else {
                    continue;
                };
                if server.matches(&dir, &stat) {
                    total += ticks(&stat);
                }
            }
        }
    }
    Sample {
        server_kind: server,
        own,
        server: total,
    }
}

/// CPU spent since `before`.
pub fn since(before: Sample) -> Spent {
    let after = sample(before.server_kind);
    let us = |ticks: u64| ticks as f64 * 1e6 / TICKS_PER_SECOND;
    Spent {
        client_us: us(after.own.saturating_sub(before.own)),
        server_us: us(after.server.saturating_sub(before.server)),
    }
}

/// The process name, between the parentheses of a `stat` line.
fn comm(stat: &str) -> Option<&str> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    stat.get(open + 1..close)
}

/// `utime + stime + cutime + cstime`: fields 14 to 17 of a `stat` line, counted after
/// the name (which may hold spaces and parentheses).
fn ticks(stat: &str) -> u64 {
    let Some(close) = stat.rfind(')') else {
        return 0;
    };
    stat[close + 1..]
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_four_times_after_the_name() {
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17";
        assert_eq!(comm(stat), Some("a (b) c"));
        // After the name: state, then 10 more fields, then utime..cstime = 11..14.
        assert_eq!(ticks(stat), 11 + 12 + 13 + 14);
        assert_eq!(ticks("no name"), 0);
    }

    #[test]
    fn this_process_spends_cpu() {
        let before = sample(Server::None);
        // Busy until the kernel has counted a tick of it (or a generous deadline).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut x = 0u64;
        let spent = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let spent = since(before);
            if spent.client_us > 0.0 || std::time::Instant::now() > deadline {
                break spent;
            }
        };
        if cfg!(target_os = "linux") {
            assert!(spent.client_us > 0.0, "{spent:?}");
        }
        assert_eq!(spent.server_us, 0.0);
        assert_eq!(spent.per(0), (spent.client_us, 0.0));
    }
}
