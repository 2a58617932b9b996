//! The XDP firewall on the real kernel, in a real testbed (as root): rules
//! installed in BPF maps decide what crosses the middlebox, log rules report
//! on the ring buffer, a live update changes decisions without reloading, and
//! attach and detach are idempotent and leave nothing behind.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use sidecore_testbed::testing::root;
use std::time::{Duration, Instant};

use sidecore_firewall::{Classifier, parse::parse_table};
use sidecore_kernel::{XdpFirewall, XdpMode};
use sidecore_testbed::{Testbed, Topology};

/// Removes the testbed even if the test fails.
struct Bed(Testbed);
impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

fn rules(text: &str) -> Classifier {
    Classifier::compile(&parse_table("t.rules", text).unwrap()).unwrap()
}

/// The ports of `ports` whose datagram from the client reached the server.
fn probe(tb: &Testbed, ports: &[u16]) -> Vec<u16> {
    let server = tb.iface("server", "middlebox").unwrap().addr;
    let client = tb.iface("client", "middlebox").unwrap().addr;
    sidecore_testbed::testing::udp_reaches(&tb.prefix, client, server, ports)
}

#[test]
fn rules_in_bpf_maps_decide_what_crosses_the_middlebox() {
    if !root() {
        return;
    }
    let bed =
        Bed(Testbed::up(&Topology::default(), &format!("scx{}", std::process::id())).unwrap());
    let tb = &bed.0;
    let mb = format!("{}-middlebox", tb.prefix);
    let server = tb.iface("server", "middlebox").unwrap().addr;
    let mut fw = XdpFirewall::load().unwrap();
    fw.install(&rules(&format!(
        "1 udp any any {server} 5001 deny\n2 udp any any {server} 5000-5010 accept log\n"
    )))
    .unwrap();
    fw.attach(Some(&mb), "to-client", XdpMode::Generic).unwrap();
    // Idempotent: attaching again where it is changes nothing.
    fw.attach(Some(&mb), "to-client", XdpMode::Generic).unwrap();
    assert_eq!(fw.attached(), Some((Some(mb.as_str()), "to-client")));
    let link =
        sidecore_testbed::topology::ip(&["-n", &mb, "link", "show", "dev", "to-client"]).unwrap();
    assert!(link.contains("xdp"), "{link}");

    // 5000 accepted (and logged), 5001 denied by rule 1, 6000 denied by default.
    assert_eq!(probe(tb, &[5000, 5001, 6000]), vec![5000]);
    let s = fw.stats().unwrap();
    assert!(
        s.accepted >= 1 && s.denied >= 1 && s.default_denied >= 1,
        "{s:?}"
    );
    let mut log = Vec::new();
    let t0 = Instant::now();
    while log.is_empty() && t0.elapsed() < Duration::from_secs(2) {
        fw.drain_log(|e| log.push(e));
    }
    assert!(
        log.iter()
            .any(|e| e.rule == 1 && e.dport == 5000 && e.action == 1),
        "{log:?}"
    );

    // A live update: 5001 now passes, 5000 no longer does.
    fw.install(&rules(&format!("1 udp any any {server} 5001 accept\n")))
        .unwrap();
    assert_eq!(probe(tb, &[5000, 5001]), vec![5001]);
    fw.install(&rules(&format!(
        "1 udp any any {server} 5000 accept\n2 udp any any {server} 5001 accept\n"
    )))
    .unwrap();
    assert_eq!(probe(tb, &[5000, 5001]), vec![5000, 5001]);

    // Detach (twice: idempotent); traffic is no longer filtered.
    fw.detach();
    fw.detach();
    let link =
        sidecore_testbed::topology::ip(&["-n", &mb, "link", "show", "dev", "to-client"]).unwrap();
    assert!(!link.contains("xdp"), "{link}");
    assert_eq!(probe(tb, &[6000]), vec![6000]);

    // Dropping the firewall (as a crash would close its descriptors) detaches it.
    fw.attach(Some(&mb), "to-client", XdpMode::Generic).unwrap();
    assert!(probe(tb, &[6000]).is_empty());
    drop(fw);
    assert_eq!(probe(tb, &[6000]), vec![6000]);
}

#[test]
fn refusals_are_explained() {
    if !root() {
        return;
    }
    let mut fw = XdpFirewall::load().unwrap();
    let e = fw
        .attach(None, "sc-no-such-if", XdpMode::Generic)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot attach `sidecore_fw` at XDP on sc-no-such-if"),
        "{e}"
    );
    let e = fw
        .attach(Some("sc-no-such-ns"), "lo", XdpMode::Generic)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no network namespace `sc-no-such-ns`"), "{e}");
    // More shapes than the program probes.
    let mut text = String::new();
    for i in 0..70 {
        text.push_str(&format!(
            "{} udp 10.0.0.0/{} any 10.0.0.0/{} {} deny\n",
            i + 1,
            i % 33,
            (i / 33) * 8,
            1000 + i
        ));
    }
    let many = parse_table("many.rules", &text).unwrap();
    let c = Classifier::compile(&many).unwrap();
    assert!(c.shapes().len() > sidecore_kernel::firewall::MAX_SHAPES);
    let e = fw.install(&c).unwrap_err().to_string();
    assert!(
        e.contains("tuple shapes; the XDP classifier probes at most 64"),
        "{e}"
    );
}
