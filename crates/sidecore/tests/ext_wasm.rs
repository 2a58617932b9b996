//! End to end: an untrusted Wasm offcode deployed by `sidecore up` between two built-in
//! offcodes (admitted at deploy time, run on the wasm PE), and the `ext`/`calibrate`
//! commands of the real binary.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{bin, text};

fn root() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")).join("../..")
}

/// Standard output and error together.
fn out(o: &Output) -> String {
    let (stdout, stderr) = text(o);
    stdout + &stderr
}

#[test]
fn wasm_offcode_deploys_and_forwards_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let o = bin()
        .arg("up")
        .arg(root().join("examples/ext/wasm-demo.toml"))
        .args(["--for", "1s", "--socket"])
        .arg(&sock)
        .output()
        .unwrap();
    let s = out(&o);
    assert!(o.status.success(), "{s}");
    let line = s
        .lines()
        .find(|l| l.trim_start().starts_with("counter"))
        .unwrap_or_else(|| panic!("{s}"));
    assert!(line.contains(" wasm "), "placed on the wasm PE: {line}");
    let n: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("invocations="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(n > 0, "{line}");
    let ck = s
        .lines()
        .find(|l| l.trim_start().starts_with("checksum"))
        .unwrap();
    assert!(
        ck.contains("sequence_gaps=0"),
        "records forwarded in order: {ck}"
    );
}

#[test]
fn ext_check_and_calibrate_commands() {
    let o = bin()
        .args(["ext", "check"])
        .arg(root().join("crates/ext-verify/corpus/benign/classifier.wat"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("handler `handle`: bound"), "{}", out(&o));
    let o = bin()
        .args(["ext", "check"])
        .arg(root().join("crates/ext-verify/corpus/hostile/unbounded_loop.wat"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(
        out(&o).contains("no provable bound and no declared bound"),
        "{}",
        out(&o)
    );
    let dir = tempfile::tempdir().unwrap();
    let cal = dir.path().join("cal.json");
    let o = bin()
        .args(["calibrate", "--quick", "--out"])
        .arg(&cal)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        out(&o).contains("memory latency by working set"),
        "{}",
        out(&o)
    );
    assert!(cal.exists());
}
