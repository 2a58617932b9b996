//! `sidecore ext` and `sidecore calibrate` through the real binary: exit
//! statuses and the errors it prints.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

mod common;

/// Runs the real binary: `Ok(exit status)`, or `Err(what it printed)` when it
/// failed with an error (`error: …` on stderr).
fn run(args: &[&str]) -> Result<i32, String> {
    let o = common::run(args);
    let (_, err) = common::text(&o);
    if err.contains("error:") {
        Err(err)
    } else {
        Ok(o.status.code().unwrap_or(-1))
    }
}

fn corpus(rel: &str) -> String {
    format!(
        "{}/../ext-verify/corpus/{rel}",
        std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")
    )
}

#[test]
fn check_admits_benign_and_rejects_hostile() {
    let dir = tempfile::tempdir().unwrap();
    let cal = dir.path().join("none.json");
    // A missing explicit calibration file is an error naming the file.
    let e = run(&[
        "ext",
        "check",
        &corpus("benign/checksum.wat"),
        "--calibration",
        cal.to_str().unwrap(),
    ])
    .unwrap_err();
    assert!(e.contains("none.json"), "{e}");
    let out = dir.path().join("run.wasm");
    assert_eq!(
        run(&[
            "ext",
            "check",
            &corpus("benign/checksum.wat"),
            "--emit",
            out.to_str().unwrap()
        ])
        .unwrap(),
        0
    );
    assert!(std::fs::read(&out).unwrap().starts_with(b"\0asm"));
    assert_eq!(
        run(&["ext", "check", &corpus("hostile/recursion.wat"), "--json"]).unwrap(),
        1
    );
    // Tight limits reject an admissible module.
    assert_eq!(
        run(&[
            "ext",
            "check",
            &corpus("benign/chacha.wat"),
            "--min-interarrival-ns",
            "10",
            "--inflation",
            "2"
        ])
        .unwrap(),
        1
    );
    let e = run(&[
        "ext",
        "check",
        &corpus("benign/chacha.wat"),
        "--symbol",
        "MTU",
    ])
    .unwrap_err();
    assert!(e.contains("expected NAME=VALUE"), "{e}");
    let e = run(&[
        "ext",
        "check",
        &corpus("benign/chacha.wat"),
        "--inflation",
        "0.5",
    ])
    .unwrap_err();
    assert!(e.contains("--inflation must be at least 1"), "{e}");
    let e = run(&["ext", "check", "/nonexistent/x.wasm"]).unwrap_err();
    assert!(e.contains("/nonexistent/x.wasm"), "{e}");
}

#[test]
fn run_invokes_and_reports() {
    assert_eq!(
        run(&[
            "ext",
            "run",
            &corpus("benign/checksum.wat"),
            "--input-hex",
            "0102 0304",
            "--repeat",
            "2"
        ])
        .unwrap(),
        0
    );
    let e = run(&[
        "ext",
        "run",
        &corpus("benign/checksum.wat"),
        "--input-hex",
        "0g",
    ])
    .unwrap_err();
    assert!(e.contains("not hex"), "{e}");
    // The lying module is unloaded after its bound is broken (exit status 2).
    let big = "00".repeat(100);
    assert_eq!(
        run(&[
            "ext",
            "run",
            &corpus("hostile/lying_bound.wat"),
            "--input-hex",
            &big
        ])
        .unwrap(),
        2
    );
}

#[test]
fn calibrate_writes_a_loadable_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cal.json");
    assert_eq!(
        run(&["calibrate", "--quick", "--out", out.to_str().unwrap()]).unwrap(),
        0
    );
    let cal = sidecore_ext::calibrate::load(&out).unwrap();
    assert!(cal.tsc_per_ns > 0.0 && cal.invoke_cycles > 0.0);
    assert!(!cal.latency.is_empty());
    assert!(cal.host_base_cycles.contains_key("sc.emit"));
    assert_eq!(
        run(&[
            "ext",
            "check",
            &corpus("benign/classifier.wat"),
            "--calibration",
            out.to_str().unwrap()
        ])
        .unwrap(),
        0
    );
    // A corrupt file is reported with its position.
    std::fs::write(&out, "{ \"machine\": 3 }").unwrap();
    let e = sidecore_ext::calibrate::load(&out).unwrap_err().to_string();
    assert!(e.contains("cal.json: line 1"), "{e}");
}
