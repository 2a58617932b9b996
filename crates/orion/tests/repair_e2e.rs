//! Real bombs, real hogs (as root, on this machine's mixed cgroup layout): a shell fork
//! bomb and a memory hog run in a test cgroup — v2 for the freeze and the kill, v1
//! `pids.max` = 200 and `memory.limit_in_bytes` as the safety net — beside a
//! whitelisted process in the same cgroup, a bystander, and a process outside. The
//! healer must detect and repair each, touch nothing outside the cgroup, and spare the
//! whitelist. Skipped, with a message, when not root or without the cgroup mounts.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use sidecore_orion::actions::ActionLog;
use sidecore_orion::implicit::ImplicitSource;
use sidecore_orion::policy::{ForkBombThresholds, VictimScope, Whitelist};
use sidecore_orion::repair::{Healer, HealerConfig, RepairReport, TreeSource};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

// The benchmarks' test cgroup: the same mixed layout, spawn and removal.
#[path = "../benches/common/mod.rs"]
mod common;

use common::TestCgroup;

/// A test cgroup with `pids.max` = 200 and `mem_limit`, or `None` (said why)
/// when this machine cannot make one.
fn test_cgroup(tag: &str, mem_limit: u64) -> Option<TestCgroup> {
    if let Some(why) = common::unavailable() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(TestCgroup::new(&format!("test-{tag}"), 200, mem_limit))
}

fn alive(c: &mut Child) -> bool {
    matches!(c.try_wait(), Ok(None))
}

#[test]
fn a_shell_fork_bomb_is_repaired_from_kernel_events_and_nothing_else_is_touched() {
    shell_bomb(true);
}

#[test]
fn a_shell_fork_bomb_is_repaired_from_proc_scans_and_nothing_else_is_touched() {
    shell_bomb(false);
}

/// A bash fork bomb (`:(){ :|:& };:`, every parent exiting as soon as it has forked)
/// beside a whitelisted `sleep` in the cgroup and a `sleep` outside it; the shadow tree
/// from the kernel's fork/exec/exit events, or from /proc scans.
fn shell_bomb(kernel_sensors: bool) {
    let Some(cg) = test_cgroup(
        if kernel_sensors {
            "bomb-ebpf"
        } else {
            "bomb-proc"
        },
        256 << 20,
    ) else {
        return;
    };
    let mut outside = Command::new("sleep").arg("30").spawn().expect("sleep");
    let mut keeper = cg.spawn(&["sleep", "30"]);
    std::thread::sleep(Duration::from_millis(50));
    let mut cfg = HealerConfig::new(&cg.v2);
    cfg.thresholds = ForkBombThresholds {
        max_count: 100,
        max_depth: 64,
        max_breadth: 150,
        max_rate_per_s: 5000.0,
    };
    cfg.whitelist = Whitelist {
        names: ["sleep".to_owned()].into(),
        ..Whitelist::default()
    };
    cfg.kernel_sensors = kernel_sensors;
    let mut healer = Healer::new(cfg, ActionLog::new(None)).expect("healer");
    eprintln!("shadow tree from {:?}", healer.source());
    // As root on this kernel (BTF, BPF) the sensors must attach; elsewhere the healer
    // says why not and scans /proc.
    assert_eq!(
        matches!(healer.source(), TreeSource::Kernel { .. }),
        kernel_sensors,
        "{:?}",
        healer.source()
    );
    assert!(healer.check_fork_bomb().unwrap().is_none(), "no bomb yet");
    let mut bomb = cg.spawn(&["bash", "-c", ":(){ :|:& };:"]);
    let start = Instant::now();
    let report = loop {
        if let Some(r) = healer.check_fork_bomb().expect("check") {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "bomb never detected"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    eprintln!("repair: {}", serde_json::to_string(&report).unwrap());
    for a in healer.log().entries() {
        eprintln!(
            "  {} {} {}",
            a.kind,
            a.target,
            a.evidence.to_string().chars().take(300).collect::<String>()
        );
    }
    let _ = bomb.wait();
    let deadline = Instant::now() + Duration::from_secs(5);
    while cg.procs() != vec![keeper.id()] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        cg.procs(),
        vec![keeper.id()],
        "only the whitelisted process is left"
    );
    assert!(report.killed.len() > 50, "killed {}", report.killed.len());
    if kernel_sensors {
        // Lineage through exited parents makes the bomb one tree: the first pass
        // takes all of it (a /proc scan sees orphans as separate roots).
        assert!(
            report.passes <= 2,
            "{} passes with the kernel's events",
            report.passes
        );
        assert_eq!(healer.events_dropped(), 0, "no event lost");
    }
    assert!(!report.killed.contains(&keeper.id()));
    assert!(alive(&mut keeper), "whitelisted process survived");
    assert!(alive(&mut outside), "process outside the cgroup untouched");
    assert!(
        healer
            .log()
            .entries()
            .iter()
            .any(|a| a.kind == "detected" && a.evidence.to_string().contains("count"))
    );
    let _ = outside.kill();
    let _ = outside.wait();
}

/// Polls the cgroup's memory use every 20 ms until the healer repairs a hog
/// (at most 10 s); prints its report and action log.
fn repair_hog(healer: &mut Healer, cg: &TestCgroup, limit: u64) -> RepairReport {
    let sensor = ImplicitSource::CgroupMemory(cg.mem.clone());
    let start = Instant::now();
    let report = loop {
        let usage = sensor.read().expect("memory sensor")[0].1;
        if let Some(r) = healer.check_memory(usage, limit).expect("check") {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "hog never detected (usage {usage})"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("repair: {}", serde_json::to_string(&report).unwrap());
    for a in healer.log().entries() {
        eprintln!(
            "  {} {} {}",
            a.kind,
            a.target,
            a.evidence.to_string().chars().take(400).collect::<String>()
        );
    }
    report
}

/// A hog made of four processes of one process group, each smaller than a
/// bystander in its own group: the group holds the most memory together, so it
/// is the one killed, whole, and the larger bystander survives (§3.5.2 ranks
/// process groups; ranking processes would kill the bystander first).
#[test]
fn a_hog_group_of_small_processes_is_ranked_as_one_and_the_larger_bystander_survives() {
    let limit: u64 = 400 << 20;
    let Some(cg) = test_cgroup("hog-group", limit) else {
        return;
    };
    // ~65 MiB resident: perl keeps the folded constant and the copy.
    let mut bystander = cg.spawn(&["perl", "-e", "my $x = 'x' x (30 << 20); sleep 30"]);
    let mut group = cg.spawn(&[
        "sh",
        "-c",
        "for i in 1 2 3 4; do perl -e 'my $x = \"x\" x (20 << 20); sleep 30' & done; wait",
    ]);
    let mut cfg = HealerConfig::new(&cg.v2);
    cfg.scope = VictimScope::ProcessGroup;
    // 200 MiB: reached only once at least three of the group's ~40 MiB hogs
    // stand beside the bystander, so the group outweighs it.
    cfg.memory_fraction = 0.5;
    let mut healer = Healer::new(cfg, ActionLog::new(None)).expect("healer");
    let report = repair_hog(&mut healer, &cg, limit);
    assert!(
        report.killed.contains(&group.id()),
        "the group's shell was killed with its perls: {:?}",
        report.killed
    );
    assert!(!report.killed.contains(&bystander.id()));
    assert!(report.killed.len() >= 4, "{:?}", report.killed);
    let status = group.wait().expect("wait group");
    assert!(!status.success(), "the hog group was killed");
    std::thread::sleep(Duration::from_millis(50));
    assert!(alive(&mut bystander), "the larger bystander survived");
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn a_memory_hog_is_killed_by_process_group_and_bystanders_survive() {
    let limit: u64 = 400 << 20;
    let Some(cg) = test_cgroup("hog", limit) else {
        return;
    };
    let mut outside = Command::new("sleep").arg("30").spawn().expect("sleep");
    let mut keeper = cg.spawn(&["sleep", "30"]);
    let mut bystander = cg.spawn(&["tail", "-f", "/dev/null"]);
    let mut hog = cg.spawn(&["perl", "-e", "my $x = 'x' x (120 << 20); sleep 30"]);
    let mut cfg = HealerConfig::new(&cg.v2);
    cfg.whitelist = Whitelist {
        names: ["sleep".to_owned()].into(),
        ..Whitelist::default()
    };
    cfg.scope = VictimScope::ProcessGroup;
    cfg.memory_fraction = 0.25;
    let mut healer = Healer::new(cfg, ActionLog::new(None)).expect("healer");
    let report = repair_hog(&mut healer, &cg, limit);
    assert_eq!(report.culprit, hog.id());
    assert_eq!(report.killed, vec![hog.id()]);
    let status = hog.wait().expect("wait hog");
    assert!(!status.success(), "hog was killed");
    std::thread::sleep(Duration::from_millis(50));
    assert!(alive(&mut keeper), "whitelisted process survived");
    assert!(
        alive(&mut bystander),
        "bystander in another process group survived"
    );
    assert!(alive(&mut outside), "process outside the cgroup untouched");
    let _ = outside.kill();
    let _ = outside.wait();
}
