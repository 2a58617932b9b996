//! Does watching slow the data path? The daemon runs examples/checksum.toml
//! (a record source and a checksum offcode on two dedicated cores) while 0 or
//! 10 dashboards follow its live event stream, each also fetching /api/status
//! and /metrics once a second as a page and a scraper would. Rounds alternate
//! A (none) and B (ten), and each pair gives the ratio of records per second.
//!
//! `cargo bench -p sidecore --bench dashboards [-- PAIRS SECONDS]`

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const DASHBOARDS: usize = 10;

fn sidecore() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sidecore"))
}

fn get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Records the checksum offcode has processed, from the daemon's picture.
fn records(addr: SocketAddr) -> u64 {
    let body = get(addr, "/api/status");
    let json = body.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    v["apps"][0]["offcodes"]
        .as_array()
        .and_then(|a| a.iter().find(|o| o["name"] == "checksum"))
        .and_then(|o| o["metrics"]["records"].as_u64())
        .unwrap_or(0)
}

/// One dashboard: follows the stream, fetches status and metrics each second.
fn dashboard(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut got = 0u64;
        let Ok(mut s) = TcpStream::connect(addr) else {
            return 0;
        };
        let _ = s.write_all(b"GET /api/events HTTP/1.1\r\nHost: x\r\n\r\n");
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
        let mut buf = [0u8; 65536];
        let mut last = Instant::now();
        while !stop.load(Ordering::Acquire) {
            if let Ok(n) = s.read(&mut buf) {
                got += n as u64;
            }
            if last.elapsed() >= Duration::from_secs(1) {
                got += get(addr, "/api/status").len() as u64;
                got += get(addr, "/metrics").len() as u64;
                last = Instant::now();
            }
        }
        got
    })
}

fn round(addr: SocketAddr, socket: &str, manifest: &str, dashboards: usize, secs: f64) -> f64 {
    let up = sidecore()
        .args(["up", "-d", manifest, "--socket", socket])
        .output()
        .expect("sidecore up");
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let stop = Arc::new(AtomicBool::new(false));
    let watchers: Vec<_> = (0..dashboards)
        .map(|_| dashboard(addr, Arc::clone(&stop)))
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let (r0, t0) = (records(addr), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (r1, t1) = (records(addr), Instant::now());
    stop.store(true, Ordering::Release);
    let bytes: u64 = watchers.into_iter().map(|w| w.join().unwrap_or(0)).sum();
    assert!(
        dashboards == 0 || bytes > 0,
        "the dashboards received nothing"
    );
    let _ = sidecore().args(["down", "--socket", socket]).output();
    (r1 - r0) as f64 / (t1 - t0).as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let pairs: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(4);
    let secs: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let socket = dir.path().join("d.sock");
    let socket = socket.to_str().expect("a UTF-8 path");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("an address");
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let manifest = format!("{root}/../../examples/checksum.toml");
    let mut daemon: Child = sidecore()
        .args(["daemon", "--socket", socket, "--http", &addr.to_string()])
        .stderr(Stdio::null())
        .spawn()
        .expect("sidecore daemon");
    let t0 = Instant::now();
    while TcpStream::connect(addr).is_err() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("pair  none (records/s)  {DASHBOARDS} dashboards (records/s)  ratio");
    let mut ratios = Vec::new();
    let (mut none, mut ten) = (Vec::new(), Vec::new());
    let bar = sidecore_plot::progress::Progress::bar(2 * pairs as u64, "pair 0: no dashboard");
    for p in 0..pairs {
        let a = round(addr, socket, &manifest, 0, secs);
        bar.step(format!("pair {p}: {DASHBOARDS} dashboards"));
        let b = round(addr, socket, &manifest, DASHBOARDS, secs);
        bar.step(format!("pair {}: no dashboard", p + 1));
        ratios.push(b / a);
        none.push(a / 1e6);
        ten.push(b / 1e6);
        bar.suspend(|| println!("{p:>4}  {a:>16.0}  {b:>26.0}  {:.3}", b / a));
    }
    drop(bar);
    let svg = sidecore_plot::out_dir().join("dashboards.svg");
    let groups: Vec<String> = (0..pairs).map(|p| format!("pair {p}")).collect();
    match sidecore_plot::grouped_bars(
        &svg,
        "checksum records/s with 0 and 10 dashboards",
        "M records/s",
        &groups,
        &[
            sidecore_plot::Series::new("no dashboard", none),
            sidecore_plot::Series::new(format!("{DASHBOARDS} dashboards"), ten),
        ],
    ) {
        Ok(()) => println!("plot: {}", svg.display()),
        Err(e) => eprintln!("plot not written: {e}"),
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median ratio {:.3} (min {:.3}, max {:.3}); target ≥ 0.98",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
    let _ = sidecore()
        .args(["down", "--daemon", "--socket", socket])
        .output();
    let _ = daemon.wait();
}
