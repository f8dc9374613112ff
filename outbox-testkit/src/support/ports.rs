//! [`free_port`]: a loopback port for a private server a test starts.

use std::net::{Ipv4Addr, TcpListener};

/// A loopback port nothing listens on right now, as the operating system hands out
/// ephemeral ports. Another process may take it before the caller's server binds it:
/// start the server right after, and retry on a bind failure if that matters.
///
/// # Errors
/// When no socket can be bound on 127.0.0.1.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_port_can_be_bound() {
        let port = super::free_port().unwrap();
        assert_ne!(port, 0);
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}
