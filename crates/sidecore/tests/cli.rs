//! End-to-end tests of the `sidecore` binary as a user runs it: real
//! processes, real cores, real Unix sockets and signals.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

mod common;

use std::path::PathBuf;
use std::process::Stdio;

use common::*;

fn example() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../../examples/checksum.toml")
}

#[test]
fn check_accepts_the_example_and_names_problems_in_bad_ones() {
    let o = run(&["check", example().to_str().unwrap()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("ok — app `checksum-demo`: 2 offcode(s), 1 constraint(s), 1 channel(s)"),
        "{out}"
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[offcode]]\nname = \"s\"\nid = \"5b0c1e7a-2d43-4f4e-9b0a-6c1f0e6f2a01\"\nimpl = \"record-source\"\noutputs = [\"out\"]\nparams = { record_size = 2 }\n[[offcode.target]]\nkind = \"core\"\n",
    )
    .unwrap();
    let o = run(&["check", bad.to_str().unwrap()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("bad.toml:6:10") && err.contains("record_size must be at least 8"),
        "{err}"
    );

    std::fs::write(&bad, "[[offcode]]\nname = \"s\"\nid = 7\n").unwrap();
    let o = run(&["check", bad.to_str().unwrap()]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("bad.toml:3:6") && err.contains("invalid type"),
        "{err}"
    );
}

/// Run by an ordinary user (nobody, through setpriv), `devices` says the
/// kernel PE is absent and why, with the kernel's refusal and what to do.
#[test]
fn devices_tells_an_unprivileged_user_why_the_kernel_refuses() {
    if !sidecore_testbed::testing::root() {
        return;
    }
    // The build's directory may be closed to other users: run a copy.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("sidecore");
    std::fs::copy(env!("CARGO_BIN_EXE_sidecore"), &copy).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&copy)
        .args(["devices", "--json"])
        .env_remove("SIDECORE_NODES")
        .output()
        .expect("setpriv (util-linux)");
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let kernel = v["absent"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "kernel")
        .unwrap_or_else(|| panic!("the kernel PE is not absent for nobody: {v}"));
    let reason = kernel["reason"].as_str().unwrap();
    assert!(
        reason.contains("Operation not permitted") && reason.contains("needs root or CAP_BPF"),
        "{reason}"
    );
}

#[test]
fn devices_lists_every_kind_or_says_why_not() {
    let o = run(&["devices", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let kinds: Vec<&str> = v["pes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    let absent: Vec<&str> = v["absent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    for k in ["core", "kernel", "wasm", "node", "gpu", "host"] {
        assert!(
            kinds.contains(&k) || absent.contains(&k),
            "{k} neither present nor absent: {v}"
        );
    }
    assert!(kinds.contains(&"host"));
    // Each PE says what this build can place on it: the host runs the
    // built-ins, the wasm engine loads modules, and a kernel without a BPF
    // loader in this build loads nothing.
    let loads = |kind: &str| -> Vec<String> {
        v["pes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["kind"] == kind)
            .map(|p| {
                p["loads"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l.as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(loads("host").contains(&"inet-checksum".to_string()), "{v}");
    if kinds.contains(&"wasm") {
        assert!(loads("wasm").contains(&"wasm modules".to_string()), "{v}");
    }
    if kinds.contains(&"kernel") {
        assert!(!loads("kernel").iter().any(|l| l == "inet-checksum"), "{v}");
    }
    assert!(
        v["absent"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| !a["reason"].as_str().unwrap().is_empty())
    );

    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.toml");
    std::fs::write(&nodes, "[[node]]\nname = \"b\"\naddr = \"127.0.0.1:1\"\n").unwrap();
    let o = run(&["devices", "--nodes", nodes.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(out.contains("node b at 127.0.0.1:1: unreachable"), "{out}");
}

#[test]
fn layout_explains_each_placement() {
    let _g = serial();
    let o = run(&["layout", example().to_str().unwrap(), "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let p = v["placements"].as_array().unwrap();
    assert_eq!(p.len(), 2);
    assert!(p.iter().all(|x| !x["reason"].as_str().unwrap().is_empty()));
    assert_eq!(v["channels"][0]["transport"], "ring");
}

#[test]
fn up_runs_the_example_and_checksums_every_record() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let o = run(&[
        "up",
        example().to_str().unwrap(),
        "--for",
        "1s",
        "--json",
        "--quiet",
        "--socket",
        sock.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["stopped_because"], "ran for 1s");
    let ocs = v["status"][0]["offcodes"].as_array().unwrap();
    let sum = ocs.iter().find(|o| o["name"] == "checksum").unwrap();
    let src = ocs.iter().find(|o| o["name"] == "source").unwrap();
    let got = sum["metrics"]["records"].as_u64().unwrap();
    assert!(got > 1000, "{v}");
    assert_eq!(sum["metrics"]["sequence_gaps"], 0);
    // The source may have sent a few more that were still in the ring at the stop.
    assert!(src["metrics"]["records"].as_u64().unwrap() >= got);
    assert!(!sock.exists(), "control socket removed on exit");
}

#[test]
fn sigterm_stops_up_cleanly_and_ps_and_down_reach_it() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let s = sock.to_str().unwrap();
    let mut child = Guard(
        bin()
            .args(["up", example().to_str().unwrap(), "--quiet", "--socket", s])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| sock.exists(), 30), "control socket appears");
    let ps_json = || -> serde_json::Value {
        let ps = run(&["ps", "--json", "--socket", s]);
        serde_json::from_slice(&ps.stdout).unwrap_or_default()
    };
    assert!(
        wait_for(|| ps_json()[0]["name"] == "checksum-demo", 30),
        "the app shows in ps"
    );
    let v = ps_json();
    assert_eq!(v[0]["state"], "running");
    // A second foreground daemon on the same socket is refused, clearly.
    let o = run(&["up", example().to_str().unwrap(), "--quiet", "--socket", s]);
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("another sidecore daemon is listening"),
        "{}",
        text(&o).1
    );

    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut child.0, 30).expect("exits after SIGTERM");
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(child.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(out.contains("stopped (signal)"), "{out}");
    assert!(!sock.exists(), "socket removed");

    // `sidecore down` also ends a foreground `up`.
    let mut child = Guard(
        bin()
            .args(["up", example().to_str().unwrap(), "--quiet", "--socket", s])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| sock.exists(), 30));
    assert!(wait_for(|| ps_json()[0]["name"] == "checksum-demo", 30));
    let o = run(&["down", "checksum-demo", "--socket", s]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(text(&o).0.contains("stopped checksum-demo"));
    assert!(
        wait_exit(&mut child.0, 30)
            .expect("exits after down")
            .success()
    );
    let mut out = String::new();
    std::io::Read::read_to_string(child.0.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(out.contains("stopped by `sidecore down`"), "{out}");
}

#[test]
fn detached_up_ps_and_down_through_a_background_daemon() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let s = sock.to_str().unwrap();
    let _daemon = DaemonGuard(sock.clone());
    let o = run(&["up", "-d", example().to_str().unwrap(), "--socket", s]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("deployed checksum-demo"), "{out}");
    let ps = run(&["ps", "--socket", s]);
    let (out, _) = text(&ps);
    assert!(
        out.contains("checksum-demo") && out.contains("source") && out.contains("running"),
        "{out}"
    );
    // Deploying it again while it runs is refused.
    let o = run(&["up", "-d", example().to_str().unwrap(), "--socket", s]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("already running"), "{}", text(&o).1);
    // A bad manifest is refused with its diagnostics, and the running app is untouched.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[offcode]]\nname = 1\n").unwrap();
    let o = run(&["up", "-d", bad.to_str().unwrap(), "--socket", s]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("bad.toml:2:8"), "{}", text(&o).1);
    let ps = run(&["ps", "--json", "--socket", s]);
    let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    assert_eq!(v[0]["state"], "running");
    // down --daemon stops the app and the daemon.
    let o = run(&["down", "--daemon", "--socket", s]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(!sock.exists());
    let o = run(&["ps", "--socket", s]);
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("no sidecore daemon at"),
        "{}",
        text(&o).1
    );
}

#[test]
fn up_refuses_a_bad_manifest_with_its_location() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[offcode]]\nname = \"a\"\nid = \"5b0c1e7a-2d43-4f4e-9b0a-6c1f0e6f2a01\"\npriority = \"urgent\"\n[[offcode.target]]\nkind = \"host\"\n").unwrap();
    let o = run(&[
        "up",
        bad.to_str().unwrap(),
        "--socket",
        dir.path().join("x.sock").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let (_, err) = text(&o);
    assert!(
        err.contains("bad.toml:4:12") && err.contains("unknown priority `urgent`"),
        "{err}"
    );
}
