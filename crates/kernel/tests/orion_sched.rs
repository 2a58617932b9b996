//! Orion's fork/exec/exit sensors on the real kernel (as root): a shell in a
//! fresh cgroup v2 directory forks, execs and exits; the ring buffer must
//! report each of its processes, with the right parents and commands, and
//! nothing from a shell outside the cgroup.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use sidecore_kernel::orion_sched::{SchedEvents, SchedKind, cgroup_level};
use sidecore_kernel::sikker_l4::cgroup2_root;
use sidecore_testbed::testing::root;

struct Group(PathBuf);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn forks_execs_and_exits_in_the_cgroup_are_reported_and_nothing_outside() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let top = cgroup2_root().expect("cgroup v2 is mounted");
    let g = Group(top.join(format!("sc-orion-sched-{}", std::process::id())));
    std::fs::create_dir_all(&g.0).unwrap();
    assert_eq!(cgroup_level(&g.0).unwrap(), cgroup_level(&top).unwrap() + 1);
    let mut ev = SchedEvents::attach(&g.0).expect("attach the sched sensors");
    eprintln!("attached as {:?}", ev.attached_as());

    // Outside: must not be reported.
    Command::new("sh")
        .args(["-c", "true & wait"])
        .status()
        .unwrap();
    // Inside: a shell that forks three subshells, one of which execs `sleep`.
    let procs = g.0.join("cgroup.procs");
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "(exit 0) & (exit 0) & sleep 0.05 & wait"]);
    // SAFETY: the pre_exec closure only writes a file (async-signal-safe enough
    // for a single-threaded child between fork and exec: open/write/close).
    unsafe {
        cmd.pre_exec(move || std::fs::write(&procs, "0"));
    }
    let mut child = cmd.spawn().unwrap();
    let shell = child.id();
    child.wait().unwrap();

    let mut seen: Vec<_> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        ev.drain(|e| seen.push(e));
        if seen.iter().filter(|e| e.kind == SchedKind::Exit).count() >= 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for e in &seen {
        eprintln!("{e:?}");
    }
    let forks: BTreeMap<u32, u32> = seen
        .iter()
        .filter(|e| e.kind == SchedKind::Fork)
        .map(|e| (e.pid, e.ppid))
        .collect();
    assert_eq!(forks.len(), 3, "three children forked in the cgroup");
    assert!(forks.values().all(|pp| *pp == shell), "all by the shell");
    assert!(
        seen.iter()
            .any(|e| e.kind == SchedKind::Exec && e.comm == "sleep"),
        "the exec of sleep, with its new comm"
    );
    let exits: Vec<u32> = seen
        .iter()
        .filter(|e| e.kind == SchedKind::Exit)
        .map(|e| e.pid)
        .collect();
    assert!(exits.contains(&shell), "the shell's exit");
    assert!(
        forks.keys().all(|c| exits.contains(c)),
        "every child's exit"
    );
    assert!(
        seen.iter()
            .all(|e| e.pid == shell || forks.contains_key(&e.pid)),
        "nothing from outside the cgroup"
    );
    let stats = ev.stats().unwrap();
    assert_eq!((stats.forks, stats.dropped), (3, 0));
}
