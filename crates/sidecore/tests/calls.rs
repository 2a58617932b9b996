//! Calls between offcodes end to end, through the real binary: the
//! `examples/calls.toml` pair (a key-value store and a client that calls it)
//! deployed locally (asynchronous calls, synchronous calls across executors),
//! with the store on a peer node, refused where a synchronous call would wait
//! on its own executor, and every interface mismatch refused by `sidecore
//! check` with its file and line. Each run asserts every reply the client got.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code: a failed unwrap is a failed run; long scenarios read top to bottom

mod common;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::*;

fn example() -> String {
    let p = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../../examples/calls.toml");
    std::fs::read_to_string(p).unwrap()
}

/// The example with each `(from, to)` replaced (each must occur).
fn variant(dir: &Path, edits: &[(&str, &str)]) -> PathBuf {
    let mut t = example();
    for (from, to) in edits {
        assert!(t.contains(from), "the example no longer has `{from}`");
        t = t.replacen(from, to, 1);
    }
    let p = dir.join("calls.toml");
    std::fs::write(&p, t).unwrap();
    p
}

/// `sidecore up --json` of `manifest` to the end.
fn up(dir: &Path, manifest: &Path, nodes: Option<&Path>) -> serde_json::Value {
    let mut c = bin();
    c.args(["up", "--json", "--quiet", "--socket"])
        .arg(dir.join("origin.sock"));
    if let Some(n) = nodes {
        c.arg("--nodes").arg(n);
    }
    let o = c.arg(manifest).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Every call of a client with `keys` keys was answered as the script says:
/// every put done, every get the value put, the missing key NOT_FOUND, the
/// count right; and the store served each call once.
#[track_caller]
fn assert_every_reply(v: &serde_json::Value, keys: u64) {
    let calls = 2 * keys + 2;
    assert_eq!(v["stopped_because"], "every offcode finished", "{v}");
    let c = offcode(v, "client");
    assert_eq!(c["state"], "done", "{v}");
    assert_eq!(c["metrics"]["calls"], calls, "{v}");
    assert_eq!(c["metrics"]["ok"], calls, "{v}");
    assert_eq!(c["metrics"]["mismatches"], 0, "{v}");
    assert_eq!(
        c["metrics"]["faults"], 1,
        "only the missing key faults: {v}"
    );
    assert_eq!(c["metrics"]["done"], 1, "{v}");
    let s = offcode(v, "store");
    assert_eq!(s["metrics"]["served"], calls, "{v}");
    assert_eq!(s["metrics"]["keys"], keys, "{v}");
}

#[test]
fn the_example_answers_every_asynchronous_call() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let m = variant(dir.path(), &[]);
    let v = up(dir.path(), &m, None);
    assert_every_reply(&v, 1000);
}

#[test]
fn synchronous_calls_cross_executors() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    // The store only on the host (a thread of its own), the client on a core.
    let m = variant(
        dir.path(),
        &[
            ("mode = \"async\"", "mode = \"sync\""),
            ("keys = 1000", "keys = 300"),
            (
                "  [[offcode.target]]\n  kind = \"core\"\n\n  [[offcode.target]]\n  kind = \"host\"\n\n[[offcode]]\nname = \"client\"",
                "  [[offcode.target]]\n  kind = \"host\"\n\n[[offcode]]\nname = \"client\"",
            ),
        ],
    );
    let v = up(dir.path(), &m, None);
    assert_every_reply(&v, 300);
    assert_eq!(offcode(&v, "store")["pe"], "host", "{v}");
    assert_ne!(offcode(&v, "client")["pe"], "host", "{v}");
}

#[test]
fn a_synchronous_call_on_the_providers_own_executor_is_refused() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    // Both pinned to the same core (a core PE runs one executor).
    let pin = "  [[offcode.target]]\n  kind = \"core\"\n  require = { cpu = 1 }\n";
    let mut t = example()
        .replace("mode = \"async\"", "mode = \"sync\"")
        .replace("  [[offcode.target]]\n  kind = \"core\"\n", pin);
    t = t.replace("  [[offcode.target]]\n  kind = \"host\"\n", "");
    let m = dir.path().join("calls.toml");
    std::fs::write(&m, t).unwrap();
    let o = bin()
        .args(["up", "--json", "--quiet", "--socket"])
        .arg(dir.path().join("origin.sock"))
        .arg(&m)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let c = offcode(&v, "client");
    assert_eq!(offcode(&v, "store")["pe"], c["pe"], "{v}");
    assert_eq!(c["state"], "failed", "{v}");
    assert!(
        c["stop_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("would wait on its own executor"),
        "{v}"
    );
    assert_eq!(c["metrics"]["ok"], 0, "{v}");
}

/// Runs the example's client here and its store on a peer daemon.
fn through_a_peer(mode: &str, keys: u64) {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let sock = dir.path().join("peer.sock");
    let log = dir.path().join("peer.log");
    let _peer = Guard(
        bin()
            .args(["daemon", "--name", "peer", "--listen", &addr, "--socket"])
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(|| TcpStream::connect(&addr).is_ok(), 20),
        "peer never listened: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let nodes = dir.path().join("nodes.toml");
    std::fs::write(
        &nodes,
        format!("[[node]]\nname = \"peer\"\naddr = \"{addr}\"\n"),
    )
    .unwrap();
    let m = variant(
        dir.path(),
        &[
            ("mode = \"async\"", &format!("mode = \"{mode}\"")),
            ("keys = 1000", &format!("keys = {keys}")),
            (
                "  [[offcode.target]]\n  kind = \"core\"\n\n  [[offcode.target]]\n  kind = \"host\"\n\n[[offcode]]\nname = \"client\"",
                "  [[offcode.target]]\n  kind = \"node\"\n\n[[offcode]]\nname = \"client\"",
            ),
        ],
    );
    let v = up(dir.path(), &m, Some(&nodes));
    assert_eq!(offcode(&v, "store")["pe"], "node:peer", "{v}");
    assert_every_reply(&v, keys);
}

#[test]
fn asynchronous_calls_reach_a_provider_on_a_peer_node() {
    through_a_peer("async", 1000);
}

#[test]
fn synchronous_calls_reach_a_provider_on_a_peer_node() {
    through_a_peer("sync", 200);
}

/// `sidecore check` of the example after `edit`: exit 2 and every `want`
/// (a message and a `calls.toml:LINE:` location) in its error output.
#[track_caller]
fn check_refuses(edit: (&str, &str), wants: &[&str], line_of: &str) {
    let dir = tempfile::tempdir().unwrap();
    let m = variant(dir.path(), &[edit]);
    let text_now = std::fs::read_to_string(&m).unwrap();
    let line = text_now.lines().position(|l| l.contains(line_of)).unwrap() + 1;
    let o = bin().arg("check").arg(&m).output().unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    for w in wants {
        assert!(err.contains(w), "expected `{w}` in:\n{err}");
    }
    assert!(
        err.contains(&format!("calls.toml:{line}:")),
        "expected line {line} in:\n{err}"
    );
}

#[test]
fn check_refuses_a_method_declared_with_the_wrong_argument_type() {
    check_refuses(
        (
            "{ name = \"get\", params = [\"string\"], returns = \"string\" }",
            "{ name = \"get\", params = [\"u32\"], returns = \"string\" }",
        ),
        &[
            "method `get` of `IKeyValue` is declared (u32) -> string, but implementation `kv-store` serves it as (string) -> string",
            "implementation `kv-client` calls `get(string) -> string`, but `store` declares it (u32) -> string",
        ],
        "params = [\"u32\"]",
    );
}

#[test]
fn check_refuses_a_wrong_method_name() {
    check_refuses(
        (
            "methods = [\"put\", \"get\", \"len\"]",
            "methods = [\"put\", \"gett\", \"len\"]",
        ),
        &["interface `IKeyValue` of `store` has no method `gett`"],
        "\"gett\"",
    );
}

#[test]
fn check_refuses_a_binding_that_leaves_out_a_method_the_client_calls() {
    check_refuses(
        (
            "methods = [\"put\", \"get\", \"len\"]",
            "methods = [\"put\", \"get\"]",
        ),
        &[
            "implementation `kv-client` calls `len`, which this `uses` entry leaves out of its `methods`",
        ],
        "[[offcode.uses]]",
    );
}

#[test]
fn check_refuses_a_method_the_store_does_not_serve() {
    check_refuses(
        (
            "{ name = \"len\", returns = \"u64\" },",
            "{ name = \"len\", returns = \"u64\" },\n    { name = \"clear\" },",
        ),
        &[
            "interface `IKeyValue` declares method `clear`, which implementation `kv-store` does not serve (it serves: put, get, len)",
        ],
        "name = \"clear\"",
    );
}

#[test]
fn check_accepts_the_example_and_counts_its_binding() {
    let o = run(&[
        "check",
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
            .join("../../examples/calls.toml")
            .to_str()
            .unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("2 offcode(s), 0 constraint(s), 0 channel(s), 1 call binding(s)"),
        "{out}"
    );
}
