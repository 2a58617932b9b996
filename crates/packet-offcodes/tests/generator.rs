//! The traffic generator on a dedicated core, deployed through the real
//! runtime in a real testbed (as root): over AF_XDP every frame of a counted
//! stream reaches a socket on the server, in order; where the kernel refuses
//! AF_XDP (here: a queue the veth does not have) `path = "auto"` falls back
//! to AF_PACKET and says so in its metrics, while `path = "af_xdp"` fails
//! the deployment naming the refusal.
#![allow(clippy::unwrap_used)] // test code

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sidecore_offcode::Registry;
use sidecore_pe::DiscoverOptions;
use sidecore_runtime::{AppStatus, Runtime, RuntimeConfig};
use sidecore_testbed::testing::root;
use sidecore_testbed::{Testbed, Topology};

/// Removes the testbed even if the test fails.
struct Bed(Testbed);
impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

const FRAMES: u64 = 300;

fn manifest(prefix: &str, path: &str, queue: u32) -> String {
    format!(
        r#"[app]
name = "gen-{path}-{queue}"

[[offcode]]
name = "generator"
id = "9a3c2f10-1b7d-4e55-8c1a-0d2e3f4a5b01"
impl = "traffic-generator"
params = {{ netns = "{prefix}-client", mode = "packet", path = "{path}", xdp_queue = {queue}, iface = "to-middlebox", src = "10.201.0.1", dst = "10.201.1.2", count = {FRAMES}, rate_pps = 10000, frame_bytes = 100 }}

  [[offcode.target]]
  kind = "core"
"#
    )
}

fn metric(s: &AppStatus, offcode: &str, name: &str) -> u64 {
    s.offcodes
        .iter()
        .find(|o| o.name == offcode)
        .and_then(|o| o.metrics.get(name).copied())
        .unwrap_or(0)
}

/// A UDP socket on the server, bound before anything is deployed, read by a
/// thread of its own: the sequence numbers of what arrives within 10 s.
fn receiver(prefix: &str, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<u64>> {
    let sock = sidecore_testbed::within(Some(&format!("{prefix}-server")), || {
        std::net::UdpSocket::bind("10.201.1.2:5000").unwrap()
    })
    .unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    std::thread::spawn(move || {
        let mut seqs = Vec::new();
        let t0 = Instant::now();
        let mut buf = [0u8; 2048];
        while seqs.len() < FRAMES as usize
            && t0.elapsed() < Duration::from_secs(10)
            && !stop.load(Ordering::Relaxed)
        {
            if let Ok(n) = sock.recv(&mut buf) {
                assert!(n >= 8, "a datagram of {n} bytes");
                seqs.push(u64::from_be_bytes(buf[..8].try_into().unwrap()));
            }
        }
        seqs
    })
}

/// Deploys the generator, waits until the receiver has every frame (or
/// 10 s), stops; its status and what arrived.
fn run(prefix: &str, path: &str, queue: u32) -> Result<(AppStatus, Vec<u64>), String> {
    let mut reg = Registry::new();
    sidecore_packet_offcodes::register(&mut reg);
    let inventory = sidecore_pe::discover(&DiscoverOptions {
        housekeeping: Some(vec![]),
        probe_wasm: false,
        ..Default::default()
    });
    let m = sidecore_manifest::parse_str("gen.toml", &manifest(prefix, path, queue)).unwrap();
    let plan = sidecore_runtime::plan_manifest(&m, &inventory, &reg, &Default::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rx = receiver(prefix, stop.clone());
    let rt = Runtime::new(RuntimeConfig::default());
    let id = match rt.deploy(&plan) {
        Ok(id) => id,
        Err(e) => {
            rt.shutdown();
            stop.store(true, Ordering::Relaxed);
            drop(rx.join());
            return Err(e.to_string());
        }
    };
    let got = rx.join().unwrap();
    let status = rt.stop_app_with_status(id).unwrap().1;
    rt.shutdown();
    Ok((status, got))
}

#[test]
fn af_xdp_delivers_every_frame_and_a_refusal_falls_back_or_fails_by_name() {
    if !root() {
        return;
    }
    let prefix = format!("scgx{}", std::process::id());
    let _bed = Bed(Testbed::up(&Topology::default(), &prefix).unwrap());

    let every: Vec<u64> = (0..FRAMES).collect();
    let (s, got) = run(&prefix, "af_xdp", 0).unwrap();
    assert_eq!(metric(&s, "generator", "io_af_xdp"), 1, "{s:?}");
    assert_eq!(metric(&s, "generator", "sent"), FRAMES, "{s:?}");
    assert_eq!(got, every, "every frame, in order");
    // The report: rate near the one asked for, departures one period apart.
    let pps = metric(&s, "generator", "rate_pps");
    assert!((7_500..=10_500).contains(&pps), "{pps} pps: {s:?}");
    let mean = metric(&s, "generator", "iat_mean_ns");
    assert!((80_000..=140_000).contains(&mean), "{mean} ns: {s:?}");

    // Queue 7 does not exist on a veth: the kernel refuses the bind.
    let (s, got) = run(&prefix, "auto", 7).unwrap();
    assert_eq!(metric(&s, "generator", "io_af_packet"), 1, "{s:?}");
    assert_eq!(metric(&s, "generator", "io_af_xdp"), 0, "{s:?}");
    assert_eq!(
        metric(&s, "generator", "xdp_refused_errno"),
        u64::try_from(libc::EINVAL).unwrap(),
        "{s:?}"
    );
    assert_eq!(got, every, "every frame, in order, through AF_PACKET");

    let e = run(&prefix, "af_xdp", 7).unwrap_err();
    assert!(
        e.contains("generator") && e.contains("AF_XDP socket on to-middlebox queue 7: bind"),
        "{e}"
    );
}
