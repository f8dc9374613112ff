//! A private RabbitMQ node for the cases that stop and start their broker: its own node
//! name, ports, data directory and an empty plugin list, started as a child process
//! group and killed whole (never the shared node on 5672).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use outbox_core::{Error, ErrorKind, Result};
use outbox_testkit::wait_until;

/// Debian's node script (the `/usr/sbin` wrapper would switch to the `rabbitmq` user,
/// who cannot write the test's directory).
const SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

/// What the data directories of private nodes are called, in the temp directory.
const DIR_PREFIX: &str = "outbox-rabbitmq-";

/// A RabbitMQ node of the test's own. Dropping it kills the node and removes its data.
#[derive(Debug)]
pub struct PrivateRabbit {
    node: String,
    port: u16,
    dist_port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

fn plumbing(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("private RabbitMQ node: {what}"),
    )
    .with_source(e)
}

fn free_port() -> Result<u16> {
    outbox_testkit::free_port().map_err(|e| plumbing("find a free port", e))
}

/// Whether the node answers an AMQP 0-9-1 protocol header with a method frame (its
/// `connection.start`) within [`ATTEMPT`].
fn answers_amqp(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), ATTEMPT)
    else {
        return false;
    };
    let mut first = [0u8; 1];
    stream.set_read_timeout(Some(ATTEMPT)).is_ok()
        && stream.write_all(b"AMQP\x00\x00\x09\x01").is_ok()
        && stream.read_exact(&mut first).is_ok()
        && first[0] == FRAME_METHOD
}

/// The AMQP frame type of a method frame.
const FRAME_METHOD: u8 = 1;
/// How long one readiness probe may take.
const ATTEMPT: Duration = Duration::from_secs(2);
/// How long a node may take to boot.
const BOOT: Duration = Duration::from_secs(25);

fn accepts(port: u16) -> bool {
    TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
}

impl PrivateRabbit {
    /// Start a node on free ports with a fresh data directory; returns once it accepts
    /// AMQP connections (a boot takes several seconds).
    pub async fn start() -> Result<Self> {
        kill_stale_nodes();
        let id = uuid::Uuid::now_v7().simple().to_string();
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{id}"));
        std::fs::create_dir_all(&dir).map_err(|e| plumbing("create its directory", e))?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n")
            .map_err(|e| plumbing("write its plugin list", e))?;
        let node = PrivateRabbit {
            node: format!("outbox_test_{id}@localhost"),
            port: free_port()?,
            dist_port: free_port()?,
            dir,
            child: Mutex::new(None),
        };
        node.start_again().await?;
        Ok(node)
    }

    /// The AMQP URL, guest/guest on the default vhost.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Start the (stopped) node again with the same name, ports and data.
    pub async fn start_again(&self) -> Result<()> {
        let log = std::fs::File::create(self.dir.join("node.log"))
            .map_err(|e| plumbing("create its log", e))?;
        let log_err = log.try_clone().map_err(|e| plumbing("share its log", e))?;
        let child = Command::new(SERVER)
            // The node's home holds its own Erlang cookie.
            .env("HOME", &self.dir)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.dir.join("enabled_plugins"),
            )
            .env("RABBITMQ_PID_FILE", self.dir.join("pid"))
            // Not the machine's rabbitmq.conf, whose listener is the shared node's port.
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("no-config"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // A group of its own, so a stop kills the script and the VM under it.
            .process_group(0)
            .spawn()
            .map_err(|e| plumbing(&format!("spawn {SERVER}"), e))?;
        *self.child.lock().expect("child lock") = Some(child);
        // Plain TCP, so a probe racing the node's boot cannot wedge a client library;
        // on a timeout the error carries the end of the node's own log.
        let deadline = Instant::now() + BOOT;
        let mut pause = outbox_core::backend::Backoff::new(
            Duration::from_millis(50),
            Duration::from_millis(500),
        );
        loop {
            let port = self.port;
            let ready = tokio::task::spawn_blocking(move || answers_amqp(port))
                .await
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("node.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "private RabbitMQ node did not answer AMQP within {BOOT:?}; its log ends:\n{}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    ),
                ));
            }
            pause.wait().await;
        }
    }

    /// Kill the node's whole process group (SIGKILL: no goodbye to clients) and wait
    /// until its port is closed.
    pub async fn stop(&self) -> Result<()> {
        let Some(mut child) = self.child.lock().expect("child lock").take() else {
            return Err(Error::config("the private RabbitMQ node is not running"));
        };
        kill_group(&mut child)?;
        let port = self.port;
        wait_until("the private RabbitMQ node's port to close", || async move {
            !accepts(port)
        })
        .await;
        Ok(())
    }
}

fn kill_group(child: &mut Child) -> Result<()> {
    let status = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status()
        .map_err(|e| plumbing("run kill", e))?;
    if !status.success() {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!("private RabbitMQ node: kill of its group exited with {status}"),
        ));
    }
    child.wait().map_err(|e| plumbing("reap the node", e))?;
    Ok(())
}

/// A private node older than this was left by a test process that died before its
/// `Drop` ran (a killed test binary): kill it by the pid file it wrote and remove it.
const STALE: Duration = Duration::from_secs(15 * 60);

fn kill_stale_nodes() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(DIR_PREFIX));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE);
        if !(ours && old) {
            continue;
        }
        if let Ok(pid) = std::fs::read_to_string(path.join("pid")) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
        let _ = std::fs::remove_dir_all(&path);
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.get_mut().ok().and_then(Option::take) {
            let _ = kill_group(&mut child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
