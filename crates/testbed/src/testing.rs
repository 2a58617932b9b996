//! What every test that builds a testbed needs: whether it may (root, and on
//! CI it must: `SIDECORE_REQUIRE_ROOT` turns a skip into a failure), and a
//! guard that removes the testbed even when the test fails.

/// Whether this process runs as root. When it does not, tests that need
/// namespaces skip, unless `SIDECORE_REQUIRE_ROOT` is set (CI sets it), where
/// this fails the test instead of letting it pass without running.
///
/// # Panics
/// When `SIDECORE_REQUIRE_ROOT` is set and this process is not root.
pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { nix::libc::geteuid() } == 0;
    if !root {
        assert!(
            std::env::var_os("SIDECORE_REQUIRE_ROOT").is_none(),
            "SIDECORE_REQUIRE_ROOT is set but the tests do not run as root"
        );
    }
    root
}

/// Removes every namespace of the testbed with this prefix when dropped.
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = crate::topology::down(&self.0);
    }
}

/// Sends one UDP datagram from `client` (in namespace `{prefix}-client`) to
/// each of `ports` at `server` (in `{prefix}-server`); the ports whose
/// datagram arrived within 300 ms. What a firewall test asks of the default
/// client — middlebox — server testbed.
///
/// # Panics
/// When a socket cannot be bound or a datagram sent (a broken testbed).
pub fn udp_reaches(
    prefix: &str,
    client: std::net::Ipv4Addr,
    server: std::net::Ipv4Addr,
    ports: &[u16],
) -> Vec<u16> {
    use std::net::{SocketAddrV4, UdpSocket};
    let ns = |h: &str| format!("{prefix}-{h}");
    let rxs: Vec<UdpSocket> = ports
        .iter()
        .map(|&p| {
            crate::within(Some(&ns("server")), || {
                UdpSocket::bind(SocketAddrV4::new(server, p))
            })
            .expect("enter the server's namespace")
            .expect("bind a receiver on the server")
        })
        .collect();
    let tx = crate::within(Some(&ns("client")), || {
        UdpSocket::bind(SocketAddrV4::new(client, 0))
    })
    .expect("enter the client's namespace")
    .expect("bind the sender on the client");
    for &p in ports {
        tx.send_to(b"probe", SocketAddrV4::new(server, p))
            .expect("send a probe");
    }
    let mut got = Vec::new();
    for (rx, &p) in rxs.iter().zip(ports) {
        rx.set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .expect("a read timeout");
        if rx.recv_from(&mut [0u8; 16]).is_ok() {
            got.push(p);
        }
    }
    got
}
