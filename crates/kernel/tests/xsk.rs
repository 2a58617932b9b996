//! AF_XDP receive on the real kernel, in a real testbed (as root): with the
//! redirect program attached at the middlebox and an AF_XDP socket in its
//! XSKMAP, the client's datagrams land in the socket's RX ring instead of
//! being forwarded; detached, they are forwarded again. Nothing stays
//! attached.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::net::{SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use sidecore_kernel::{XdpMode, XskRedirect};
use sidecore_packetio::{XskOptions, XskSocket, parse};
use sidecore_testbed::testing::root;
use sidecore_testbed::{Testbed, Topology, within};

/// Removes the testbed even if the test fails.
struct Bed(Testbed);
impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

fn xdp_on(ns: &str, dev: &str) -> bool {
    sidecore_testbed::topology::ip(&["-n", ns, "link", "show", "dev", dev])
        .unwrap()
        .contains("xdp")
}

#[test]
fn ipv4_frames_go_to_the_af_xdp_socket_while_attached() {
    if !root() {
        return;
    }
    let bed =
        Bed(Testbed::up(&Topology::default(), &format!("scy{}", std::process::id())).unwrap());
    let tb = &bed.0;
    let ns = |h: &str| format!("{}-{h}", tb.prefix);
    let server = tb.iface("server", "middlebox").unwrap().addr;
    let client = tb.iface("client", "middlebox").unwrap().addr;
    let rx = within(Some(&ns("server")), || {
        UdpSocket::bind(SocketAddrV4::new(server, 5000)).unwrap()
    })
    .unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let tx = within(Some(&ns("client")), || {
        UdpSocket::bind(SocketAddrV4::new(client, 0)).unwrap()
    })
    .unwrap();

    let mut o = XskOptions::tx(Some(ns("middlebox")), "to-client");
    o.rx = true;
    o.tx = false;
    let mut xsk = XskSocket::open(&o).unwrap();
    let mut redirect = XskRedirect::load().unwrap();
    redirect.insert(0, xsk.fd()).unwrap();
    redirect
        .attach(Some(&ns("middlebox")), "to-client", XdpMode::Auto)
        .unwrap();
    redirect
        .attach(Some(&ns("middlebox")), "to-client", XdpMode::Auto)
        .unwrap();
    assert!(xdp_on(&ns("middlebox"), "to-client"));

    for i in 0..20u8 {
        tx.send_to(&[i; 32], SocketAddrV4::new(server, 5000))
            .unwrap();
    }
    let mut ports = Vec::new();
    let t0 = Instant::now();
    while ports.len() < 20 && t0.elapsed() < Duration::from_secs(3) {
        xsk.recv(64, |f| {
            let p = parse(f).expect("an IPv4 frame");
            ports.push((p.packet.dport, f[f.len() - 1]));
        });
    }
    let want: Vec<(u16, u8)> = (0..20u8).map(|i| (5000, i)).collect();
    assert_eq!(ports, want, "every datagram, in order, in the RX ring");
    assert!(
        rx.recv(&mut [0u8; 64]).is_err(),
        "redirected frames are not forwarded"
    );
    assert_eq!(xsk.statistics().unwrap().rx_dropped, 0);

    // Detached: forwarded again, and nothing is left on the interface.
    redirect.detach();
    assert!(!xdp_on(&ns("middlebox"), "to-client"));
    tx.send_to(b"after", SocketAddrV4::new(server, 5000))
        .unwrap();
    let mut b = [0u8; 16];
    assert_eq!(rx.recv(&mut b).unwrap(), 5);
    drop(redirect);
    drop(xsk);
}
