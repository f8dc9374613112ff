//! A private PostgreSQL cluster for one test: its own temp data directory and port,
//! restartable at will, stopped and deleted when dropped (also on panic).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use uuid::Uuid;

/// Ports tried for the private cluster.
const PORTS: std::ops::Range<u16> = 25432..25532;
/// Name of each cluster's temp directory, before a random suffix.
const DIR_PREFIX: &str = "outbox-chaos-pg-";
/// File in that directory holding the id of the test process that made it.
const OWNER_FILE: &str = "owner.pid";

/// A running private cluster. Dropping it stops the server (`-m immediate`) and
/// deletes its directory; it touches nothing it did not create.
#[derive(Debug)]
pub(crate) struct Cluster {
    bindir: PathBuf,
    /// Temp directory holding the data directory, the socket and the server log.
    dir: PathBuf,
    data: PathBuf,
    port: u16,
    /// Run the binaries as the `postgres` OS user (initdb refuses root).
    as_postgres: bool,
    started: bool,
}

/// Why no cluster could be started where the machine simply lacks the means.
#[derive(Debug)]
pub(crate) struct Unavailable(pub(crate) String);

impl Cluster {
    /// Create and start a cluster on a free port in [`PORTS`].
    ///
    /// # Errors
    /// [`Unavailable`] when the PostgreSQL server binaries (or, as root, the `postgres`
    /// user and `runuser`) are missing.
    ///
    /// # Panics
    /// When the binaries exist but `initdb` or `pg_ctl start` fail.
    pub(crate) fn start() -> Result<Cluster, Unavailable> {
        let bindir = server_bindir().ok_or_else(|| {
            Unavailable(
                "no PostgreSQL server binaries (initdb, pg_ctl) in `pg_config --bindir` \
                 or /usr/lib/postgresql/*/bin"
                    .to_owned(),
            )
        })?;
        let as_postgres = is_root();
        if as_postgres && !succeeds(Command::new("runuser").args(["-u", "postgres", "--", "true"]))
        {
            return Err(Unavailable(
                "running as root, and `runuser -u postgres` does not work".to_owned(),
            ));
        }
        reap_orphans(&bindir, as_postgres);
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}", Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).expect("create the cluster's temp directory");
        std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string())
            .expect("record the cluster's owner");
        let mut cluster = Cluster {
            bindir,
            data: dir.join("data"),
            dir,
            port: 0,
            as_postgres,
            started: false,
        };
        if as_postgres {
            let chown = Command::new("chown")
                .arg("postgres:")
                .arg(&cluster.dir)
                .output();
            check("chown the cluster directory", chown);
        }
        let initdb = cluster
            .command("initdb")
            .arg("-D")
            .arg(&cluster.data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .output();
        check("initdb", initdb);
        let mut last_error = String::new();
        for _ in 0..5 {
            let Some(port) = free_port() else { break };
            cluster.port = port;
            let options = format!(
                "-k {} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off \
                 -c max_connections=50",
                cluster.dir.display()
            );
            let started = cluster
                .command("pg_ctl")
                .arg("-D")
                .arg(&cluster.data)
                .arg("-l")
                .arg(cluster.dir.join("server.log"))
                .args(["-w", "-t", "60", "-o", &options, "start"])
                .output();
            match started {
                Ok(out) if out.status.success() => {
                    cluster.started = true;
                    return Ok(cluster);
                }
                // Most likely another process took the port between the probe and
                // the start: try another.
                other => last_error = describe(other),
            }
        }
        panic!(
            "pg_ctl start failed: {last_error}\nserver log:\n{}",
            cluster.server_log()
        );
    }

    /// URL of the cluster's `postgres` database.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Restart the server (fast shutdown: sessions are terminated, in-flight
    /// transactions roll back), waiting until it accepts connections again.
    pub(crate) async fn restart(&self) {
        let mut command = tokio::process::Command::from(self.command("pg_ctl"));
        command
            .arg("-D")
            .arg(&self.data)
            // `-l` again: pg_ctl does not remember it, and without it the server would
            // write to (and hold open) this command's output pipes.
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "60", "-m", "fast", "restart"])
            .kill_on_drop(true);
        let out = match tokio::time::timeout(Duration::from_secs(90), command.output()).await {
            Ok(out) => out,
            Err(_) => panic!("pg_ctl restart did not return within 90 s"),
        };
        if !matches!(&out, Ok(o) if o.status.success()) {
            panic!(
                "pg_ctl restart failed: {}\nserver log:\n{}",
                describe(out),
                self.server_log()
            );
        }
    }

    /// A command running `program` from the cluster's binaries (see [`pg_command`]).
    fn command(&self, program: &str) -> Command {
        pg_command(&self.bindir, &self.dir, self.as_postgres, program)
    }

    fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.started {
            let _ = self
                .command("pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .args(["-w", "-t", "30", "-m", "immediate", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A command running `program` from `bindir`, as `postgres` when needed, in `dir`
/// (`postgres` may not read the test's working directory).
fn pg_command(bindir: &Path, dir: &Path, as_postgres: bool, program: &str) -> Command {
    let path = bindir.join(program);
    let mut command = if as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    };
    command.current_dir(dir);
    command
}

/// Stop and delete clusters left by test processes that were killed before their
/// [`Cluster`] could drop (a SIGKILLed `cargo test`). A cluster whose owner still runs
/// belongs to a concurrent test run and is left alone.
fn reap_orphans(bindir: &Path, as_postgres: bool) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let dir = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(DIR_PREFIX));
        let Ok(owner) = std::fs::read_to_string(dir.join(OWNER_FILE)) else {
            continue;
        };
        let owner_alive = Path::new("/proc").join(owner.trim()).exists();
        if !ours || owner_alive || !Path::new("/proc/self").exists() {
            continue;
        }
        if dir.join("data/postmaster.pid").exists() {
            let _ = pg_command(bindir, &dir, as_postgres, "pg_ctl")
                .arg("-D")
                .arg(dir.join("data"))
                .args(["-w", "-t", "30", "-m", "immediate", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The directory holding `initdb` and `pg_ctl`: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin`.
fn server_bindir() -> Option<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(dir) = from_pg_config.filter(|d| has_server(d)) {
        return Some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_server(bin))
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A port in [`PORTS`] nobody listens on right now.
fn free_port() -> Option<u16> {
    let start = fastrand::u16(PORTS);
    (start..PORTS.end)
        .chain(PORTS.start..start)
        .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
}

fn succeeds(command: &mut Command) -> bool {
    command.output().is_ok_and(|o| o.status.success())
}

fn check(what: &str, out: std::io::Result<Output>) {
    if !matches!(&out, Ok(o) if o.status.success()) {
        panic!("{what} failed: {}", describe(out));
    }
}

fn describe(out: std::io::Result<Output>) -> String {
    match out {
        Ok(o) => format!(
            "{}: {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => e.to_string(),
    }
}
