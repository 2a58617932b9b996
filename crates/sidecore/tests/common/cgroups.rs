//! Real cgroup v2 groups for end-to-end tests: made under the v2 mount,
//! processes started inside them, removed (with their processes) on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// Where cgroup v2 is mounted (`/sys/fs/cgroup` or `/sys/fs/cgroup/unified`).
pub fn cgroup2_root() -> Option<PathBuf> {
    let m = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    m.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if !post.starts_with("cgroup2 ") {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Cgroups made for the test, removed (after their processes) on drop.
pub struct Groups {
    root: PathBuf,
    name: String,
}

impl Groups {
    pub fn new(root: &Path, tag: &str, subs: &[&str]) -> Groups {
        let name = format!("sc-{tag}-test-{}", std::process::id());
        for s in subs {
            std::fs::create_dir_all(root.join(&name).join(s)).unwrap();
        }
        Groups {
            root: root.to_path_buf(),
            name,
        }
    }
    /// The cgroup v2 path of `sub`, as `/proc/PID/cgroup` shows it.
    pub fn path(&self, sub: &str) -> String {
        format!("/{}/{sub}", self.name)
    }
    pub fn procs(&self, sub: &str) -> PathBuf {
        self.root.join(&self.name).join(sub).join("cgroup.procs")
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        let top = self.root.join(&self.name);
        if let Ok(rd) = std::fs::read_dir(&top) {
            for e in rd.flatten().filter(|e| e.path().is_dir()) {
                let _ = std::fs::write(e.path().join("cgroup.kill"), "1");
                std::thread::sleep(Duration::from_millis(50));
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let _ = std::fs::remove_dir(&top);
    }
}

/// As root, one test at a time: a fresh group `tag` with the cgroups `subs`;
/// `None` when not root (the test skips). Panics without a cgroup v2 mount.
pub fn root_groups(
    tag: &str,
    subs: &[&str],
) -> Option<(std::sync::MutexGuard<'static, ()>, Groups)> {
    if !sidecore_testbed::testing::root() {
        return None;
    }
    let Some(cg) = cgroup2_root() else {
        panic!("no cgroup v2 mount on this machine");
    };
    let serial = super::serial();
    Some((serial, Groups::new(&cg, tag, subs)))
}

/// `sidecore sikker recv` inside cgroup `procs`, through the agent at `sock`:
/// it takes `count` messages, waiting at most `timeout_ms` for each.
pub fn recv_in(procs: &Path, sock: &str, count: usize, timeout_ms: u64) -> Child {
    spawn_in(
        procs,
        &[
            "sikker",
            "recv",
            "--socket",
            sock,
            "--count",
            &count.to_string(),
            "--timeout-ms",
            &timeout_ms.to_string(),
        ],
    )
}

/// `sidecore ARGS` started inside cgroup `procs` (the shell joins it, then execs).
pub fn in_group(procs: &Path, args: &[&str]) -> Command {
    let exe = env!("CARGO_BIN_EXE_sidecore");
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!(
            "echo $$ > {} && exec \"$0\" \"$@\"",
            procs.display()
        ))
        .arg(exe)
        .args(args)
        .env_remove("SIDECORE_SOCKET");
    c
}

pub fn run_in(procs: &Path, args: &[&str]) -> Output {
    in_group(procs, args).output().unwrap()
}

pub fn spawn_in(procs: &Path, args: &[&str]) -> Child {
    in_group(procs, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}
