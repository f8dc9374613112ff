//! A private nats-server with JetStream, for the cases that stop and start their broker:
//! its own port and store directory, started as a child process and killed (never the
//! shared server on 4222, which `start-stop-daemon` manages by its path).

use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use outbox_core::{Error, ErrorKind, Result};
use outbox_testkit::wait_until;

/// Where Debian installs the server; `nats-server` on the `PATH` is tried first.
const DEBIAN_PATH: &str = "/usr/sbin/nats-server";

/// A nats-server of the test's own. Dropping it kills the server and removes its store.
#[derive(Debug)]
pub struct PrivateNats {
    port: u16,
    store: PathBuf,
    child: Mutex<Option<Child>>,
}

fn plumbing(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("private nats-server: {what}"),
    )
    .with_source(e)
}

/// A port nothing listens on right now.
fn free_port() -> Result<u16> {
    outbox_testkit::free_port().map_err(|e| plumbing("find a free port", e))
}

fn accepts(port: u16) -> bool {
    TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
}

impl PrivateNats {
    /// Start a server with JetStream on a free port, storing in a fresh directory.
    pub async fn start() -> Result<Self> {
        let port = free_port()?;
        let store = std::env::temp_dir().join(format!("outbox-nats-{}", super::unique_name()));
        std::fs::create_dir_all(&store).map_err(|e| plumbing("create the store directory", e))?;
        let server = PrivateNats {
            port,
            store,
            child: Mutex::new(None),
        };
        server.start_again().await?;
        Ok(server)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn command() -> Command {
        let on_path = Command::new("nats-server")
            .arg("--version")
            .output()
            .is_ok();
        Command::new(if on_path { "nats-server" } else { DEBIAN_PATH })
    }

    /// Start the (stopped) server again on the same port and store; returns once it
    /// accepts connections.
    pub async fn start_again(&self) -> Result<()> {
        let child = Self::command()
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| plumbing("spawn nats-server", e))?;
        *self.child.lock().expect("child lock") = Some(child);
        let port = self.port;
        wait_until(
            "the private nats-server to accept connections",
            || async move { accepts(port) },
        )
        .await;
        let url = self.url();
        wait_until("the private nats-server's JetStream to answer", || {
            let url = url.clone();
            async move {
                // Any reply to the JetStream API's INFO request will do: a server whose
                // JetStream is not up yet has no responder for it.
                match outbox_nats::async_nats::connect(url).await {
                    Ok(client) => client.request("$JS.API.INFO", "".into()).await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
        Ok(())
    }

    /// Kill the server (SIGKILL: no goodbye to clients) and wait until it is gone.
    pub fn stop(&self) -> Result<()> {
        let Some(mut child) = self.child.lock().expect("child lock").take() else {
            return Err(Error::config("the private nats-server is not running"));
        };
        child.kill().map_err(|e| plumbing("kill nats-server", e))?;
        child.wait().map_err(|e| plumbing("reap nats-server", e))?;
        Ok(())
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.get_mut().ok().and_then(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.store);
    }
}
