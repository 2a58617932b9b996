//! Shared by the Orion benchmarks (and the repair e2e test): a test cgroup on this machine's mixed layout (v2 for
//! the freeze and the kill, v1 `pids.max` and `memory.limit_in_bytes` as the safety
//! net), processes spawned into it, waiting for it to empty, and removal on drop.
#![allow(dead_code)] // each bench uses a part

use sidecore_orion::procscan::cgroup_pids;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const V2: &str = "/sys/fs/cgroup/unified";
pub const PIDS: &str = "/sys/fs/cgroup/pids";
pub const MEM: &str = "/sys/fs/cgroup/memory";

pub struct TestCgroup {
    pub v2: PathBuf,
    pub pids: PathBuf,
    pub mem: PathBuf,
}

/// Why the benchmarks cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root".to_owned());
    }
    for d in [V2, PIDS, MEM] {
        if !Path::new(d).join("cgroup.procs").exists() {
            return Some(format!("{d} is not a mounted cgroup hierarchy"));
        }
    }
    None
}

impl TestCgroup {
    /// A fresh cgroup `orion-bench-<tag>-<pid>` in all three hierarchies, with the v1
    /// limits set.
    pub fn new(tag: &str, pids_max: u64, mem_limit: u64) -> TestCgroup {
        let name = format!("orion-bench-{tag}-{}", std::process::id());
        let cg = TestCgroup {
            v2: Path::new(V2).join(&name),
            pids: Path::new(PIDS).join(&name),
            mem: Path::new(MEM).join(&name),
        };
        for d in [&cg.v2, &cg.pids, &cg.mem] {
            std::fs::create_dir_all(d).expect("mkdir cgroup");
        }
        std::fs::write(cg.pids.join("pids.max"), pids_max.to_string()).expect("pids.max");
        std::fs::write(cg.mem.join("memory.limit_in_bytes"), mem_limit.to_string())
            .expect("memory limit");
        cg
    }

    /// Runs `args` inside all three cgroups, in a process group of its own.
    pub fn spawn(&self, args: &[&str]) -> Child {
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

    /// The processes now in the v2 cgroup.
    pub fn procs(&self) -> Vec<u32> {
        cgroup_pids(&self.v2).unwrap_or_default()
    }

    /// Polls (every 200 µs) until the v2 cgroup holds no process; the time it took.
    pub fn wait_empty(&self, timeout: Duration) -> Option<Duration> {
        let start = Instant::now();
        let procs = self.v2.join("cgroup.procs");
        loop {
            let t = std::fs::read_to_string(&procs).unwrap_or_default();
            if t.trim().is_empty() {
                return Some(start.elapsed());
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Polls until the cgroup holds `n` processes (or `timeout`).
    pub fn wait_count(&self, n: usize, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.procs().len() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Kills everything in it (`cgroup.kill`) and waits.
    pub fn empty(&self) {
        let _ = std::fs::write(self.v2.join("cgroup.freeze"), "0");
        let _ = std::fs::write(self.v2.join("cgroup.kill"), "1");
        let _ = self.wait_empty(Duration::from_secs(10));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        self.empty();
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
