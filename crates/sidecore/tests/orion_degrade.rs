//! `orion watch --heal` where the kernel refuses the eBPF process sensors (as root,
//! with CAP_BPF, CAP_SYS_ADMIN and CAP_PERFMON taken out of the bounding set by
//! `setpriv`): it says why on stderr, falls back to /proc scans, and still watches and
//! repairs; with the capabilities it uses the kernel's events.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::process::Command;

use common::*;
use sidecore_testbed::testing::root;

struct Group(std::path::PathBuf);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn watch(cg: &std::path::Path, drop_caps: bool) -> (bool, String) {
    let exe = env!("CARGO_BIN_EXE_sidecore");
    let mut cmd = if drop_caps {
        let mut c = Command::new("setpriv");
        c.args(["--bounding-set=-bpf,-sys_admin,-perfmon", exe]);
        c
    } else {
        Command::new(exe)
    };
    let o = cmd
        .args(["orion", "watch", "--heal", "--seconds", "1", "--cgroup"])
        .arg(cg)
        .output()
        .unwrap();
    let (_, err) = text(&o);
    (o.status.success(), err)
}

#[test]
fn without_bpf_the_healer_says_why_and_scans_proc() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let Some(top) = sidecore_kernel::sikker_l4::cgroup2_root() else {
        panic!("cgroup v2 is not mounted");
    };
    let g = Group(top.join(format!("sc-orion-degrade-{}", std::process::id())));
    std::fs::create_dir_all(&g.0).unwrap();
    let (ok, err) = watch(&g.0, false);
    assert!(ok, "{err}");
    assert!(
        err.contains("shadow process tree from the kernel's fork/exec/exit events"),
        "{err}"
    );
    let (ok, err) = watch(&g.0, true);
    assert!(ok, "{err}");
    assert!(
        err.contains(
            "shadow process tree from /proc scans (the kernel refused the eBPF process sensors:"
        ),
        "{err}"
    );
    assert!(err.contains("Operation not permitted"), "{err}");
}
