//! End-to-end tests of offloading onto peer nodes: a real peer `sidecore
//! daemon` process (on loopback, and in its own network namespace behind a
//! veth pair), a real origin `sidecore up`, TCP stream channels between them,
//! and the lease that ties the peer's part to the origin.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use sidecore_builtins::checksum::inet_checksum;
use sidecore_builtins::source::fill_record;

const RECORD: usize = 64;

/// Starts a peer daemon listening for nodes on `addr`, optionally inside a
/// network namespace, and waits until its node port answers.
fn start_peer(dir: &Path, addr: &str, netns: Option<&str>) -> (Guard, PathBuf) {
    let sock = dir.join("peer.sock");
    let exe = env!("CARGO_BIN_EXE_sidecore");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, exe]);
            c
        }
        None => Command::new(exe),
    };
    cmd.env_remove("SIDECORE_NODES")
        .env_remove("SIDECORE_SOCKET");
    cmd.args(["daemon", "--name", "peer", "--listen", addr, "--socket"])
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("peer.log")).unwrap());
    let g = Guard(cmd.spawn().expect("start the peer daemon"));
    assert!(
        wait_for(|| TcpStream::connect(addr).is_ok(), 20),
        "the peer's node port {addr} never opened: {}",
        std::fs::read_to_string(dir.join("peer.log")).unwrap_or_default()
    );
    (g, sock)
}

fn nodes_file(dir: &Path, addr: &str) -> PathBuf {
    let p = dir.join("nodes.toml");
    std::fs::write(
        &p,
        format!("[[node]]\nname = \"peer\"\naddr = \"{addr}\"\n"),
    )
    .unwrap();
    p
}

/// source (here) → checksum `remote` → checksum `back` (here): both
/// directions of a stream channel in one app. `where_remote` is the target
/// kind of the middle offcode, `params` the source's parameters.
fn chain(dir: &Path, where_remote: &str, source_params: &str) -> PathBuf {
    let id = "3f1d9a52-8c41-4e0b-a6d2-7b5e9c0f1b0";
    chain_manifest(dir, "chain", id, ("remote", where_remote), source_params)
}

/// The apps a daemon runs, from `sidecore ps --json`.
fn apps(sock: &Path) -> Vec<serde_json::Value> {
    let o = run(&["ps", "--json", "--socket", sock.to_str().unwrap()]);
    if !o.status.success() {
        return Vec::new();
    }
    serde_json::from_slice(&o.stdout).unwrap_or_default()
}

/// What the two checksum offcodes must report for records 0..n.
fn expected_sums(n: u64) -> (u64, u64) {
    let (mut first, mut second) = (0u64, 0u64);
    let mut rec = [0u8; RECORD];
    for seq in 0..n {
        fill_record(seq, &mut rec);
        let c = inet_checksum(&rec);
        first = first.wrapping_add(c as u64);
        let mut out = [0u8; 10];
        out[..8].copy_from_slice(&seq.to_le_bytes());
        out[8..].copy_from_slice(&c.to_be_bytes());
        second = second.wrapping_add(inet_checksum(&out) as u64);
    }
    (first, second)
}

/// Runs the chain to completion against a peer at `addr` and checks every
/// record went there and back exactly once.
fn run_chain_through(dir: &Path, addr: &str, peer_sock: &Path) {
    const N: u64 = 50_000;
    let m = chain(
        dir,
        "node",
        &format!("record_size = {RECORD}, records = {N}"),
    );
    let nodes = nodes_file(dir, addr);
    let o = bin()
        .args(["up", "--json", "--quiet", "--socket"])
        .arg(dir.join("origin.sock"))
        .arg("--nodes")
        .arg(&nodes)
        .arg(&m)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stopped_because"], "every offcode finished", "{v}");
    let (sum1, sum2) = expected_sums(N);
    let remote = offcode(&v, "remote");
    assert_eq!(remote["pe"], "node:peer", "{v}");
    assert_eq!(remote["state"], "done", "{v}");
    assert_eq!(remote["metrics"]["records"], N, "{v}");
    assert_eq!(remote["metrics"]["bytes"], N * RECORD as u64, "{v}");
    assert_eq!(remote["metrics"]["sequence_gaps"], 0, "{v}");
    assert_eq!(remote["metrics"]["checksum_sum"], sum1, "{v}");
    let back = offcode(&v, "back");
    assert_eq!(back["state"], "done", "{v}");
    assert_eq!(back["metrics"]["records"], N, "{v}");
    assert_eq!(back["metrics"]["sequence_gaps"], 0, "{v}");
    assert_eq!(back["metrics"]["checksum_sum"], sum2, "{v}");
    // The lease ended with the app: the peer holds nothing of it.
    assert!(
        wait_for(|| apps(peer_sock).is_empty(), 10),
        "{:?}",
        apps(peer_sock)
    );
}

#[test]
fn a_chain_runs_through_a_peer_and_back_on_loopback() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let (_peer, peer_sock) = start_peer(dir.path(), &addr, None);
    run_chain_through(dir.path(), &addr, &peer_sock);
}

/// A network namespace with a veth pair to the test's namespace; removed on
/// drop.
struct Netns(String);

impl Netns {
    fn new(name: &str, here: &str, there: &str) -> Netns {
        let sh = |args: &[&str]| {
            let o = Command::new("ip").args(args).output().expect("run ip");
            assert!(
                o.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr)
            );
        };
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        let _ = Command::new("ip").args(["link", "del", "sc-t0"]).output();
        sh(&["netns", "add", name]);
        let ns = Netns(name.into());
        sh(&[
            "link", "add", "sc-t0", "type", "veth", "peer", "name", "sc-t1",
        ]);
        sh(&["link", "set", "sc-t1", "netns", name]);
        sh(&["addr", "add", &format!("{here}/24"), "dev", "sc-t0"]);
        sh(&["link", "set", "sc-t0", "up"]);
        sh(&[
            "netns",
            "exec",
            name,
            "ip",
            "addr",
            "add",
            &format!("{there}/24"),
            "dev",
            "sc-t1",
        ]);
        sh(&["netns", "exec", name, "ip", "link", "set", "sc-t1", "up"]);
        sh(&["netns", "exec", name, "ip", "link", "set", "lo", "up"]);
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", "sc-t0"]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn a_chain_runs_through_a_peer_in_another_network_namespace() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let ns = Netns::new("sc-test-peer", "10.231.7.1", "10.231.7.2");
    let addr = "10.231.7.2:7411";
    let (peer, peer_sock) = start_peer(dir.path(), addr, Some(&ns.0));
    run_chain_through(dir.path(), addr, &peer_sock);
    drop(peer);
}

#[test]
fn the_peer_tears_its_part_down_when_the_origin_dies() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let (_peer, peer_sock) = start_peer(dir.path(), &addr, None);
    let m = chain(dir.path(), "node", "record_size = 64, records = 0");
    let nodes = nodes_file(dir.path(), &addr);
    let mut origin = Guard(
        bin()
            .args(["up", "--quiet", "--socket"])
            .arg(dir.path().join("origin.sock"))
            .arg("--nodes")
            .arg(&nodes)
            .arg(&m)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(
            || apps(&peer_sock).iter().any(|a| a["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("chain@"))
                && a["state"] == "running"),
            20
        ),
        "the part never ran on the peer"
    );
    origin.0.kill().unwrap();
    origin.0.wait().unwrap();
    assert!(
        wait_for(|| apps(&peer_sock).is_empty(), 10),
        "the peer kept the part of a dead origin: {:?}",
        apps(&peer_sock)
    );
}

#[test]
fn the_origin_fails_the_part_when_the_peer_dies() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let (mut peer, peer_sock) = start_peer(dir.path(), &addr, None);
    let m = chain(dir.path(), "node", "record_size = 64, records = 0");
    let nodes = nodes_file(dir.path(), &addr);
    let mut origin = Guard(
        bin()
            .args(["up", "--json", "--quiet", "--socket"])
            .arg(dir.path().join("origin.sock"))
            .arg("--nodes")
            .arg(&nodes)
            .arg(&m)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(|| !apps(&peer_sock).is_empty(), 20),
        "the part never ran on the peer"
    );
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
    let status = wait_exit(&mut origin.0, 20).expect("the origin noticed the peer is gone");
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(origin.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stopped_because"], "every offcode finished", "{v}");
    let remote = offcode(&v, "remote");
    assert_eq!(remote["state"], "failed", "{v}");
    let why = remote["stop_reason"].as_str().unwrap_or_default();
    assert!(why.contains("node:peer"), "{v}");
}

#[test]
fn a_part_the_peer_cannot_build_rolls_back_with_the_peers_reason() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let (_peer, peer_sock) = start_peer(dir.path(), &addr, None);
    // The offcode on the peer gets a parameter its implementation refuses.
    let m = dir.path().join("bad.toml");
    std::fs::write(
        &m,
        r#"
[app]
name = "bad-part"
[[offcode]]
name = "src"
id = "3f1d9a52-8c41-4e0b-a6d2-7b5e9c0f1c01"
impl = "record-source"
outputs = ["out"]
params = { record_size = 2 }
  [[offcode.target]]
  kind = "node"
[[offcode]]
name = "sum"
id = "3f1d9a52-8c41-4e0b-a6d2-7b5e9c0f1c02"
impl = "inet-checksum"
inputs = ["in"]
  [[offcode.target]]
  kind = "host"
[[channel]]
name = "records"
from = "src.out"
to = "sum.in"
"#,
    )
    .unwrap();
    let o = bin()
        .args(["up", "--quiet", "--socket"])
        .arg(dir.path().join("origin.sock"))
        .arg("--nodes")
        .arg(nodes_file(dir.path(), &addr))
        .arg(&m)
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(
        err.contains("peer node:peer") && err.contains("record_size must be at least 8"),
        "{err}"
    );
    assert!(apps(&peer_sock).is_empty(), "{:?}", apps(&peer_sock));
}

#[test]
fn a_zero_copy_channel_is_refused_across_machines() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let (_peer, peer_sock) = start_peer(dir.path(), &addr, None);
    let m = chain(dir.path(), "node", "record_size = 64, records = 100");
    let manifest = std::fs::read_to_string(&m).unwrap().replace(
        "to = \"remote.in\"\n",
        "to = \"remote.in\"\nzero_copy = true\n",
    );
    std::fs::write(&m, manifest).unwrap();
    let o = bin()
        .args(["up", "--quiet", "--socket"])
        .arg(dir.path().join("origin.sock"))
        .arg("--nodes")
        .arg(nodes_file(dir.path(), &addr))
        .arg(&m)
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("channel `records`") && err.contains("it is zero_copy"),
        "{err}"
    );
    // Nothing reached the peer.
    assert!(apps(&peer_sock).is_empty(), "{:?}", apps(&peer_sock));
}

/// Opens a node connection to `addr` by hand, is welcomed, sends `payload` as
/// the next frame (whatever it holds), and returns the peer's error reply.
fn ask_raw(addr: &str, payload: &[u8]) -> String {
    use sidecore_wire::frame::FrameEncoder;
    use sidecore_wire::{Hello, Message, Origin};
    use std::io::Read;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut o = Origin::new(
        "peer",
        Hello {
            origin: "test.1".into(),
            software: "0".into(),
        },
    );
    s.write_all(&o.take_output()).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut next = |o: &mut Origin, s: &mut TcpStream| loop {
        if let Some(m) = o.poll().unwrap() {
            return m;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the peer closed without answering");
        o.handle_input(&buf[..n]);
    };
    assert!(matches!(next(&mut o, &mut s), Message::Welcome(_)));
    // Frame #1 (the hello was #0), written by hand.
    let mut enc = FrameEncoder::default();
    enc.encode(b"{}", &mut Vec::new());
    let mut frame = Vec::new();
    enc.encode(payload, &mut frame);
    s.write_all(&frame).unwrap();
    match next(&mut o, &mut s) {
        Message::Error { error } => error,
        m => panic!("expected an error, got {m:?}"),
    }
}

#[test]
fn a_peer_answers_bad_deploy_requests_with_what_is_wrong() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let (_peer, peer_sock) = start_peer(dir.path(), &addr, None);
    let r = ask_raw(&addr, br#"{"type":"deploy"}"#);
    assert!(
        r.contains("frame #1 holds a malformed message") && r.contains("missing field"),
        "{r}"
    );
    let r = ask_raw(
        &addr,
        br#"{"type":"deploy","app":"x","origin":"o","offcodes":[{"name":"a","implementation":"no-such-thing","priority":"normal","watchdog_ms":null,"obsolete_ms":null,"params":{},"inputs":[],"outputs":[]}],"channels":[]}"#,
    );
    assert!(
        r.contains("offcode `a`: this node's library has no implementation `no-such-thing`"),
        "{r}"
    );
    let r = ask_raw(
        &addr,
        br#"{"type":"deploy","app":"x","origin":"o","offcodes":[{"name":"a","implementation":"inet-checksum","priority":"normal","watchdog_ms":null,"obsolete_ms":null,"params":{},"inputs":["in"],"outputs":[]}],"channels":[{"name":"c","props":{"cast":"unicast","order":"sequential","delivery":"reliable","zero_copy":true,"slots":64,"slot_size":64},"from":null,"to":[[3,0]],"connect":null}]}"#,
    );
    assert!(
        r.contains("channel `c`: to names offcode #3, but the part has 1"),
        "{r}"
    );
    // A message out of turn: `stop` before any part runs.
    let r = ask_raw(&addr, br#"{"type":"stop"}"#);
    assert!(
        r.contains("sent `stop` while welcomed, before any deploy request"),
        "{r}"
    );
    // Nothing was deployed, and the peer still answers hellos.
    assert!(apps(&peer_sock).is_empty());
    let info = sidecore_pe::node::probe(
        &sidecore_pe::NodeConfig {
            name: "peer".into(),
            addr: addr.clone(),
            bandwidth: None,
        },
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(info.name, "peer");
}

/// A part's restart policy travels with it, and the peer's supervisor
/// carries it out: the middle of the chain runs on the peer, fails twice and
/// is restarted there with its stream channels attached; the origin mirrors
/// the restarts, and every record still arrives once, in order.
#[test]
fn a_failing_offcode_on_a_peer_is_restarted_there() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let (_peer, peer_sock) = start_peer(dir.path(), &addr, None);
    const N: u64 = 30_000;
    let manifest = std::fs::read_to_string(chain(
        dir.path(),
        "node",
        &format!("record_size = {RECORD}, records = {N}"),
    ))
    .unwrap()
    .replace(
        "impl = \"inet-checksum\"\ninputs = [\"in\"]\noutputs = [\"out\"]",
        "impl = \"fault-injector\"\ninputs = [\"in\"]\noutputs = [\"out\"]\n\
         params = { fail_after = 8000, failing_lives = 2 }\n\
         restart = \"on-failure\"\nrestart_backoff_ms = 20",
    );
    assert!(manifest.contains("fault-injector"), "{manifest}");
    let m = dir.path().join("flaky-chain.toml");
    std::fs::write(&m, manifest).unwrap();
    let o = bin()
        .args(["up", "--json", "--quiet", "--socket"])
        .arg(dir.path().join("origin.sock"))
        .arg("--nodes")
        .arg(nodes_file(dir.path(), &addr))
        .arg(&m)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stopped_because"], "every offcode finished", "{v}");
    let remote = offcode(&v, "remote");
    assert_eq!(remote["pe"], "node:peer", "{v}");
    assert_eq!(remote["restarts"], 2, "{v}");
    assert_eq!(remote["state"], "done", "{v}");
    assert_eq!(remote["metrics"]["lives"], 3, "{v}");
    assert_eq!(remote["metrics"]["records"], N, "{v}");
    // The records came back once each, in order, through the restarts.
    let back = offcode(&v, "back");
    assert_eq!(back["state"], "done", "{v}");
    assert_eq!(back["metrics"]["records"], N, "{v}");
    assert_eq!(back["metrics"]["sequence_gaps"], 0, "{v}");
    let mut rec = [0u8; RECORD];
    let sum: u64 = (0..N)
        .map(|seq| {
            fill_record(seq, &mut rec);
            u64::from(inet_checksum(&rec))
        })
        .sum();
    assert_eq!(back["metrics"]["checksum_sum"], sum, "{v}");
    assert!(
        wait_for(|| apps(&peer_sock).is_empty(), 10),
        "{:?}",
        apps(&peer_sock)
    );
}
