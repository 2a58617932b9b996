//! OR-9 / E10 side by side: a memory hog in a test cgroup with a v1
//! `memory.limit_in_bytes` of 256 MiB and the kernel's OOM killer on, repaired either
//! by the kernel alone (the OOM killer of the memory cgroup) or by Orion (a monitor
//! reading the cgroup's memory use every 25 ms and the existing [`Healer`] killing the
//! process group holding the most RSS together at 75 % of the limit). Beside the hog: a
//! whitelisted `sleep` and a bystander in its own process group holding a 30 MiB string
//! (about 65 MiB resident: perl keeps the folded constant and the copy).
//!
//! Two hogs: **single** (one perl process growing 4 MiB every 10 ms) and **group**
//! (four perl processes of one process group each growing 2 MiB every 20 ms). Reported:
//! the time from the hog's start until every hog process is gone, how many OOM kills
//! the kernel made (`memory.oom_control` `oom_kill`), the peak memory use, and whether
//! the bystander and the whitelisted process survived.
//!
//! Third, **earlyoom** (Debian's `earlyoom`, `scripts/setup.sh`): it acts on the host's
//! available memory, not on a cgroup, so it is started with its threshold (`-M`, KiB,
//! SIGTERM and SIGKILL alike) at the host's available memory before the hog minus 75 %
//! of the cgroup's limit — it acts once the hog has taken what makes Orion act — and,
//! so that it can only choose among the scenario's processes, inside a PID namespace
//! (`unshare --pid --mount-proc`) with the hog, the bystander and the whitelisted
//! `sleep` (which earlyoom cannot be told to spare: `--avoid '^sleep$'` is the nearest).
//! The namespace's init is the shell, not the hog (a namespace's processes die with
//! its init). Other load on the host moves its trigger; the row says what happened.
//!
//! Run (root): `cargo bench -p sidecore-orion --bench hog` (`ORION_HOG_TRIALS`, default 3).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // benchmark code: a failed unwrap is a failed run; scenarios read top to bottom

mod common;

use common::TestCgroup;
use sidecore_orion::actions::ActionLog;
use sidecore_orion::implicit::ImplicitSource;
use sidecore_orion::policy::{VictimScope, Whitelist};
use sidecore_orion::procscan::scan_cgroup;
use sidecore_orion::repair::{Healer, HealerConfig};
use std::process::Child;
use std::time::{Duration, Instant};

const LIMIT: u64 = 256 << 20;
const SINGLE: &str =
    "my @a; while (1) { push @a, 'x' x (4 << 20); select(undef, undef, undef, 0.01) }";
const GROUP: &str = "for (1..3) { last unless fork } my @a; while (1) { push @a, 'x' x (2 << 20); select(undef, undef, undef, 0.02) }";

fn alive(c: &mut Child) -> bool {
    matches!(c.try_wait(), Ok(None))
}

fn v1_value(cg: &TestCgroup, file: &str, key: Option<&str>) -> u64 {
    let t = std::fs::read_to_string(cg.mem.join(file)).unwrap_or_default();
    match key {
        None => t.trim().parse().unwrap_or(0),
        Some(k) => t
            .lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().parse().unwrap_or(0)))
            .unwrap_or(0),
    }
}

struct Outcome {
    recovery_ms: f64,
    oom_kills: u64,
    orion_killed: usize,
    peak_mib: f64,
    bystander: bool,
    keeper: bool,
}

fn one(script: &str, orion: bool) -> Outcome {
    let cg = TestCgroup::new("hog", 64, LIMIT);
    let mut keeper = cg.spawn(&["sleep", "1000"]);
    let mut bystander = cg.spawn(&["perl", "-e", "my $x = 'x' x (30 << 20); sleep 1000"]);
    std::thread::sleep(Duration::from_millis(300));
    let mut healer = orion.then(|| {
        let mut cfg = HealerConfig::new(&cg.v2);
        cfg.whitelist = Whitelist {
            names: ["sleep".to_owned()].into(),
            ..Whitelist::default()
        };
        cfg.scope = VictimScope::ProcessGroup;
        cfg.memory_fraction = 0.75;
        Healer::new(cfg, ActionLog::new(None)).expect("healer")
    });
    let sensor = ImplicitSource::CgroupMemory(cg.mem.clone());
    let start = Instant::now();
    let mut hog = cg.spawn(&["perl", "-e", script]);
    let pgid = hog.id();
    let mut killed = 0;
    // The hog's shell moves itself into the cgroup before it execs perl: until
    // its group has been seen there, an empty scan means "not yet", not "gone".
    let mut seen = false;
    let recovery = loop {
        std::thread::sleep(Duration::from_millis(25));
        if let Some(h) = healer.as_mut() {
            let usage = sensor.read().expect("memory sensor")[0].1;
            if let Some(r) = h.check_memory(usage, LIMIT).expect("check") {
                killed += r.killed.len();
            }
        }
        let _ = hog.try_wait();
        let left = scan_cgroup(&cg.v2)
            .unwrap_or_default()
            .iter()
            .filter(|p| p.pgid == pgid)
            .count();
        seen |= left > 0 || killed > 0 || hog.try_wait().is_ok_and(|s| s.is_some());
        if seen && left == 0 {
            break start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "hog never stopped"
        );
    };
    let out = Outcome {
        recovery_ms: recovery.as_secs_f64() * 1e3,
        oom_kills: v1_value(&cg, "memory.oom_control", Some("oom_kill ")),
        orion_killed: killed,
        peak_mib: v1_value(&cg, "memory.max_usage_in_bytes", None) as f64 / f64::from(1 << 20),
        bystander: alive(&mut bystander),
        keeper: alive(&mut keeper),
    };
    drop(cg);
    let _ = keeper.wait();
    let _ = bystander.wait();
    let _ = hog.wait();
    out
}

/// The host's available memory, KiB.
fn mem_available_kib() -> u64 {
    let t = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    t.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The hog repaired by earlyoom in a PID namespace with the scenario's processes.
fn one_earlyoom(script: &str) -> Outcome {
    let cg = TestCgroup::new("hog", 64, LIMIT);
    let threshold = mem_available_kib().saturating_sub(LIMIT * 3 / 4 / 1024);
    let inner = format!(
        "sleep 1000 & perl -e \"my \\$x = 'x' x (30 << 20); sleep 1000\" & \
         earlyoom -M {threshold},{threshold} -r 0 --avoid '^sleep$' >/dev/null 2>&1 & \
         sleep 0.5; perl -e \"$HOG\" & wait"
    );
    let mut ns = {
        let mut c = std::process::Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "sh", "-c", &inner])
            .env("HOG", script);
        let procs = cg.v2.join("cgroup.procs");
        let pids = cg.pids.join("cgroup.procs");
        let mem = cg.mem.join("cgroup.procs");
        use std::os::unix::process::CommandExt;
        // SAFETY: only writes to three files between fork and exec.
        unsafe {
            c.pre_exec(move || {
                for f in [&procs, &pids, &mem] {
                    std::fs::write(f, "0")?;
                }
                Ok(())
            });
        }
        c.spawn().expect("unshare")
    };
    let hogs = || -> Vec<u32> {
        cg.procs()
            .into_iter()
            .filter(|p| cmdline(*p).contains("push @a"))
            .collect()
    };
    // Wait for the hog to start (after earlyoom's 0.5 s head start).
    let t0 = Instant::now();
    while hogs().is_empty() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = Instant::now();
    let recovery = loop {
        std::thread::sleep(Duration::from_millis(25));
        if hogs().is_empty() {
            break start.elapsed();
        }
        if start.elapsed() > Duration::from_secs(30) {
            break start.elapsed();
        }
    };
    let procs = cg.procs();
    let bystander = procs.iter().any(|p| cmdline(*p).contains("30 << 20"));
    let keeper = procs.iter().any(|p| cmdline(*p).starts_with("sleep 1000"));
    let out = Outcome {
        recovery_ms: recovery.as_secs_f64() * 1e3,
        oom_kills: v1_value(&cg, "memory.oom_control", Some("oom_kill ")),
        orion_killed: 0,
        peak_mib: v1_value(&cg, "memory.max_usage_in_bytes", None) as f64 / f64::from(1 << 20),
        bystander,
        keeper,
    };
    drop(cg);
    let _ = ns.kill();
    let _ = ns.wait();
    out
}

fn main() {
    if let Some(why) = common::unavailable() {
        eprintln!("hog bench skipped: {why}");
        return;
    }
    let earlyoom = std::process::Command::new("earlyoom")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success());
    if !earlyoom {
        eprintln!("earlyoom is not installed (scripts/setup.sh): its rows are left out");
    }
    let trials: usize = std::env::var("ORION_HOG_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    println!(
        "memory hog under a v1 memory limit of 256 MiB (OOM killer on), {trials} trials per row, alternating"
    );
    println!(
        "| hog | repaired by | hog start → all hog processes gone, ms (each trial) | kernel OOM kills | Orion kills | peak use MiB | bystander survived | whitelisted survived |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, script) in [
        ("single (4 MiB / 10 ms)", SINGLE),
        ("group of 4 (2 MiB / 20 ms each)", GROUP),
    ] {
        let mut rows: [Vec<Outcome>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        let methods = if earlyoom { 3 } else { 2 };
        let bar = sidecore_plot::progress::Progress::bar((trials * methods) as u64, name);
        for t in 0..trials {
            for i in 0..methods {
                let by = ["the kernel", "Orion", "earlyoom"][(i + t) % methods];
                bar.say(format!("{name}, trial {t}, repaired by {by}"));
                match (i + t) % methods {
                    0 => rows[0].push(one(script, false)),
                    1 => rows[1].push(one(script, true)),
                    _ => rows[2].push(one_earlyoom(script)),
                }
                bar.step(name);
            }
        }
        drop(bar);
        for (label, r) in [
            ("kernel OOM killer", &rows[0]),
            ("Orion healer (75 %, 25 ms)", &rows[1]),
            ("earlyoom (host memory, same 75 %)", &rows[2]),
        ] {
            if r.is_empty() {
                continue;
            }
            let list =
                |f: &dyn Fn(&Outcome) -> String| r.iter().map(f).collect::<Vec<_>>().join(", ");
            println!(
                "| {name} | {label} | {} | {} | {} | {} | {} | {} |",
                list(&|o| format!("{:.0}", o.recovery_ms)),
                list(&|o| o.oom_kills.to_string()),
                list(&|o| o.orion_killed.to_string()),
                list(&|o| format!("{:.0}", o.peak_mib)),
                list(&|o| if o.bystander {
                    "yes".into()
                } else {
                    "no".into()
                }),
                list(&|o| if o.keeper { "yes".into() } else { "no".into() }),
            );
        }
    }
}
