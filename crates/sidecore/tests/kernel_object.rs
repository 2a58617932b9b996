//! An eBPF offcode from a user's own BPF object, end to end through the
//! `sidecore` binary (as root; CI is): the example `examples/kernel/
//! udp_count.bpf.c` is compiled with clang, the example manifest
//! `examples/kernel/udp-count.toml` is laid out onto the kernel PE and
//! deployed by a daemon into a testbed; its XDP program drops the port its
//! config map names (from params), its ring buffer's records reach the
//! native `inet-checksum` offcode, a control message changes the config
//! live, and `down` leaves no program attached or loaded. A bad object fails
//! the deployment naming the offcode and the file.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::testbed::{probe, xdp_attached};
use common::{DaemonGuard, run, serial, text};
use sidecore_kernel::user_object::loaded_programs_named;
use sidecore_testbed::testing::{Cleanup, root};

fn repo(p: &str) -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../..")
        .join(p)
}

/// Compiles the example object into `dir`, as its manifest's comment says.
fn compile_example(dir: &Path) {
    let triple = Command::new("gcc")
        .arg("-print-multiarch")
        .output()
        .unwrap();
    let triple = String::from_utf8(triple.stdout).unwrap();
    let st = Command::new("clang")
        .args(["-O2", "-g", "-target", "bpf", "-c"])
        .arg(repo("examples/kernel/udp_count.bpf.c"))
        .arg("-o")
        .arg(dir.join("udp_count.bpf.o"))
        .arg(format!("-I/usr/include/{}", triple.trim()))
        .status()
        .expect("clang (scripts/setup.sh installs it)");
    assert!(st.success());
}

/// The example manifest, for testbed `prefix`, written into `dir` (beside
/// the object it names).
fn manifest(dir: &Path, prefix: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo("examples/kernel/udp-count.toml"))
        .unwrap()
        .replace("sidecore-middlebox", &format!("{prefix}-middlebox"));
    let path = dir.join("udp-count.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `ps --json`: offcode `name`'s metric `m` of the first app.
fn metric(sock: &str, name: &str, m: &str) -> u64 {
    let o = run(&["ps", "--json", "--socket", sock]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v[0]["offcodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == name)
        .and_then(|o| o["metrics"][m].as_u64())
        .unwrap_or(0)
}

#[test]
fn a_users_bpf_object_runs_on_the_kernel_pe_and_down_leaves_nothing() {
    if !root() {
        return;
    }
    let _g = serial();
    let prefix = format!("sco{}", std::process::id());
    let _bed = Cleanup(prefix.clone());
    assert!(
        run(&["testbed", "up", "--prefix", &prefix])
            .status
            .success()
    );
    let dir = tempfile::tempdir().unwrap();
    compile_example(dir.path());
    let m = manifest(dir.path(), &prefix);
    let ms = m.to_str().unwrap();

    // The layout puts it on the kernel, through the loader.
    let o = run(&["layout", ms]);
    assert!(
        text(&o).0.contains("udp-count        → kernel"),
        "{}",
        text(&o).0
    );
    let o = run(&["devices"]);
    assert!(text(&o).0.contains("kernel modules"), "{}", text(&o).0);

    let sock = dir.path().join("d.sock");
    let s = sock.to_str().unwrap();
    let _daemon = DaemonGuard(sock.clone());
    let o = run(&["up", "-d", ms, "--socket", s]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(common::wait_for(|| xdp_attached(&prefix), 10));
    assert!(common::wait_for(
        || metric(s, "udp-count", "programs_attached") == 2,
        10
    ));

    // params set config[0] = 5001: that port is dropped at the middlebox.
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5000]);
    // Both records crossed the ring buffer and the channel to the native
    // offcode (16 bytes each).
    assert!(
        common::wait_for(|| metric(s, "sink", "records") == 2, 10),
        "sink saw {} records",
        metric(s, "sink", "records")
    );
    assert_eq!(metric(s, "sink", "bytes"), 32);
    assert!(common::wait_for(
        || metric(s, "udp-count", "counts_0") == 1 && metric(s, "udp-count", "counts_1") == 1,
        5
    ));
    assert!(metric(s, "udp-count", "counts_2") >= 1, "tc egress counted");

    // A control message rewrites the config map live: now 5000 is dropped.
    let answer = sidecore_control::request(
        &sock,
        &sidecore_control::Request::Control {
            app: "udp-count".into(),
            offcode: "udp-count".into(),
            body: serde_json::json!({ "maps": { "config": { "0": 5000 } } }),
        },
        Duration::from_secs(5),
    )
    .unwrap();
    let answer = format!("{answer:?}");
    assert!(
        answer.contains("written") && !answer.contains("error"),
        "{answer}"
    );
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5001]);
    assert!(common::wait_for(|| metric(s, "sink", "records") == 4, 10));
    // A value that does not fit the map is refused, and changes nothing.
    let answer = sidecore_control::request(
        &sock,
        &sidecore_control::Request::Control {
            app: "udp-count".into(),
            offcode: "udp-count".into(),
            body: serde_json::json!({ "maps": { "config": { "0": 1u64 << 40 } } }),
        },
        Duration::from_secs(5),
    )
    .unwrap();
    let answer = format!("{answer:?}");
    assert!(answer.contains("does not fit in 4 bytes"), "{answer}");
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5001]);

    // down: nothing attached, nothing loaded, traffic unfiltered.
    let o = run(&["down", "--socket", s]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(common::wait_for(|| !xdp_attached(&prefix), 5));
    assert!(
        common::wait_for(
            || loaded_programs_named(&["udp_count", "egress_count"]).is_empty(),
            5
        ),
        "still loaded: {:?}",
        loaded_programs_named(&["udp_count", "egress_count"])
    );
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5000, 5001]);

    // A file that is no BPF object fails the deployment, naming the offcode
    // and the file; the daemon keeps running.
    std::fs::write(dir.path().join("udp_count.bpf.o"), "not an object").unwrap();
    let o = run(&["up", "-d", ms, "--socket", s]);
    let err = text(&o).1;
    assert!(
        !o.status.success()
            && err.contains("udp-count")
            && err.contains("udp_count.bpf.o")
            && err.contains("not an ELF object"),
        "{err}"
    );
    let o = run(&["down", "--daemon", "--socket", s]);
    assert!(o.status.success(), "{}", text(&o).1);
}
