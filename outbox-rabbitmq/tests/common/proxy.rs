//! A TCP proxy in front of the broker, private to one test, so a test can partition
//! its own publisher from the broker without disturbing any other:
//!
//! - [`cut`](Proxy::cut): close every proxied connection (the client sees the socket
//!   close at once);
//! - [`freeze`](Proxy::freeze): stop moving bytes but keep the sockets open (a silent
//!   partition: the client sees nothing until a timeout);
//! - while cut or frozen, new connections are accepted and never answered;
//! - [`restore`](Proxy::restore): close the frozen and swallowed connections and
//!   forward new ones.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct State {
    forwarding: bool,
    links: Vec<JoinHandle<()>>,
    swallowed: Vec<TcpStream>,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
    frozen: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

/// Copy `from` to `to` while not frozen.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frozen: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = frozen.changed() => continue,
        };
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    /// A forwarding proxy to `upstream` (`host:port`) on a free local port.
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let state = Arc::new(Mutex::new(State {
            forwarding: true,
            links: Vec::new(),
            swallowed: Vec::new(),
        }));
        let (frozen, _) = watch::channel(false);
        let shared = state.clone();
        let freezer = frozen.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut state = shared.lock().unwrap();
                if !state.forwarding {
                    state.swallowed.push(client);
                    continue;
                }
                let upstream = upstream.clone();
                let frozen = freezer.subscribe();
                state.links.push(tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = pump(client_read, server_write, frozen.clone());
                    let down = pump(server_read, client_write, frozen);
                    // Either direction ending ends the link, closing both sockets.
                    tokio::select! {
                        () = up => {}
                        () = down => {}
                    }
                }));
            }
        });
        Proxy {
            port,
            state,
            frozen,
            accept,
        }
    }

    /// Close every proxied connection and swallow new ones.
    pub fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.forwarding = false;
        for link in state.links.drain(..) {
            link.abort();
        }
    }

    /// Stop moving bytes on the proxied connections, keeping them open, and swallow
    /// new ones.
    pub fn freeze(&self) {
        self.state.lock().unwrap().forwarding = false;
        self.frozen.send_replace(true);
    }

    /// Close what was frozen or swallowed, and forward new connections again.
    pub fn restore(&self) {
        let mut state = self.state.lock().unwrap();
        for link in state.links.drain(..) {
            link.abort();
        }
        state.swallowed.clear();
        state.forwarding = true;
        self.frozen.send_replace(false);
    }

    /// Connections swallowed while cut or frozen.
    pub fn swallowed(&self) -> usize {
        self.state.lock().unwrap().swallowed.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for link in self.state.lock().unwrap().links.drain(..) {
            link.abort();
        }
    }
}
