//! TCPServers deployed as offcodes by `sidecore up`: the example manifests
//! (`examples/tcps.toml`, `examples/tcps-stream.toml`) with their address,
//! control socket and root moved into a temporary directory. The file
//! server's files come back byte for byte through the PPEs; under a block
//! stream load the `tcps-autoscale` offcode grows ActivePPE onto the helper
//! PPE's core, connections move to it, every byte still arrives in order,
//! and once the load is gone ActivePPE shrinks back to the master.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;

fn repo() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..")
}

/// The example manifest `name` with `(from, to)` replacements, written to `dir`.
fn manifest(name: &str, dir: &Path, edits: &[(&str, String)]) -> PathBuf {
    let mut text = std::fs::read_to_string(repo().join("examples").join(name)).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{name} has no `{from}`");
        text = text.replace(from, to);
    }
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn up(manifest: &Path, sock: &Path) -> Guard {
    Guard(
        bin()
            .args(["up", "--quiet", "--json", "--for", "120s", "--socket"])
            .arg(sock)
            .arg(manifest)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// SIGTERM, then the `--json` summary `up` prints.
fn stop(mut child: Guard) -> serde_json::Value {
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let status = wait_exit(&mut child.0, 30).expect("up exits after SIGTERM");
    let mut out = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "up failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} {err}"))
}

fn stats(control: &Path) -> serde_json::Value {
    let o = bin()
        .args(["tcps", "stats", "--json", "--control"])
        .arg(control)
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or_default()
}

/// One HTTP/1.1 request on a fresh connection: (status code, body).
fn fetch(addr: &str, request: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&all)));
    let head = String::from_utf8_lossy(&all[..end]).into_owned();
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, all[end + 4..].to_vec())
}

#[test]
fn up_deploys_the_file_server_and_its_files_come_back_through_the_ppes() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let control = dir.path().join("tcps.sock");
    let www = repo().join("examples/tcps/www").canonicalize().unwrap();
    let m = manifest(
        "tcps.toml",
        dir.path(),
        &[
            ("127.0.0.1:8080", format!("127.0.0.1:{port}")),
            (
                "/run/sidecore/tcps-www.sock",
                control.to_str().unwrap().into(),
            ),
            ("root = \"examples/tcps/www\"", format!("root = {www:?}")),
        ],
    );
    let child = up(&m, &dir.path().join("d.sock"));
    let addr = format!("127.0.0.1:{port}");
    assert!(
        wait_for(|| TcpStream::connect(&addr).is_ok(), 60),
        "the master PPE listens on {addr}"
    );
    for name in ["index.html", "page32k.bin", "notes.txt"] {
        let want = std::fs::read(www.join(name)).unwrap();
        let (code, body) = fetch(
            &addr,
            &format!("GET /{name} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(code, 200, "{name}");
        assert_eq!(body, want, "{name} byte for byte");
    }
    let (code, body) = fetch(
        &addr,
        "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 200);
    assert_eq!(body, std::fs::read(www.join("index.html")).unwrap());
    let (code, _) = fetch(&addr, "GET /missing HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert_eq!(code, 404);
    let (code, _) = fetch(&addr, "BREW /pot HTTP/1.1\r\n\r\n");
    assert_eq!(code, 405);
    let (code, _) = fetch(&addr, "garbage\r\n\r\n");
    assert_eq!(code, 400);
    // The PPEs' own view, through the master's control socket.
    let s = stats(&control);
    assert_eq!(s["app"]["http_200"], 4, "{s}");
    assert_eq!(s["app"]["http_404"], 1, "{s}");
    assert_eq!(s["allowed_ppe"].as_array().map(Vec::len), Some(2), "{s}");
    assert_eq!(s["active_ppe"], serde_json::json!([s["master"]]), "{s}");
    let v = stop(child);
    let ppe = offcode(&v, "ppe");
    assert_eq!(
        ppe["pe"].as_str().map(|p| p.starts_with("core:")),
        Some(true)
    );
    // The seven requests, and the connection that found the port open.
    assert_eq!(ppe["metrics"]["accepted"], 8, "{v}");
    assert_eq!(offcode(&v, "ppe-2")["state"], "stopped", "{v}");
    assert_eq!(offcode(&v, "www")["pe"], "host");
    assert_eq!(offcode(&v, "www")["metrics"]["records"], 7, "{v}");
}

#[test]
fn a_manifest_with_a_bad_server_setting_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let m = manifest(
        "tcps.toml",
        dir.path(),
        &[("listen = \"127.0.0.1:8080\"", "listen = \"nowhere\"".into())],
    );
    let o = run(&["check", m.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}{err}");
    assert!(
        format!("{out}{err}").contains("`listen` = \"nowhere\""),
        "{out}{err}"
    );
}

/// Block stream clients: each reads 8 KB blocks, checks every byte against
/// the streamer's file (byte i of the stream is (i mod 16 MiB) % 251) and
/// acknowledges each block, until `stop`.
struct Clients {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Result<u64, String>>>,
}

const FILE_BYTES: u64 = 16 << 20;
const BLOCK: usize = 8192;

impl Clients {
    fn start(addr: &str, n: usize) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|i| {
                let (stop, addr) = (Arc::clone(&stop), addr.to_string());
                std::thread::spawn(move || stream_client(&addr, i, &stop))
            })
            .collect();
        Clients { stop, threads }
    }

    /// Stops them; each one's bytes, or what went wrong.
    fn finish(self) -> Vec<Result<u64, String>> {
        self.stop.store(true, Ordering::Release);
        self.threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("client panicked".into())))
            .collect()
    }
}

fn stream_client(addr: &str, i: usize, stop: &AtomicBool) -> Result<u64, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("client {i}: connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; BLOCK];
    let mut pos = 0u64;
    while !stop.load(Ordering::Acquire) {
        s.read_exact(&mut buf)
            .map_err(|e| format!("client {i}: after {pos} bytes: {e}"))?;
        for (k, b) in buf.iter().enumerate() {
            let want = (((pos + k as u64) % FILE_BYTES) % 251) as u8;
            if *b != want {
                return Err(format!(
                    "client {i}: byte {} is {b}, expected {want}",
                    pos + k as u64
                ));
            }
        }
        pos += BLOCK as u64;
        s.write_all(&[1])
            .map_err(|e| format!("client {i}: ack after {pos} bytes: {e}"))?;
    }
    Ok(pos)
}

#[test]
fn autoscale_grows_ppes_under_load_and_shrinks_when_idle_and_every_byte_arrives() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let control = dir.path().join("tcps.sock");
    // Shorter dwells than the example's, the same thresholds' shape.
    let m = manifest(
        "tcps-stream.toml",
        dir.path(),
        &[
            ("127.0.0.1:8081", format!("127.0.0.1:{port}")),
            (
                "/run/sidecore/tcps-stream.sock",
                control.to_str().unwrap().into(),
            ),
            (
                "interval_ms = 100, high = 0.75, low = 0.3, up_after = 3, down_after = 20, cooldown = 10",
                "interval_ms = 100, high = 0.5, low = 0.2, up_after = 3, down_after = 10, cooldown = 5"
                    .into(),
            ),
        ],
    );
    let child = up(&m, &dir.path().join("d.sock"));
    let addr = format!("127.0.0.1:{port}");
    assert!(wait_for(|| TcpStream::connect(&addr).is_ok(), 60));
    let s0 = stats(&control);
    let master = s0["master"].as_u64().unwrap();
    assert_eq!(s0["active_ppe"], serde_json::json!([master]), "{s0}");

    let clients = Clients::start(&addr, 48);
    let active = |s: &serde_json::Value| s["active_ppe"].as_array().map_or(0, Vec::len);
    let t0 = Instant::now();
    let grew = wait_for(|| active(&stats(&control)) == 2, 60);
    let grew_after = t0.elapsed();
    // Keep the load on for a while with both PPEs serving.
    std::thread::sleep(Duration::from_secs(2));
    let during = stats(&control);
    let results = clients.finish();
    eprintln!("grew after {grew_after:?}; during the load: {during}");
    let delivered = clients_bytes(&results);
    assert!(
        grew,
        "ActivePPE never grew in {grew_after:?} under 48 streams: {during}"
    );
    let helper = during["ppes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["cpu"].as_u64() != Some(master))
        .cloned()
        .unwrap();
    assert!(
        helper["adopted"].as_u64().unwrap() > 0 && helper["bytes_out"].as_u64().unwrap() > 0,
        "the helper PPE took connections over and served them: {during}"
    );
    assert!(delivered > 0);

    // Idle now: back to the master alone.
    assert!(
        wait_for(|| active(&stats(&control)) == 1, 60),
        "ActivePPE never shrank: {}",
        stats(&control)
    );
    let v = stop(child);
    let a = offcode(&v, "autoscale");
    assert!(a["metrics"]["added"].as_u64().unwrap() >= 1, "{v}");
    assert!(a["metrics"]["removed"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(a["metrics"]["refused"], 0, "{v}");
    assert_eq!(offcode(&v, "ppe")["metrics"]["conns"], 0, "{v}");
}

/// Every client ran to the end with every byte right: their total.
fn clients_bytes(results: &[Result<u64, String>]) -> u64 {
    let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(errors.is_empty(), "connections failed: {errors:?}");
    results.iter().map(|r| r.as_ref().map_or(0, |b| *b)).sum()
}
