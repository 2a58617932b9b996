//! Helpers shared by the end-to-end tests of the `sidecore` binary: running
//! it, reading its output, waiting, and guards that leave no process behind.
#![allow(dead_code)]

pub mod cgroups;
pub mod mx;
pub mod sikker;
pub mod testbed;

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

/// The body of a GET over plain HTTP/1.1 (empty when nothing answers).
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// `promtool check metrics` accepts `text` (Debian's prometheus package).
pub fn promtool_ok(text: &str) {
    use std::io::Write as _;
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (scripts/setup.sh installs Debian's prometheus package)");
    p.stdin
        .take()
        .expect("promtool's stdin")
        .write_all(text.as_bytes())
        .expect("writing to promtool");
    let out = p.wait_with_output().expect("promtool's answer");
    assert!(
        out.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of the series whose name and labels are exactly `series`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Writes `DIR/{app}.toml`: app `app`, a three-offcode chain `source` (a
/// `record-source` with `source_params`, on the host) → `middle` (an
/// `inet-checksum` whose target kind is `middle_kind`) → `back` (an
/// `inet-checksum` on the host), over channels `records` (128-byte slots)
/// and `sums` (64). `id` is the offcodes' id without its last digit.
pub fn chain_manifest(
    dir: &std::path::Path,
    app: &str,
    id: &str,
    (middle, middle_kind): (&str, &str),
    source_params: &str,
) -> PathBuf {
    let p = dir.join(format!("{app}.toml"));
    let text = format!(
        r#"
[app]
name = "{app}"

[[offcode]]
name = "source"
id = "{id}1"
impl = "record-source"
outputs = ["out"]
params = {{ {source_params} }}
  [[offcode.target]]
  kind = "host"

[[offcode]]
name = "{middle}"
id = "{id}2"
impl = "inet-checksum"
inputs = ["in"]
outputs = ["out"]
  [[offcode.target]]
  kind = "{middle_kind}"

[[offcode]]
name = "back"
id = "{id}3"
impl = "inet-checksum"
inputs = ["in"]
  [[offcode.target]]
  kind = "host"

[[channel]]
name = "records"
from = "source.out"
to = "{middle}.in"
slot_size = 128

[[channel]]
name = "sums"
from = "{middle}.out"
to = "back.in"
slot_size = 64
"#
    );
    std::fs::write(&p, text).unwrap();
    p
}
