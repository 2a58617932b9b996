//! Helpers shared by the end-to-end tests of the `sidecore` binary: running
//! it, reading its output, waiting, and guards that leave no process behind.
#![allow(dead_code)]

pub mod cgroups;
pub mod sikker;

use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests pin threads to the machine's few cores: one at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sidecore"));
    c.env_remove("SIDECORE_NODES").env_remove("SIDECORE_SOCKET");
    c
}

pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run sidecore")
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

pub fn wait_for(cond: impl Fn() -> bool, secs: u64) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Kills the child if the test fails before it exits, so no process outlives
/// a failed test.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Stops a background daemon if the test fails before it does.
pub struct DaemonGuard(pub PathBuf);

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = run(&["down", "--daemon", "--socket", self.0.to_str().unwrap()]);
        }
    }
}

pub fn wait_exit(child: &mut Child, secs: u64) -> Option<std::process::ExitStatus> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

/// A TCP port free on loopback right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("its address")
        .port()
}

/// Offcode `name` in the first app of `up --json` output.
pub fn offcode<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["status"][0]["offcodes"]
        .as_array()
        .and_then(|a| a.iter().find(|o| o["name"] == name))
        .unwrap_or_else(|| panic!("no offcode {name} in {v}"))
}
