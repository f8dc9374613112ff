//! A private PostgreSQL cluster for one test or benchmark: its own temp data directory
//! and port, its own server settings, restartable at will, stopped and deleted when
//! dropped (also on panic).
//!
//! What the shared test server cannot give: a server to restart under a running test
//! (`outbox-chaos`), or server settings of one's own (`pg_bench`'s soak runs with
//! autovacuum on, which the shared server has off). Needs the PostgreSQL server
//! binaries (`initdb`, `pg_ctl`); as root, also the `postgres` OS user and `runuser`,
//! since `initdb` refuses root. Depends on nothing but std, tokio's blocking pool and
//! uuid: no database driver.
//!
//! ```no_run
//! use outbox_testkit::postgres::cluster::Cluster;
//!
//! match Cluster::start_with(&[("autovacuum", "on"), ("log_autovacuum_min_duration", "0")]) {
//!     Ok(cluster) => println!("connect to {}", cluster.url()),
//!     Err(why) => println!("SKIPPED: no private cluster: {why}"),
//! }
//! // Dropped: the server is stopped and its directory deleted.
//! ```

use std::fmt;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use uuid::Uuid;

/// Ports tried for a private cluster.
pub const PORTS: std::ops::Range<u16> = 25432..25532;
/// Name of each cluster's temp directory, before a random suffix.
const DIR_PREFIX: &str = "outbox-pg-cluster-";
/// The prefix `outbox-chaos` used before the cluster moved here: its orphans are
/// reaped too.
const LEGACY_DIR_PREFIX: &str = "outbox-chaos-pg-";
/// File in that directory holding the id of the process that made it.
const OWNER_FILE: &str = "owner.pid";
/// Settings every cluster starts with, before the caller's (which win): no fsync (the
/// data is thrown away) and room for a few pools.
const BASE_SETTINGS: [(&str, &str); 2] = [("fsync", "off"), ("max_connections", "50")];

/// A running private cluster. Dropping it stops the server (`-m immediate`) and
/// deletes its directory; it touches nothing it did not create.
#[derive(Debug)]
pub struct Cluster {
    bindir: PathBuf,
    /// Temp directory holding the data directory, the socket and the server log.
    dir: PathBuf,
    data: PathBuf,
    port: u16,
    /// Run the binaries as the `postgres` OS user (initdb refuses root).
    as_postgres: bool,
    started: bool,
}

/// Why no cluster could be started where the machine simply lacks the means (no
/// server binaries; as root, no `postgres` user or `runuser`): callers print a skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

impl Cluster {
    /// Create and start a cluster with the server's default settings (plus
    /// `fsync = off`, `max_connections = 50`) on a free port in [`PORTS`].
    ///
    /// # Errors
    /// [`Unavailable`] when the PostgreSQL server binaries (or, as root, the `postgres`
    /// user and `runuser`) are missing.
    ///
    /// # Panics
    /// When the binaries exist but `initdb` or `pg_ctl start` fail.
    pub fn start() -> Result<Cluster, Unavailable> {
        Cluster::start_with(&[])
    }

    /// [`start`](Self::start) with these server settings (`postgresql.conf` names and
    /// values, e.g. `("autovacuum", "on")`), written to the cluster's
    /// `postgresql.conf` after the base ones, so they win over them.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    ///
    /// # Panics
    /// As [`start`](Self::start); also for a setting name that is not a plain
    /// PostgreSQL parameter name (`[a-z0-9_.]`).
    pub fn start_with(settings: &[(&str, &str)]) -> Result<Cluster, Unavailable> {
        for (name, _) in settings {
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.".contains(c)),
                "not a PostgreSQL parameter name: {name:?}"
            );
        }
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
        cluster.append_settings(settings);
        let mut last_error = String::new();
        for _ in 0..5 {
            let Some(port) = free_port() else { break };
            cluster.port = port;
            let options = format!(
                "-k {} -p {port} -c listen_addresses=127.0.0.1",
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

    /// URL of the cluster's `postgres` database (user `postgres`, no password).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port the server listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Restart the server (fast shutdown: sessions are terminated, in-flight
    /// transactions roll back), waiting until it accepts connections again.
    ///
    /// # Panics
    /// When `pg_ctl restart` fails or has not returned within 90 s.
    pub async fn restart(&self) {
        let mut command = self.command("pg_ctl");
        command
            .arg("-D")
            .arg(&self.data)
            // `-l` again: pg_ctl does not remember it, and without it the server would
            // write to (and hold open) this command's output pipes.
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "60", "-m", "fast", "restart"]);
        // pg_ctl gives up by itself after its `-t 60`; the blocking thread ends then.
        let run = tokio::task::spawn_blocking(move || command.output());
        let out = match tokio::time::timeout(Duration::from_secs(90), run).await {
            Ok(Ok(out)) => out,
            Ok(Err(join)) => panic!("pg_ctl restart did not complete: {join}"),
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

    /// Put a file in the data directory, readable by the server alone (mode 0600,
    /// owned by the user the server runs as): a TLS key and certificate, say, which
    /// settings can then name relative to the data directory.
    ///
    /// # Panics
    /// When the file cannot be written.
    pub fn write_data_file(&self, name: &str, contents: &[u8]) {
        assert!(
            !name.is_empty() && !name.contains('/') && name != "." && name != "..",
            "a file name in the data directory, not a path: {name:?}"
        );
        let staged = self.dir.join(format!("staged-{name}"));
        std::fs::write(&staged, contents).expect("write the staged file");
        let mut install = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "install"]);
            c
        } else {
            Command::new("install")
        };
        let out = install
            .args(["-m", "600"])
            .arg(&staged)
            .arg(self.data.join(name))
            .output();
        let _ = std::fs::remove_file(&staged);
        assert!(
            matches!(&out, Ok(o) if o.status.success()),
            "install {name} into the data directory: {}",
            describe(out)
        );
    }

    /// The server's log so far (empty when unreadable).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A command running `program` from the cluster's binaries (see [`pg_command`]).
    fn command(&self, program: &str) -> Command {
        pg_command(&self.bindir, &self.dir, self.as_postgres, program)
    }

    /// Append the base settings and then `settings` to `postgresql.conf` (later lines
    /// win), values quoted as the file's syntax wants.
    fn append_settings(&self, settings: &[(&str, &str)]) {
        let path = self.data.join("postgresql.conf");
        let mut conf = std::fs::read_to_string(&path).expect("read postgresql.conf");
        conf.push_str("\n# outbox_testkit::postgres::cluster\n");
        for (name, value) in BASE_SETTINGS.iter().chain(settings) {
            let value = value.replace('\\', "\\\\").replace('\'', "''");
            conf.push_str(&format!("{name} = '{value}'\n"));
        }
        std::fs::write(&path, conf).expect("write postgresql.conf");
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
/// (`postgres` may not read the caller's working directory).
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

/// Stop and delete clusters left by processes that were killed before their
/// [`Cluster`] could drop (a SIGKILLed `cargo test`). A cluster whose owner still runs
/// belongs to a concurrent run and is left alone.
fn reap_orphans(bindir: &Path, as_postgres: bool) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let dir = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(DIR_PREFIX) || n.starts_with(LEGACY_DIR_PREFIX));
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

/// The directory holding `initdb` and `pg_ctl`, found as the build scripts of the
/// crates that start clusters find it ([`outbox_build::postgres_bindir`]), so a test
/// built to run finds the same server.
fn server_bindir() -> Option<PathBuf> {
    outbox_build::postgres_bindir()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A port in [`PORTS`] nobody listens on right now, probing from a random start so
/// concurrent runs rarely race for the same one.
fn free_port() -> Option<u16> {
    let span = u128::from(PORTS.end - PORTS.start);
    let offset = u16::try_from(Uuid::new_v4().as_u128() % span).ok()?;
    let start = PORTS.start + offset;
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
