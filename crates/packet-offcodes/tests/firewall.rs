//! One rule corpus, three PEs, the same decisions: the `firewall` offcode is
//! deployed through the real runtime on the kernel PE (XDP), on a dedicated
//! core (a user-space forwarder, over AF_XDP and over AF_PACKET) and on the
//! host (nftables), each time in the
//! middlebox of a real testbed. Crafted TCP, UDP and ICMP frames with many
//! 5-tuples cross it from the client; what reaches the server must be exactly
//! what the rule set's first-match semantics accept. Run as root (CI does).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code

use sidecore_testbed::testing::root;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sidecore_firewall::rule::{PROTO_ICMP, PROTO_TCP, PROTO_UDP};
use sidecore_firewall::{Action, Packet, RuleSet};
use sidecore_offcode::Registry;
use sidecore_packetio::frame::{FrameSpec, MAX_FRAME_BYTES};
use sidecore_packetio::raw::RecvBatch;
use sidecore_packetio::{RawOptions, RawSocket, parse};
use sidecore_pe::DiscoverOptions;
use sidecore_runtime::{Runtime, RuntimeConfig};
use sidecore_testbed::{Testbed, Topology};

/// One deployment at a time: they share cores and the kernel's XDP hooks.
static SERIAL: Mutex<()> = Mutex::new(());

/// Removes the testbed even if the test fails.
struct Bed(Testbed);
impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

/// Source prefixes, ports and protocols the corpus and the probes draw from:
/// small domains, so that rules overlap and probes hit every rule.
const SOURCES: [&str; 4] = ["10.9.0.0/16", "10.9.1.0/24", "10.9.1.128/25", "any"];
const PORTS: [&str; 5] = ["any", "53", "80", "1000-2000", "1500-1600"];
const PROTOS: [&str; 4] = ["tcp", "udp", "icmp", "any"];

/// A random corpus of `n` rules in the table layout, every rule to `server`.
fn corpus(rng: &mut ChaCha8Rng, n: usize, server: Ipv4Addr) -> String {
    let mut text = String::new();
    for i in 1..=n {
        let proto = PROTOS[rng.random_range(0..PROTOS.len())];
        // ICMP rules name a prefix, so that some ICMP falls to the default.
        let sources = if proto == "icmp" {
            &SOURCES[..3]
        } else {
            &SOURCES[..]
        };
        let src = sources[rng.random_range(0..sources.len())];
        let (sport, dport) = if proto == "icmp" {
            ("any", "any")
        } else {
            (
                PORTS[rng.random_range(0..PORTS.len())],
                PORTS[rng.random_range(0..PORTS.len())],
            )
        };
        let action = if rng.random_bool(0.5) {
            "accept"
        } else {
            "deny"
        };
        text.push_str(&format!(
            "{i} {proto} {src} {sport} {server} {dport} {action}\n"
        ));
    }
    text
}

/// Distinct probes: every protocol, sources inside and outside the prefixes,
/// ports on and around the ranges' edges.
fn probes(rng: &mut ChaCha8Rng, n: usize, server: Ipv4Addr) -> Vec<Packet> {
    let srcs = [
        "10.9.0.7",
        "10.9.0.200",
        "10.9.1.5",
        "10.9.1.127",
        "10.9.1.128",
        "10.9.1.200",
        "10.8.0.1",
        "172.16.0.1",
        "192.0.2.9",
    ];
    let ports = [53u16, 80, 81, 999, 1000, 1499, 1500, 1600, 1601, 2000, 2001];
    let mut set = BTreeSet::new();
    while set.len() < n {
        let proto = [PROTO_TCP, PROTO_UDP, PROTO_ICMP][rng.random_range(0..3)];
        let src: Ipv4Addr = srcs[rng.random_range(0..srcs.len())].parse().unwrap();
        let (sport, dport) = if proto == PROTO_ICMP {
            (0, 0)
        } else {
            (
                ports[rng.random_range(0..ports.len())],
                ports[rng.random_range(0..ports.len())],
            )
        };
        set.insert((proto, u32::from(src), sport, dport));
    }
    set.into_iter()
        .map(|(proto, src, sport, dport)| Packet {
            proto,
            src,
            sport,
            dst: u32::from(server),
            dport,
        })
        .collect()
}

/// The reference: the rule set's own first-match linear scan.
fn decide(rules: &RuleSet, p: &Packet) -> bool {
    rules.decide(p).action == Action::Accept
}

/// Sends every probe from the client into the middlebox and returns the ones
/// the server received.
struct Wire {
    tx: RawSocket,
    rx: RawSocket,
    dst_mac: [u8; 6],
}

impl Wire {
    fn new(tb: &Testbed) -> Wire {
        let ns = |h: &str| format!("{}-{h}", tb.prefix);
        let tx = RawSocket::open(&RawOptions {
            netns: Some(ns("client")),
            iface: "to-middlebox".into(),
            ..RawOptions::default()
        })
        .unwrap();
        let rx = RawSocket::open(&RawOptions {
            netns: Some(ns("server")),
            iface: "to-middlebox".into(),
            receive: true,
            ..RawOptions::default()
        })
        .unwrap();
        let dst_mac = RawSocket::open(&RawOptions {
            netns: Some(ns("middlebox")),
            iface: "to-client".into(),
            ..RawOptions::default()
        })
        .unwrap()
        .mac();
        Wire { tx, rx, dst_mac }
    }

    fn cross(&self, probes: &[Packet]) -> BTreeSet<Packet> {
        let mut rx = RecvBatch::new(64);
        while self.rx.recv(&mut rx).unwrap() > 0 {} // stale frames
        let mut buf = vec![0u8; MAX_FRAME_BYTES];
        for (seq, p) in probes.iter().enumerate() {
            let spec = FrameSpec {
                src_mac: self.tx.mac(),
                dst_mac: self.dst_mac,
                packet: *p,
                frame_bytes: 0,
            };
            let len = sidecore_packetio::frame::build(&spec, seq as u64, 0, &mut buf);
            assert_eq!(self.tx.send(&[&buf[..len]]).unwrap(), 1);
        }
        let wanted: BTreeSet<Packet> = probes.iter().copied().collect();
        let mut got = BTreeSet::new();
        let mut quiet = Instant::now();
        while quiet.elapsed() < Duration::from_millis(400) {
            let n = self.rx.recv(&mut rx).unwrap();
            for i in 0..n {
                if let Some(f) = parse(rx.frame(i))
                    && wanted.contains(&f.packet)
                {
                    got.insert(f.packet);
                    quiet = Instant::now();
                }
            }
            if n == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        got
    }
}

fn manifest(dir: &Path, kind: &str, path: &str, rules: &Path, prefix: &str) -> std::path::PathBuf {
    let core = if kind == "core" {
        format!("egress = \"to-server\", path = \"{path}\", ")
    } else {
        String::new()
    };
    let text = format!(
        r#"[app]
name = "fw-{kind}"

[[offcode]]
name = "firewall"
id = "9a3c2f10-1b7d-4e55-8c1a-0d2e3f4a5b6c"
impl = "firewall"
cpu = 0.5
memory = "16MiB"
params = {{ rules = "{}", netns = "{prefix}-middlebox", ingress = "to-client", {core}xdp_mode = "generic" }}

  [[offcode.target]]
  kind = "{kind}"
"#,
        rules.display()
    );
    let file = dir.join(format!("fw-{kind}-{path}.toml"));
    std::fs::write(&file, text).unwrap();
    file
}

fn registry() -> Registry {
    let mut r = Registry::new();
    sidecore_packet_offcodes::register(&mut r);
    r
}

#[test]
fn the_same_rules_decide_the_same_on_kernel_core_and_host() {
    if !root() {
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let prefix = format!("scfw{}", std::process::id());
    let bed = Bed(Testbed::up(&Topology::default(), &prefix).unwrap());
    let tb = &bed.0;
    let server = tb.iface("server", "middlebox").unwrap().addr;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let dir = tempfile::tempdir().unwrap();
    let rules_path = dir.path().join("corpus.rules");
    std::fs::write(&rules_path, corpus(&mut rng, 24, server)).unwrap();
    let rules = sidecore_firewall::load(&rules_path).unwrap();
    let probes = probes(&mut rng, 160, server);
    let expected: BTreeSet<Packet> = probes
        .iter()
        .copied()
        .filter(|p| decide(&rules, p))
        .collect();
    // The corpus is useful only if it both accepts and denies, on every protocol.
    for proto in [PROTO_TCP, PROTO_UDP, PROTO_ICMP] {
        let of = |accepted: bool| {
            probes
                .iter()
                .filter(|p| p.proto == proto && expected.contains(p) == accepted)
                .count()
        };
        assert!(
            of(true) > 0 && of(false) > 0,
            "proto {proto}: {} / {}",
            of(true),
            of(false)
        );
    }

    let wire = Wire::new(tb);
    // Unfiltered, the testbed carries every probe.
    assert_eq!(
        wire.cross(&probes).len(),
        probes.len(),
        "the bare testbed loses probes"
    );

    let inventory = sidecore_pe::discover(&DiscoverOptions {
        housekeeping: Some(vec![]),
        probe_wasm: false,
        ..Default::default()
    });
    let reg = registry();
    // A probe the rules deny: once it stops arriving, the firewall is in place.
    let canary = *probes.iter().find(|p| !expected.contains(p)).unwrap();
    // The core forwarder twice: over AF_XDP and over AF_PACKET.
    for (kind, path) in [
        ("kernel", "-"),
        ("core", "af_xdp"),
        ("core", "af_packet"),
        ("host", "-"),
    ] {
        let m = manifest(dir.path(), kind, path, &rules_path, &prefix);
        let manifest = sidecore_manifest::load(&m).unwrap();
        let plan =
            sidecore_runtime::plan_manifest(&manifest, &inventory, &reg, &Default::default())
                .unwrap_or_else(|e| panic!("{kind}/{path}: {e}"));
        let rt = Runtime::new(RuntimeConfig::default());
        let id = rt
            .deploy(&plan)
            .unwrap_or_else(|e| panic!("{kind}/{path}: {e}"));
        let placed = rt.status_of(id).unwrap();
        let t0 = Instant::now();
        while !wire.cross(&[canary]).is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{kind}/{path}: the firewall never started filtering: {placed:?}"
            );
        }
        let got = wire.cross(&probes);
        let wrongly_passed: Vec<_> = got.difference(&expected).collect();
        let wrongly_dropped: Vec<_> = expected.difference(&got).collect();
        assert!(
            wrongly_passed.is_empty() && wrongly_dropped.is_empty(),
            "{kind}/{path}: passed but denied by the rules: {wrongly_passed:?}; dropped but accepted: {wrongly_dropped:?}"
        );
        let status = rt.stop_app_with_status(id).unwrap().1;
        let json = serde_json::to_value(&status).unwrap().to_string();
        assert!(
            json.contains("accepted"),
            "{kind}/{path}: no counters in {json}"
        );
        if kind == "core" {
            let m = &status.offcodes[0].metrics;
            assert_eq!(m.get(&format!("io_{path}")), Some(&1), "{path}: {m:?}");
        }
        rt.shutdown();
        // Stopped, it leaves nothing behind: the path is open again.
        assert_eq!(
            wire.cross(&probes).len(),
            probes.len(),
            "{kind}/{path}: the firewall left filtering behind after it stopped"
        );
    }
    let leftovers = bed.0.down().unwrap();
    assert!(
        sidecore_testbed::topology::namespaces(&prefix).is_empty(),
        "{leftovers:?}"
    );
}
