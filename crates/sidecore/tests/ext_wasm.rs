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

/// A `key=value` counter from an offcode's summary line.
fn metric(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

#[test]
fn wasm_offcode_deploys_and_forwards_every_record() {
    const RECORDS: u64 = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    // The example with a bounded source (the app ends when every record has
    // crossed) and the module's path made absolute for the copy.
    let manifest = std::fs::read_to_string(root().join("examples/ext/wasm-demo.toml"))
        .unwrap()
        .replace("records = 0 }", &format!("records = {RECORDS} }}"))
        .replace(
            "module = \"../../crates",
            &format!("module = \"{}/crates", root().display()),
        );
    assert!(manifest.contains(&format!("records = {RECORDS}")));
    let m = dir.path().join("wasm-demo.toml");
    std::fs::write(&m, manifest).unwrap();
    let o = bin()
        .arg("up")
        .arg(&m)
        .args(["--for", "20s", "--socket"])
        .arg(&sock)
        .output()
        .unwrap();
    let s = out(&o);
    assert!(o.status.success(), "{s}");
    assert!(s.contains("every offcode finished"), "{s}");
    let line = |name: &str| {
        s.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}: {s}"))
            .to_string()
    };
    let counter = line("counter");
    assert!(
        counter.contains(" wasm "),
        "placed on the wasm PE: {counter}"
    );
    // Every record went through the untrusted handler, none dropped or over budget.
    assert_eq!(metric(&counter, "invocations"), RECORDS, "{counter}");
    assert_eq!(metric(&counter, "dropped"), 0, "{counter}");
    assert_eq!(metric(&counter, "violations"), 0, "{counter}");
    // And every one arrived at the checksum, in order.
    let ck = line("checksum");
    assert!(ck.contains(&format!("{RECORDS} records")), "{ck}");
    assert_eq!(metric(&ck, "sequence_gaps"), 0, "{ck}");
    assert_eq!(metric(&ck, "bytes"), RECORDS * 64, "{ck}");
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
