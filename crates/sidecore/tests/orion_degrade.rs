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

/// `orion watch --realtime` runs its monitor loop at SCHED_FIFO (read back from
/// /proc while it runs); without CAP_SYS_NICE it refuses with a clear error
/// instead of watching at a priority that load can delay.
#[test]
fn realtime_watch_runs_at_sched_fifo_or_says_why_not() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let exe = env!("CARGO_BIN_EXE_sidecore");
    let child = Command::new(exe)
        .args(["orion", "watch", "--realtime", "--seconds", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // /proc/PID/stat's 41st field is the scheduling policy (1 = SCHED_FIFO).
    let policy = || -> Option<u32> {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).ok()?;
        let after = &s[s.rfind(')')? + 2..];
        after.split_whitespace().nth(38)?.parse().ok()
    };
    let t0 = std::time::Instant::now();
    let mut seen = None;
    while t0.elapsed() < std::time::Duration::from_secs(2) {
        seen = policy();
        if seen == Some(1) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert_eq!(seen, Some(1), "the monitor's policy: {seen:?}");
    let o = Command::new("setpriv")
        .args(["--bounding-set=-sys_nice", exe])
        .args(["orion", "watch", "--realtime", "--seconds", "1"])
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("--realtime: cannot run the monitor at SCHED_FIFO")
            && err.contains("CAP_SYS_NICE"),
        "{err}"
    );
}
