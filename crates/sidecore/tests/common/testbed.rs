//! What the end-to-end tests on the default testbed (client — middlebox —
//! server, `sidecore testbed up --prefix P`) share: probing which UDP ports
//! get through, and whether the middlebox has an XDP program attached.

use std::net::{SocketAddrV4, UdpSocket};
use std::time::Duration;

use sidecore_testbed::within;

/// Sends one datagram to each port from the client; the ports that arrived.
pub fn probe(prefix: &str, ports: &[u16]) -> Vec<u16> {
    let server: std::net::Ipv4Addr = "10.201.1.2".parse().unwrap();
    let rxs: Vec<UdpSocket> = ports
        .iter()
        .map(|&p| {
            within(Some(&format!("{prefix}-server")), || {
                UdpSocket::bind(SocketAddrV4::new(server, p)).unwrap()
            })
            .unwrap()
        })
        .collect();
    let tx = within(Some(&format!("{prefix}-client")), || {
        UdpSocket::bind("10.201.0.1:0").unwrap()
    })
    .unwrap();
    for &p in ports {
        tx.send_to(b"probe", SocketAddrV4::new(server, p)).unwrap();
    }
    let mut got = Vec::new();
    for (rx, &p) in rxs.iter().zip(ports) {
        rx.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        if rx.recv_from(&mut [0u8; 16]).is_ok() {
            got.push(p);
        }
    }
    got
}

pub fn xdp_attached(prefix: &str) -> bool {
    sidecore_testbed::topology::ip(&[
        "-n",
        &format!("{prefix}-middlebox"),
        "link",
        "show",
        "dev",
        "to-client",
    ])
    .unwrap()
    .contains("xdp")
}
