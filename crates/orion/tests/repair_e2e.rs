//! Real bombs, real hogs (as root, on this machine's mixed cgroup layout): a shell fork
//! bomb and a memory hog run in a test cgroup — v2 for the freeze and the kill, v1
//! `pids.max` = 200 and `memory.limit_in_bytes` as the safety net — beside a
//! whitelisted process in the same cgroup, a bystander, and a process outside. The
//! healer must detect and repair each, touch nothing outside the cgroup, and spare the
//! whitelist. Skipped, with a message, when not root or without the cgroup mounts.

use sidecore_orion::actions::ActionLog;
use sidecore_orion::implicit::ImplicitSource;
use sidecore_orion::policy::{ForkBombThresholds, VictimScope, Whitelist};
use sidecore_orion::procscan::cgroup_pids;
use sidecore_orion::repair::{Healer, HealerConfig};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const V2: &str = "/sys/fs/cgroup/unified";
const PIDS: &str = "/sys/fs/cgroup/pids";
const MEM: &str = "/sys/fs/cgroup/memory";

struct TestCgroup {
    v2: PathBuf,
    pids: PathBuf,
    mem: PathBuf,
}

impl TestCgroup {
    fn new(tag: &str, mem_limit: u64) -> Option<TestCgroup> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return None;
        }
        for d in [V2, PIDS, MEM] {
            if !Path::new(d).join("cgroup.procs").exists() {
                eprintln!("skipped: {d} is not a mounted cgroup hierarchy");
                return None;
            }
        }
        let name = format!("orion-test-{tag}-{}", std::process::id());
        let cg = TestCgroup {
            v2: Path::new(V2).join(&name),
            pids: Path::new(PIDS).join(&name),
            mem: Path::new(MEM).join(&name),
        };
        for d in [&cg.v2, &cg.pids, &cg.mem] {
            std::fs::create_dir_all(d).expect("mkdir cgroup");
        }
        std::fs::write(cg.pids.join("pids.max"), "200").expect("pids.max");
        std::fs::write(cg.mem.join("memory.limit_in_bytes"), mem_limit.to_string())
            .expect("memory limit");
        Some(cg)
    }

    /// Runs `args` inside all three cgroups, in a process group of its own.
    fn spawn(&self, args: &[&str]) -> Child {
        let script = format!(
            "echo $$ > {}/cgroup.procs && echo $$ > {}/cgroup.procs && echo $$ > {}/cgroup.procs && exec \"$@\"",
            self.v2.display(),
            self.pids.display(),
            self.mem.display()
        );
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .args(args)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn into the test cgroup")
    }

    fn pids(&self) -> Vec<u32> {
        cgroup_pids(&self.v2).unwrap_or_default()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.v2.join("cgroup.freeze"), "0");
        let _ = std::fs::write(self.v2.join("cgroup.kill"), "1");
        let start = Instant::now();
        while !self.pids().is_empty() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        for d in [&self.v2, &self.pids, &self.mem] {
            for _ in 0..100 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn alive(c: &mut Child) -> bool {
    matches!(c.try_wait(), Ok(None))
}

#[test]
fn a_shell_fork_bomb_is_repaired_and_nothing_else_is_touched() {
    let Some(cg) = TestCgroup::new("bomb", 256 << 20) else {
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
    let mut healer = Healer::new(cfg, ActionLog::new(None)).expect("healer");
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
    while cg.pids() != vec![keeper.id()] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        cg.pids(),
        vec![keeper.id()],
        "only the whitelisted process is left"
    );
    assert!(report.killed.len() > 50, "killed {}", report.killed.len());
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

#[test]
fn a_memory_hog_is_killed_by_process_group_and_bystanders_survive() {
    let limit: u64 = 400 << 20;
    let Some(cg) = TestCgroup::new("hog", limit) else {
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
