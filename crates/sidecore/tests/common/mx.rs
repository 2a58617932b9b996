//! What the Metachory end-to-end tests share (`mx_remote.rs`,
//! `mx_migrate.rs`): one test at a time, root or skip, `ip` commands, and a
//! daemon in a network namespace with a private /tmp that holds none of the
//! client's files.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use super::{Guard, wait_for};

/// The tests share namespaces and addresses: one at a time.
static ONE: Mutex<()> = Mutex::new(());

pub fn one() -> MutexGuard<'static, ()> {
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// False (skip) when not root, unless SIDECORE_REQUIRE_ROOT says fail.
pub fn root() -> bool {
    let is_root = sidecore_testbed::testing::root();
    if !is_root {
        eprintln!("skipped: the Metachory tests need root");
    }
    is_root
}

/// Runs `ip ARGS`, which must succeed.
pub fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `sidecore daemon` named `ns`, listening on `addr`, inside namespace `ns`
/// with a private tmpfs on /tmp (`prep`, shell commands ending in `&& `, run
/// there first), extra environment `env`, its stderr in `log`; returned once
/// it listens.
pub fn daemon(ns: &str, addr: &str, log: &Path, prep: &str, env: &[(&str, &str)]) -> Guard {
    let script = format!(
        r#"mount -t tmpfs mx-hide /tmp && {prep}exec "$0" daemon --name "$1" --listen "$2" --socket /tmp/d.sock --http off"#
    );
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ])
    .arg(env!("CARGO_BIN_EXE_sidecore"))
    .arg(ns)
    .arg(addr)
    .env_remove("SIDECORE_NODES")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(log).expect("create the daemon's log"));
    for (k, v) in env {
        c.env(k, v);
    }
    let g = Guard(c.spawn().expect("start a daemon"));
    let ok = wait_for(
        || {
            Command::new("ip")
                .args(["netns", "exec", ns, "ss", "-ltnH"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(addr))
        },
        20,
    );
    assert!(
        ok,
        "daemon on {addr} never listened: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    // ip, unshare and sh each exec the next: the child is the daemon.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", g.0.id())).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("daemon\0--name"),
        "{cmdline:?}"
    );
    g
}
