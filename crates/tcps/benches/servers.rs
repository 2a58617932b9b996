//! TCPServers benchmarks (issue 14): sidecore-tcps against a conventional
//! tokio multi-thread server, side by side in one run, on loopback.
//!
//! `cargo bench -p sidecore-tcps --bench servers -- stream` (TS-1, TS-3): the
//! server sends 8 KB blocks from an in-memory file and the client
//! acknowledges each (one byte), with 1, 4, 16, 64 and 256 connections.
//! `... -- churn` (TS-7): 8 long streams plus a growing rate of
//! connect-and-close clients; the long streams' throughput retained.
//!
//! Each server runs in a child process (this binary again, with
//! `TCPS_BENCH_CHILD` set) so that its CPU time is its own: the sum of its
//! threads' on-CPU time from `/proc/PID/task/*/schedstat`, kernel time in its
//! system calls included. sidecore-tcps runs 1 PPE (CPU 1, the master) and 1
//! application thread (CPU 0), once with the default adaptive parking and
//! once with `spin` (the PPE never parks); tokio runs 2 worker threads,
//! unpinned. The
//! client is one tokio current-thread runtime in this process, the same for
//! both servers. When `perf` is on the PATH, `perf stat` counts the server's
//! software events over the measured window.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BLOCK: usize = 8192;
const FILE_BYTES: usize = 16 << 20;
const CONNS: [usize; 5] = [1, 4, 16, 64, 256];
const WARM: Duration = Duration::from_millis(700);
const MEASURE: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Tokio,
    Tcps,
    /// sidecore-tcps with `spin`: the PPE never parks (a truly dedicated core).
    TcpsSpin,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tokio => "tokio",
            Kind::Tcps => "tcps",
            Kind::TcpsSpin => "tcps-spin",
        }
    }
}

fn file() -> Vec<u8> {
    (0..FILE_BYTES).map(|i| (i % 251) as u8).collect()
}

// ---------------------------------------------------------------- servers

/// The child: serve the block stream, print the port, exit when stdin closes.
fn child(kind: &str) {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("address");
    match kind {
        "tcps" | "tcps-spin" => {
            let cpus = sidecore_tcps::usable_cpus();
            let ppe = *cpus.last().expect("a CPU");
            let app_cpu = cpus.iter().copied().find(|&c| c != ppe);
            let mut cfg =
                sidecore_tcps::Config::new(addr, sidecore_tcps::CoreSet::of(&[ppe]).expect("cpu"));
            cfg.spin = kind == "tcps-spin";
            let server = sidecore_tcps::TcpServers::start(cfg).expect("start sidecore-tcps");
            let blob = server.register_blob(file().into());
            let app = server.app();
            let stop = Arc::new(AtomicBool::new(false));
            std::thread::Builder::new()
                .name("tcps-app".into())
                .spawn(move || {
                    if let Some(c) = app_cpu {
                        let _ = sidecore_tcps::ppe::pin_to(c);
                    }
                    sidecore_tcps::apps::serve_stream(
                        &app,
                        blob,
                        FILE_BYTES as u64,
                        BLOCK as u64,
                        &stop,
                    );
                })
                .expect("app thread");
            println!("port {}", server.local_addr().port());
            wait_stdin_eof();
            if std::env::var_os("TCPS_BENCH_STATS").is_some() {
                eprintln!(
                    "{}",
                    serde_json::to_string(&server.stats()).unwrap_or_default()
                );
            }
            std::process::exit(0);
        }
        "tokio" => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let file: Arc<[u8]> = file().into();
            let listener = rt
                .block_on(tokio::net::TcpListener::bind(addr))
                .expect("bind");
            println!("port {}", listener.local_addr().expect("addr").port());
            rt.spawn(async move {
                loop {
                    let Ok((s, _)) = listener.accept().await else {
                        continue;
                    };
                    let file = Arc::clone(&file);
                    tokio::spawn(tokio_stream_conn(s, file));
                }
            });
            wait_stdin_eof();
            std::process::exit(0);
        }
        other => panic!("unknown child kind {other}"),
    }
}

/// The conventional server's connection: a block on accept, one per
/// acknowledgement byte, round the file.
async fn tokio_stream_conn(mut s: tokio::net::TcpStream, file: Arc<[u8]>) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut offset = 0usize;
    let mut owed = 1usize;
    let mut ack = [0u8; 256];
    loop {
        while owed > 0 {
            if offset + BLOCK > file.len() {
                offset = 0;
            }
            s.write_all(&file[offset..offset + BLOCK]).await?;
            offset += BLOCK;
            owed -= 1;
        }
        let n = s.read(&mut ack).await?;
        if n == 0 {
            return Ok(());
        }
        owed += n;
    }
}

fn wait_stdin_eof() {
    let mut sink = [0u8; 64];
    let mut stdin = std::io::stdin();
    while let Ok(n) = stdin.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}

/// A server child process; it exits when dropped (its stdin closes).
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(kind: Kind) -> Server {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .env("TCPS_BENCH_CHILD", kind.name())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("server child");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("port line");
        let port: u16 = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("child said {line:?}"));
        Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// On-CPU nanoseconds of every thread of the child, split into PPE
    /// threads (`tcps-ppe*`) and the rest.
    fn cpu_ns(&self) -> (u64, u64) {
        thread_cpu_ns(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn thread_cpu_ns(pid: u32) -> (u64, u64) {
    let (mut ppe, mut rest) = (0, 0);
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    for t in dir.flatten() {
        let p = t.path();
        let ns: u64 = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if comm.starts_with("tcps-ppe") {
            ppe += ns;
        } else {
            rest += ns;
        }
    }
    (ppe, rest)
}

/// `perf stat` software events of `pid` over `secs`, if perf runs here.
struct Perf(Option<Child>);

impl Perf {
    const EVENTS: &'static str = "task-clock,context-switches,cpu-migrations,page-faults";

    fn start(pid: u32, window: Duration) -> Perf {
        let c = Command::new("perf")
            .args([
                "stat",
                "-x",
                ",",
                "-e",
                Self::EVENTS,
                "-p",
                &pid.to_string(),
            ])
            .args(["--", "sleep", &format!("{:.3}", window.as_secs_f64())])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .ok();
        Perf(c)
    }

    /// (context switches, cpu migrations) or None.
    fn finish(self) -> Option<(u64, u64)> {
        let out = self.0?.wait_with_output().ok()?;
        let text = String::from_utf8_lossy(&out.stderr);
        let get = |name: &str| -> Option<u64> {
            text.lines()
                .find(|l| l.contains(name))
                .and_then(|l| l.split(',').next())
                .and_then(|v| v.trim().parse().ok())
        };
        Some((get("context-switches")?, get("cpu-migrations")?))
    }
}

// ---------------------------------------------------------------- clients

/// Connections of the client, with their byte counts.
struct Load {
    stop: Arc<AtomicBool>,
    bytes: Arc<Vec<AtomicU64>>,
    connected: Arc<AtomicU64>,
    short_done: Arc<AtomicU64>,
    /// Long connections that ended with an error (reset, refused, EOF).
    lost: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
    tid: Arc<AtomicU64>,
}

impl Load {
    /// `n` streaming connections to `addr`, on one client thread.
    fn start(addr: SocketAddr, n: usize, churn_per_s: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let bytes: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let connected = Arc::new(AtomicU64::new(0));
        let short_done = Arc::new(AtomicU64::new(0));
        let tid = Arc::new(AtomicU64::new(0));
        let lost = Arc::new(AtomicU64::new(0));
        let l = Arc::clone(&lost);
        let (s, b, c, d, t) = (
            Arc::clone(&stop),
            Arc::clone(&bytes),
            Arc::clone(&connected),
            Arc::clone(&short_done),
            Arc::clone(&tid),
        );
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions and cannot fail.
            t.store(unsafe { libc::gettid() } as u64, Ordering::Release);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("client runtime");
            rt.block_on(async move {
                for i in 0..n {
                    let (b, c, l) = (Arc::clone(&b), Arc::clone(&c), Arc::clone(&l));
                    tokio::spawn(async move {
                        if stream_client(addr, i, b, c).await.is_err() {
                            l.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
                if churn_per_s > 0 {
                    tokio::spawn(churn(addr, churn_per_s, Arc::clone(&s), d));
                }
                while !s.load(Ordering::Acquire) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
        });
        Load {
            stop,
            bytes,
            connected,
            short_done,
            lost,
            thread: Some(thread),
            tid,
        }
    }

    fn wait_connected(&self, n: usize) {
        let t0 = Instant::now();
        while (self.connected.load(Ordering::Acquire) as usize) < n {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "only {} of {n} connections came up",
                self.connected.load(Ordering::Acquire)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn per_conn(&self) -> Vec<u64> {
        self.bytes
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    fn client_cpu_ns(&self) -> u64 {
        let tid = self.tid.load(Ordering::Acquire);
        std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn stream_client(
    addr: SocketAddr,
    i: usize,
    bytes: Arc<Vec<AtomicU64>>,
    connected: Arc<AtomicU64>,
) -> std::io::Result<()> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    connected.fetch_add(1, Ordering::AcqRel);
    let mut buf = vec![0u8; BLOCK];
    loop {
        s.read_exact(&mut buf).await?;
        bytes[i].fetch_add(BLOCK as u64, Ordering::Relaxed);
        s.write_all(&[1]).await?;
    }
}

/// Connect-and-close clients at `per_s`, paced in 1 ms ticks; each closes
/// as soon as it is connected.
async fn churn(addr: SocketAddr, per_s: u64, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    let t0 = Instant::now();
    let mut started = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    while !stop.load(Ordering::Acquire) {
        tick.tick().await;
        let due = (t0.elapsed().as_secs_f64() * per_s as f64) as u64;
        while started < due {
            started += 1;
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                if let Ok(s) = tokio::net::TcpStream::connect(addr).await {
                    drop(s);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    }
}

// ---------------------------------------------------------------- runs

struct Sample {
    bytes_per_s: f64,
    /// Server CPUs busy over the window (on-CPU seconds per second).
    cpus: f64,
    ppe_cpus: f64,
    client_cpus: f64,
    /// Slowest connection's bytes over the mean.
    min_share: f64,
    perf: Option<(u64, u64)>,
    short_per_s: f64,
    /// Long connections lost by the end of the window.
    lost: u64,
}

impl Sample {
    fn per_cpu(&self) -> f64 {
        self.bytes_per_s / self.cpus.max(1e-9)
    }
}

fn measure(kind: Kind, n: usize, churn_per_s: u64) -> Sample {
    let server = Server::start(kind);
    let load = Load::start(server.addr, n, churn_per_s);
    load.wait_connected(n);
    std::thread::sleep(WARM);
    let perf = Perf::start(server.child.id(), MEASURE);
    let t0 = Instant::now();
    let b0 = load.per_conn();
    let (p0, r0) = server.cpu_ns();
    let c0 = load.client_cpu_ns();
    let s0 = load.short_done.load(Ordering::Relaxed);
    std::thread::sleep(MEASURE);
    let b1 = load.per_conn();
    let (p1, r1) = server.cpu_ns();
    let c1 = load.client_cpu_ns();
    let s1 = load.short_done.load(Ordering::Relaxed);
    let dt = t0.elapsed().as_secs_f64();
    let lost = load.lost.load(Ordering::Relaxed);
    let perf = perf.finish();
    drop(load);
    drop(server);
    let per: Vec<u64> = b0.iter().zip(&b1).map(|(a, b)| b - a).collect();
    let total: u64 = per.iter().sum();
    let mean = total as f64 / n as f64;
    let min = per.iter().copied().min().unwrap_or(0) as f64;
    Sample {
        bytes_per_s: total as f64 / dt,
        cpus: ((p1 - p0) + (r1 - r0)) as f64 / 1e9 / dt,
        ppe_cpus: (p1 - p0) as f64 / 1e9 / dt,
        client_cpus: (c1 - c0) as f64 / 1e9 / dt,
        min_share: if mean > 0.0 { min / mean } else { 0.0 },
        perf,
        short_per_s: (s1 - s0) as f64 / dt,
        lost,
    }
}

fn mb(b: f64) -> f64 {
    b / 1e6
}

fn perf_cell(s: &Sample, mbytes: f64) -> String {
    match s.perf {
        Some((cs, mig)) => format!("{:.0}/{:.1}", cs as f64 / mbytes, mig as f64 / mbytes),
        None => "n/a".into(),
    }
}

fn stream() {
    println!(
        "## stream (TS-1, TS-3): {BLOCK}-byte blocks from a {} MiB in-memory file, one ack byte per block; {:.1} s warm-up, {:.0} s measured, loopback",
        FILE_BYTES >> 20,
        WARM.as_secs_f64(),
        MEASURE.as_secs_f64()
    );
    println!(
        "sidecore-tcps: 1 PPE (CPU {}, io_uring, adaptive parking) + 1 app thread; tokio: multi-thread, 2 workers; client: 1 tokio current-thread",
        sidecore_tcps::usable_cpus().last().copied().unwrap_or(0)
    );
    println!();
    println!(
        "| conns | server | MB/s | server CPUs (PPE) | client CPU | µs CPU/MB | MB/s per CPU | slowest conn/mean | lost | ctx-sw/MB, migr/MB | per-CPU ratio vs tokio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut verdict = None;
    for n in CONNS {
        let tokio = measure(Kind::Tokio, n, 0);
        let tcps = measure(Kind::Tcps, n, 0);
        let spin = measure(Kind::TcpsSpin, n, 0);
        let ratio = tcps.per_cpu() / tokio.per_cpu();
        let ratio_spin = spin.per_cpu() / tokio.per_cpu();
        for (name, s) in [
            ("tokio", &tokio),
            ("sidecore-tcps", &tcps),
            ("sidecore-tcps --spin", &spin),
        ] {
            let m = mb(s.bytes_per_s) * MEASURE.as_secs_f64();
            println!(
                "| {n} | {name} | {:.0} | {:.2} ({}) | {:.2} | {:.0} | {:.0} | {:.2} | {} | {} | {} |",
                mb(s.bytes_per_s),
                s.cpus,
                if name == "tokio" {
                    "-".to_string()
                } else {
                    format!("{:.2}", s.ppe_cpus)
                },
                s.client_cpus,
                s.cpus * 1e6 / mb(s.bytes_per_s).max(1e-9),
                mb(s.per_cpu()),
                s.min_share,
                s.lost,
                perf_cell(s, m),
                if name == "tokio" {
                    String::new()
                } else {
                    format!(
                        "**{:.2}x** (throughput {:.2}x)",
                        s.per_cpu() / tokio.per_cpu(),
                        s.bytes_per_s / tokio.bytes_per_s
                    )
                },
            );
        }
        std::io::stdout().flush().ok();
        if n == 256 {
            verdict = Some((ratio, ratio_spin));
        }
    }
    if let Some((r, rs)) = verdict {
        let met = |r: f64| if r >= 1.75 { "MET" } else { "NOT MET" };
        println!();
        println!(
            "target: >= 1.75x tokio's throughput per CPU at 256 connections: sidecore-tcps {r:.2}x, {}; with --spin {rs:.2}x, {}",
            met(r),
            met(rs)
        );
    }
}

fn churn_bench(rates: &[u64]) {
    println!(
        "## short-lived connections (TS-7): 8 long streams ({BLOCK}-byte blocks, acked) plus connect-and-close clients at a growing rate; {:.0} s measured",
        MEASURE.as_secs_f64()
    );
    println!();
    println!(
        "| short conns/s asked | server | short conns/s done | long MB/s | retained | long conns lost | server CPUs | MB/s per CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut base = [0f64; 2];
    let mut worst = [1f64; 2];
    for &rate in rates {
        for (k, kind) in [Kind::Tokio, Kind::Tcps].into_iter().enumerate() {
            let s = measure(kind, 8, rate);
            if rate == 0 {
                base[k] = s.bytes_per_s;
            }
            let kept = s.bytes_per_s / base[k];
            worst[k] = worst[k].min(kept);
            println!(
                "| {rate} | {} | {:.0} | {:.0} | {:.0}% | {} | {:.2} | {:.0} |",
                match kind {
                    Kind::Tokio => "tokio",
                    Kind::Tcps => "sidecore-tcps",
                    Kind::TcpsSpin => "sidecore-tcps --spin",
                },
                s.short_per_s,
                mb(s.bytes_per_s),
                kept * 100.0,
                s.lost,
                s.cpus,
                mb(s.per_cpu())
            );
            std::io::stdout().flush().ok();
        }
    }
    println!();
    println!(
        "target: long streams keep >= 90% where tokio's fall further: sidecore-tcps worst {:.0}% ({}), tokio worst {:.0}% ({})",
        worst[1] * 100.0,
        if worst[1] >= 0.9 { "MET" } else { "NOT MET" },
        worst[0] * 100.0,
        if worst[0] < worst[1] {
            "fell further"
        } else {
            "did not fall further"
        }
    );
}

fn main() {
    if let Ok(kind) = std::env::var("TCPS_BENCH_CHILD") {
        child(&kind);
        return;
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let which: Vec<&str> = if args.is_empty() {
        vec!["stream"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    let rates: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let rates = if rates.is_empty() {
        vec![0, 500, 1000, 2000, 4000]
    } else {
        rates
    };
    for w in which.into_iter().filter(|w| w.parse::<u64>().is_err()) {
        match w {
            "stream" => stream(),
            "churn" => churn_bench(&rates),
            other => {
                eprintln!("unknown benchmark {other}: stream | churn [RATE/s ...]");
                std::process::exit(2);
            }
        }
        println!();
    }
}
