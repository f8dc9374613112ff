//! A private moto server for the cases that stop and start their broker: its own port,
//! started as a child process and killed (never the shared server on 4566).
//!
//! moto keeps its state in memory, so a killed server forgets every queue and message.
//! To restart as a durable broker would, the server runs with moto's request recorder
//! on (`MOTO_ENABLE_RECORDING`): every request is appended to a file in this server's
//! directory as it arrives, before moto handles it. Starting again replays that file
//! (`/moto-api/recorder/replay-recording`) before the server is handed back, which
//! re-creates the queues and re-sends what was sent. A request that arrived just before
//! the kill and got no answer is replayed too: the message is then held although its
//! publisher saw a failure, which is what at-least-once allows.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use outbox_core::{Error, ErrorKind, Result};
use outbox_testkit::wait_until;

/// A moto server of the test's own. Dropping it kills the server and removes its
/// directory.
#[derive(Debug)]
pub struct PrivateMoto {
    port: u16,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

fn plumbing(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("private moto server: {what}"),
    )
    .with_source(e)
}

/// A port nothing listens on right now.
fn free_port() -> Result<u16> {
    outbox_testkit::free_port().map_err(|e| plumbing("find a free port", e))
}

/// The status line of a bodiless HTTP/1.0 request to the server, if it answers.
fn http(port: u16, method: &str, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nContent-Length: 0\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    reply.lines().next().map(str::to_owned)
}

fn answers(port: u16) -> bool {
    http(port, "GET", "/moto-api/").is_some_and(|status| status.contains(" 200"))
}

/// moto as `scripts/services.sh` runs it: `scripts/moto_server.py` on the Python of the
/// virtualenv it installs moto into.
fn command() -> Command {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut command = Command::new(format!("{root}/.services/moto/bin/python3"));
    command.arg(format!("{root}/scripts/moto_server.py"));
    command
}

impl PrivateMoto {
    /// Start a recording server on a free port.
    pub async fn start() -> Result<Self> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("outbox-sqs-{}", super::unique_prefix()));
        std::fs::create_dir_all(&dir).map_err(|e| plumbing("create its directory", e))?;
        let server = PrivateMoto {
            port,
            dir,
            child: Mutex::new(None),
        };
        server.spawn().await?;
        Ok(server)
    }

    /// The endpoint URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn spawn(&self) -> Result<()> {
        let child = command()
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .env("MOTO_ENABLE_RECORDING", "True")
            .env("MOTO_RECORDER_FILEPATH", self.dir.join("recording.jsonl"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| plumbing("spawn moto (run scripts/services.sh first)", e))?;
        *self.child.lock().expect("child lock") = Some(child);
        let port = self.port;
        wait_until("the private moto server to answer", || async move {
            tokio::task::spawn_blocking(move || answers(port))
                .await
                .unwrap_or(false)
        })
        .await;
        Ok(())
    }

    /// Start the (stopped) server again on the same port, replay what it recorded, and
    /// return once the replay is done.
    pub async fn start_again(&self) -> Result<()> {
        self.spawn().await?;
        let port = self.port;
        let status = tokio::task::spawn_blocking(move || {
            http(port, "POST", "/moto-api/recorder/replay-recording")
        })
        .await
        .map_err(|e| plumbing("replay thread", e))?;
        match status {
            Some(status) if status.contains(" 200") => Ok(()),
            other => Err(Error::new(
                ErrorKind::Unavailable,
                format!("private moto server: replaying its recording answered {other:?}"),
            )),
        }
    }

    /// Kill the server (SIGKILL: no goodbye to clients) and wait until it is gone.
    pub fn stop(&self) -> Result<()> {
        let Some(mut child) = self.child.lock().expect("child lock").take() else {
            return Err(Error::config("the private moto server is not running"));
        };
        child.kill().map_err(|e| plumbing("kill moto_server", e))?;
        child.wait().map_err(|e| plumbing("reap moto_server", e))?;
        Ok(())
    }
}

impl Drop for PrivateMoto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.get_mut().ok().and_then(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
