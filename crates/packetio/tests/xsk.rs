//! AF_XDP sending on a real veth of a real testbed (as root): frames built in
//! the UMEM and queued on the TX ring cross the middlebox and every one
//! reaches a UDP socket on the server, in order; veth binds in copy mode, so
//! demanding zero-copy is refused by name, and so is a queue the device does
//! not have.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::net::{SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use sidecore_firewall::Packet;
use sidecore_firewall::rule::PROTO_UDP;
use sidecore_packetio::frame::{self, FrameSpec};
use sidecore_packetio::{XskBind, XskOptions, XskSocket};
use sidecore_testbed::testing::root;
use sidecore_testbed::{Testbed, Topology, within};

/// Removes the testbed even if the test fails.
struct Bed(Testbed);
impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

fn mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

#[test]
fn frames_sent_through_the_tx_ring_arrive_in_order() {
    if !root() {
        return;
    }
    let bed =
        Bed(Testbed::up(&Topology::default(), &format!("scq{}", std::process::id())).unwrap());
    let tb = &bed.0;
    let ns = |h: &str| format!("{}-{h}", tb.prefix);
    let link = tb.iface("client", "middlebox").unwrap();
    let server = tb.iface("server", "middlebox").unwrap().addr;
    let rx = within(Some(&ns("server")), || {
        UdpSocket::bind(SocketAddrV4::new(server, 5000)).unwrap()
    })
    .unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();

    let mut xsk = XskSocket::open(&XskOptions::tx(Some(ns("client")), "to-middlebox")).unwrap();
    assert!(!xsk.zerocopy(), "veth has no zero-copy AF_XDP");
    assert_eq!(xsk.mac(), mac(&link.mac));
    let spec = FrameSpec {
        src_mac: xsk.mac(),
        dst_mac: mac(&link.peer_mac),
        packet: Packet {
            proto: PROTO_UDP,
            src: u32::from(link.addr),
            sport: 4000,
            dst: u32::from(server),
            dport: 5000,
        },
        frame_bytes: 128,
    };
    // Batches small enough for the receiver's socket buffer, drained between.
    let (batches, per) = (10u64, 40usize);
    let mut got = Vec::new();
    for b in 0..batches {
        let first = b * per as u64;
        // Queue the batch, then kick until the kernel has taken all of it.
        let s = xsk
            .send(per, |i, chunk| {
                frame::build(&spec, first + i as u64, 0, chunk)
            })
            .unwrap();
        assert_eq!(s.queued, per, "room for the whole batch");
        let mut sent = s.left;
        let t0 = Instant::now();
        while sent < per && t0.elapsed() < Duration::from_secs(2) {
            sent += xsk.send(0, |_, _| 0).unwrap().left;
        }
        assert_eq!(sent, per, "batch {b}: the kernel took {sent} of {per}");
        assert_eq!(xsk.tx_pending(), 0);
        for _ in 0..per {
            let mut buf = [0u8; 256];
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(n, 128 - 42, "the UDP payload of a 128-byte frame");
            got.push(u64::from_be_bytes(buf[..8].try_into().unwrap()));
        }
    }
    let want: Vec<u64> = (0..batches * per as u64).collect();
    assert_eq!(got, want, "every frame, in order");

    // Veth only copies: demanding zero-copy is refused at bind, named.
    let mut o = XskOptions::tx(Some(ns("client")), "to-middlebox");
    o.bind = XskBind::ZeroCopy;
    let e = XskSocket::open(&o).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("AF_XDP socket on to-middlebox queue 0: bind:"),
        "{e}"
    );
    // A queue the device does not have.
    let mut o = XskOptions::tx(Some(ns("client")), "to-middlebox");
    o.queue = 7;
    let e = XskSocket::open(&o).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("AF_XDP socket on to-middlebox queue 7: bind:"),
        "{e}"
    );
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
}
