//! The testbed on the real kernel (as root): the default topology carries
//! traffic from the client through the middlebox to the server, `down`
//! removes every namespace and link, and so does a failure part-way.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use sidecore_testbed::testing::root;
use std::net::{SocketAddrV4, UdpSocket};
use std::time::Duration;

use sidecore_testbed::topology::{self, namespaces};
use sidecore_testbed::{Testbed, Topology, within};

#[test]
fn the_default_testbed_routes_through_the_middlebox_and_leaves_no_trace() {
    if !root() {
        return;
    }
    let prefix = format!("sctb{}", std::process::id());
    let tb = Testbed::up(&Topology::default(), &prefix).unwrap();
    assert_eq!(namespaces(&prefix).len(), 3);
    let server = tb.iface("server", "middlebox").unwrap().addr;
    let client = tb.iface("client", "middlebox").unwrap().addr;
    assert_ne!(
        client.octets()[2],
        server.octets()[2],
        "client and server are on different links"
    );
    // A datagram from the client reaches the server, routed by the middlebox.
    let rx = within(Some(&format!("{prefix}-server")), || {
        UdpSocket::bind(SocketAddrV4::new(server, 4999)).unwrap()
    })
    .unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let tx = within(Some(&format!("{prefix}-client")), || {
        UdpSocket::bind(SocketAddrV4::new(client, 0)).unwrap()
    })
    .unwrap();
    tx.send_to(b"through", SocketAddrV4::new(server, 4999))
        .unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = rx.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"through");
    assert_eq!(from.ip(), std::net::IpAddr::V4(client));
    // An identical testbed cannot be built twice.
    let e = Testbed::up(&Topology::default(), &prefix).unwrap_err();
    assert!(e.to_string().contains("already up"), "{e}");
    let removed = tb.down().unwrap();
    assert_eq!(removed.len(), 3);
    assert!(namespaces(&prefix).is_empty());
    let links = topology::ip(&["-o", "link", "show"]).unwrap();
    assert!(!links.contains("to-middlebox"), "{links}");
}

#[test]
fn a_failure_part_way_removes_what_was_made() {
    if !root() {
        return;
    }
    let prefix = format!("sctf{}", std::process::id());
    let e = Testbed::up_failing_after(&Topology::default(), &prefix, 1).unwrap_err();
    assert!(e.to_string().contains("failing after 1 links"), "{e}");
    assert!(namespaces(&prefix).is_empty(), "{:?}", namespaces(&prefix));
}
