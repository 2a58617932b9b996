//! TCPServers benchmarks (issue 14): sidecore-tcps against a conventional
//! tokio multi-thread server, side by side in one run, on loopback.
//!
//! `cargo bench -p sidecore-tcps --bench servers -- stream` (TS-1, TS-3): the
//! server sends 8 KB blocks from an in-memory file and the client
//! acknowledges each (one byte), with 1, 4, 16, 64 and 256 connections.
//! `... -- churn` (TS-7): 8 long streams plus a growing rate of
//! connect-and-close clients; the long streams' throughput retained.
//! `... -- http` (TS-8): an open-loop load generator (wrk2-style: a fixed
//! set of keep-alive connections, each on a constant-rate schedule, latency
//! taken from the intended send time) asks for a static 32 KB page at rates
//! stepping past saturation; replies/s and p99 latency per offered rate, the
//! knee, and the throughput at twice the knee. sidecore-tcps runs what
//! `sidecore tcps serve --root DIR` runs (the file server of `apps`, the
//! page loaded from a directory, 1 PPE + 1 application thread); tokio runs
//! an equivalent keep-alive HTTP/1.1 server on 2 workers.
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

#[path = "servers/nginx.rs"]
mod nginx;

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
    /// Debian's nginx, 2 workers; the stream as one Range request per block.
    Nginx,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tokio => "tokio",
            Kind::Tcps => "tcps",
            Kind::TcpsSpin => "tcps-spin",
            Kind::Nginx => "nginx",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Tokio => "tokio",
            Kind::Tcps => "sidecore-tcps",
            Kind::TcpsSpin => "sidecore-tcps --spin",
            Kind::Nginx => "nginx (Range per block)",
        }
    }

    /// The client's protocol for this server's block stream.
    fn proto(self) -> Proto {
        if self == Kind::Nginx {
            Proto::HttpRange
        } else {
            Proto::Ack
        }
    }
}

/// How a stream client asks for the next block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Proto {
    /// One acknowledgement byte per block (the seed's protocol).
    Ack,
    /// One keep-alive `GET` with `Range: bytes=OFF-END` per block: nginx
    /// cannot speak the acknowledge-each-block protocol, so the request is
    /// the acknowledgement (80 bytes instead of 1, and a ~250-byte 206
    /// head with each 8 KB block).
    HttpRange,
}

/// The servers of the stream benchmark (`TCPS_KINDS=tokio,nginx` to pick).
fn kinds_asked(all: &[Kind]) -> Vec<Kind> {
    let Ok(v) = std::env::var("TCPS_KINDS") else {
        return all.to_vec();
    };
    all.iter()
        .copied()
        .filter(|k| v.split(',').any(|n| n.trim() == k.name()))
        .collect()
}

/// Connection counts of the stream benchmark (`TCPS_CONNS=64,256` to pick).
fn conns_asked() -> Vec<usize> {
    std::env::var("TCPS_CONNS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| CONNS.to_vec())
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
            if std::env::var("TCPS_BACKEND").as_deref() == Ok("epoll") {
                cfg.backend = sidecore_tcps::Backend::Epoll;
            }
            if let Some(n) = std::env::var("TCPS_SPIN_POLLS")
                .ok()
                .and_then(|v| v.parse().ok())
            {
                cfg.spin_polls = n;
            }
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
        "tcps-http" => http_child_tcps(addr),
        "tokio-http" => http_child_tokio(addr),
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

/// A server process: a child of this bench (it exits when its stdin
/// closes) or nginx (stopped with SIGTERM).
enum Proc {
    Child(Child),
    Nginx(nginx::Nginx),
}

struct Server {
    proc: Proc,
    addr: SocketAddr,
}

impl Server {
    fn start(kind: Kind) -> Result<Server, String> {
        if kind == Kind::Nginx {
            let f = file();
            return Server::nginx(&[("stream.bin", &f)]);
        }
        Ok(Server::start_named(kind.name()))
    }

    fn nginx(files: &[(&str, &[u8])]) -> Result<Server, String> {
        let n = nginx::Nginx::start(files, 2)?;
        Ok(Server {
            addr: n.addr,
            proc: Proc::Nginx(n),
        })
    }

    fn start_named(name: &str) -> Server {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .env("TCPS_BENCH_CHILD", name)
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
            proc: Proc::Child(child),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// The server's processes.
    fn pids(&self) -> Vec<u32> {
        match &self.proc {
            Proc::Child(c) => vec![c.id()],
            Proc::Nginx(n) => n.pids(),
        }
    }

    /// On-CPU nanoseconds of every thread of the server's processes, split
    /// into PPE threads (`tcps-ppe*`) and the rest.
    fn cpu_ns(&self) -> (u64, u64) {
        self.pids()
            .into_iter()
            .map(thread_cpu_ns)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Proc::Child(c) = &mut self.proc {
            drop(c.stdin.take());
            let _ = c.wait();
        }
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

    fn start(pids: &[u32], window: Duration) -> Perf {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let c = Command::new("perf")
            .args(["stat", "-x", ",", "-e", Self::EVENTS, "-p", &pids.join(",")])
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
    fn start(addr: SocketAddr, n: usize, churn_per_s: u64, proto: Proto) -> Load {
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
                        let r = match proto {
                            Proto::Ack => stream_client(addr, i, b, c).await,
                            Proto::HttpRange => range_client(addr, i, b, c).await,
                        };
                        if r.is_err() {
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

/// The block stream over HTTP: one keep-alive `GET` with a `Range` of the
/// next 8 KB per block, the next only after the whole block arrived.
async fn range_client(
    addr: SocketAddr,
    i: usize,
    bytes: Arc<Vec<AtomicU64>>,
    connected: Arc<AtomicU64>,
) -> std::io::Result<()> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    connected.fetch_add(1, Ordering::AcqRel);
    let mut buf = vec![0u8; 4 * BLOCK];
    let mut offset = 0usize;
    loop {
        if offset + BLOCK > FILE_BYTES {
            offset = 0;
        }
        let req = format!(
            "GET /stream.bin HTTP/1.1\r\nHost: bench\r\nRange: bytes={}-{}\r\n\r\n",
            offset,
            offset + BLOCK - 1
        );
        s.write_all(req.as_bytes()).await?;
        let mut have = 0usize;
        let (head, len) = loop {
            let n = s.read(&mut buf[have..]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            have += n;
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut resp = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(h) = resp
                .parse(&buf[..have])
                .map_err(|e| std::io::Error::other(e.to_string()))?
            {
                if resp.code != Some(206) {
                    return Err(std::io::Error::other(format!("status {:?}", resp.code)));
                }
                let len = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                    .unwrap_or(0usize);
                break (h, len);
            }
        };
        if len != BLOCK {
            return Err(std::io::Error::other(format!("a {len}-byte range")));
        }
        while have < head + len {
            let n = s.read(&mut buf[have..head + len]).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            have += n;
        }
        bytes[i].fetch_add(BLOCK as u64, Ordering::Relaxed);
        offset += BLOCK;
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

fn measure(kind: Kind, n: usize, churn_per_s: u64) -> Result<Sample, String> {
    let server = Server::start(kind)?;
    let load = Load::start(server.addr, n, churn_per_s, kind.proto());
    load.wait_connected(n);
    std::thread::sleep(WARM);
    let perf = Perf::start(&server.pids(), MEASURE);
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
    Ok(Sample {
        bytes_per_s: total as f64 / dt,
        cpus: ((p1 - p0) + (r1 - r0)) as f64 / 1e9 / dt,
        ppe_cpus: (p1 - p0) as f64 / 1e9 / dt,
        client_cpus: (c1 - c0) as f64 / 1e9 / dt,
        min_share: if mean > 0.0 { min / mean } else { 0.0 },
        perf,
        short_per_s: (s1 - s0) as f64 / dt,
        lost,
    })
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
        "sidecore-tcps: 1 PPE (CPU {}, io_uring, adaptive parking) + 1 app thread; tokio: multi-thread, 2 workers; nginx: 2 workers, one Range request per block (the request is the acknowledgement); client: 1 tokio current-thread",
        sidecore_tcps::usable_cpus().last().copied().unwrap_or(0)
    );
    println!();
    println!(
        "| conns | server | MB/s | server CPUs (PPE) | client CPU | µs CPU/MB | MB/s per CPU | slowest conn/mean | lost | ctx-sw/MB, migr/MB | per-CPU ratio vs tokio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let kinds = kinds_asked(&[Kind::Tokio, Kind::Tcps, Kind::TcpsSpin, Kind::Nginx]);
    let mut verdict = Vec::new();
    for n in conns_asked() {
        let mut tokio: Option<Sample> = None;
        for &kind in &kinds {
            let s = match measure(kind, n, 0) {
                Ok(s) => s,
                Err(e) => {
                    println!("| {n} | {} | not run: {e} |||||||||", kind.label());
                    continue;
                }
            };
            stream_row(n, kind, &s, tokio.as_ref());
            if let Some(t) = &tokio
                && n == 256
                && matches!(kind, Kind::Tcps | Kind::TcpsSpin)
            {
                verdict.push((kind, s.per_cpu() / t.per_cpu()));
            }
            if kind == Kind::Tokio {
                tokio = Some(s);
            }
        }
    }
    if !verdict.is_empty() {
        println!();
    }
    for (kind, r) in verdict {
        println!(
            "target: >= 1.75x tokio's throughput per CPU at 256 connections: {} {r:.2}x, {}",
            kind.label(),
            if r >= 1.75 { "MET" } else { "NOT MET" }
        );
    }
}

fn stream_row(n: usize, kind: Kind, s: &Sample, tokio: Option<&Sample>) {
    let m = mb(s.bytes_per_s) * MEASURE.as_secs_f64();
    let ppe = match kind {
        Kind::Tcps | Kind::TcpsSpin => format!("{:.2}", s.ppe_cpus),
        _ => "-".to_string(),
    };
    let ratio = match tokio {
        Some(t) if kind != Kind::Tokio => format!(
            "**{:.2}x** (throughput {:.2}x)",
            s.per_cpu() / t.per_cpu(),
            s.bytes_per_s / t.bytes_per_s
        ),
        _ => String::new(),
    };
    println!(
        "| {n} | {} | {:.0} | {:.2} ({ppe}) | {:.2} | {:.0} | {:.0} | {:.2} | {} | {} | {ratio} |",
        kind.label(),
        mb(s.bytes_per_s),
        s.cpus,
        s.client_cpus,
        s.cpus * 1e6 / mb(s.bytes_per_s).max(1e-9),
        mb(s.per_cpu()),
        s.min_share,
        s.lost,
        perf_cell(s, m),
    );
    std::io::stdout().flush().ok();
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
            let s = match measure(kind, 8, rate) {
                Ok(s) => s,
                Err(e) => panic!("{}: {e}", kind.label()),
            };
            if rate == 0 {
                base[k] = s.bytes_per_s;
            }
            let kept = s.bytes_per_s / base[k];
            worst[k] = worst[k].min(kept);
            println!(
                "| {rate} | {} | {:.0} | {:.0} | {:.0}% | {} | {:.2} | {:.0} |",
                kind.label(),
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
            "http" => http_bench(),
            other => {
                eprintln!("unknown benchmark {other}: stream | churn [RATE/s ...] | http");
                std::process::exit(2);
            }
        }
        println!();
    }
}

// ---------------------------------------------------------------- TS-8

/// The static page of TS-8.
const PAGE_BYTES: usize = 32 * 1024;
const PAGE_PATH: &str = "/page.html";
/// Offered request rates (requests/s), stepping past saturation.
const HTTP_RATES: [u64; 11] = [
    4000, 8000, 16000, 24000, 32000, 40000, 48000, 64000, 80000, 112000, 144000,
];
/// Keep-alive connections of the load generator (`TCPS_HTTP_CONNS` overrides).
fn http_conns() -> usize {
    std::env::var("TCPS_HTTP_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(64)
}
const HTTP_WARM: Duration = Duration::from_millis(500);
const HTTP_MEASURE: Duration = Duration::from_secs(2);
/// How long requests still outstanding at the end of a step may take.
const HTTP_GRACE: Duration = Duration::from_secs(1);

fn page() -> Vec<u8> {
    (0..PAGE_BYTES).map(|i| b'a' + (i % 26) as u8).collect()
}

/// What `sidecore tcps serve --root DIR` runs: the master PPE on the last
/// CPU, one file-server application thread on another, the directory's
/// files loaded into memory.
fn http_child_tcps(addr: SocketAddr) {
    let dir = std::env::temp_dir().join(format!("tcps-ts8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("page directory");
    std::fs::write(dir.join(&PAGE_PATH[1..]), page()).expect("page");
    let cpus = sidecore_tcps::usable_cpus();
    let ppe = *cpus.last().expect("a CPU");
    let app_cpu = cpus.iter().copied().find(|&c| c != ppe);
    let cfg = sidecore_tcps::Config::new(addr, sidecore_tcps::CoreSet::of(&[ppe]).expect("cpu"));
    let server = sidecore_tcps::TcpServers::start(cfg).expect("start sidecore-tcps");
    let site = sidecore_tcps::apps::Site::load(&server, &dir).expect("load the site");
    let _ = std::fs::remove_dir_all(&dir);
    let app = server.app();
    let counters = server.counters();
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::Builder::new()
        .name("tcps-app".into())
        .spawn(move || {
            if let Some(c) = app_cpu {
                let _ = sidecore_tcps::ppe::pin_to(c);
            }
            sidecore_tcps::apps::serve_http(
                &app,
                &site,
                sidecore_tcps::apps::HttpLimits::default(),
                &counters,
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

/// The conventional server: tokio multi-thread on 2 workers, keep-alive
/// HTTP/1.1, the same page with the same response head.
fn http_child_tokio(addr: SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let body = page();
    let mut ok = sidecore_tcps::http::head(200, "OK", body.len(), true, "text/html").into_bytes();
    ok.extend_from_slice(&body);
    let ok: Arc<[u8]> = ok.into();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .expect("bind");
    println!("port {}", listener.local_addr().expect("addr").port());
    rt.spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(tokio_http_conn(s, Arc::clone(&ok)));
        }
    });
    wait_stdin_eof();
    std::process::exit(0);
}

async fn tokio_http_conn(mut s: tokio::net::TcpStream, ok: Arc<[u8]>) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let (head_len, path_ok, keep_alive) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let close = req.headers.iter().any(|h| {
                        h.name.eq_ignore_ascii_case("connection")
                            && h.value.eq_ignore_ascii_case(b"close")
                    });
                    break (
                        n,
                        req.path == Some(PAGE_PATH),
                        req.version == Some(1) && !close,
                    );
                }
                Ok(httparse::Status::Partial) if buf.len() <= 8192 => {
                    let n = s.read(&mut chunk).await?;
                    if n == 0 {
                        return Ok(());
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                _ => return Ok(()),
            }
        };
        buf.drain(..head_len);
        if path_ok {
            s.write_all(&ok).await?;
        } else {
            let body = b"404 Not Found\n";
            let mut h =
                sidecore_tcps::http::head(404, "Not Found", body.len(), keep_alive, "text/plain")
                    .into_bytes();
            h.extend_from_slice(body);
            s.write_all(&h).await?;
        }
        if !keep_alive {
            return Ok(());
        }
    }
}

/// One step of the load generator: what happened to the requests whose
/// intended send time fell in the measured window.
struct HttpStep {
    offered: u64,
    /// Replies completed within the measured window, per second.
    replies_per_s: f64,
    /// p99 latency from the intended send time; `None` when more than 1% of
    /// the window's requests never completed (p99 beyond the grace time).
    p99: Option<Duration>,
    p50: Option<Duration>,
    /// Requests of the window never answered by the end of the grace time.
    unanswered: u64,
    /// Connections that failed (refused, reset, bad reply).
    errors: u64,
    client_cpus: f64,
}

/// One connection's log: (intended send time, completion time) offsets
/// from the step's start, in ns; completion `u64::MAX` when unanswered.
type ConnLog = Vec<(u64, u64)>;

/// Runs one open-loop step at `rate` requests/s against `addr`.
fn http_step(addr: SocketAddr, rate: u64) -> HttpStep {
    let start = Instant::now() + Duration::from_millis(200);
    let stop_at = start + HTTP_WARM + HTTP_MEASURE;
    let deadline = stop_at + HTTP_GRACE;
    let conns = http_conns();
    let interval = Duration::from_nanos(1_000_000_000 * conns as u64 / rate.max(1));
    let errors = Arc::new(AtomicU64::new(0));
    let cpu0 = thread_self_cpu_ns();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let logs: Vec<ConnLog> = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..conns {
            // Spread the connections' schedules evenly over one interval.
            let offset = interval * c as u32 / conns as u32;
            let errors = Arc::clone(&errors);
            tasks.push(tokio::spawn(async move {
                let mut log = ConnLog::new();
                if let Err(_e) =
                    http_conn(addr, start + offset, interval, stop_at, deadline, &mut log).await
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                log
            }));
        }
        let mut logs = Vec::new();
        for t in tasks {
            logs.push(t.await.unwrap_or_default());
        }
        logs
    });
    let cpu1 = thread_self_cpu_ns();
    let elapsed = (deadline + Duration::from_millis(200)).saturating_duration_since(start);
    let (w0, w1) = (
        HTTP_WARM.as_nanos() as u64,
        (HTTP_WARM + HTTP_MEASURE).as_nanos() as u64,
    );
    let mut lat: Vec<u64> = Vec::new();
    let mut unanswered = 0u64;
    let mut done_in_window = 0u64;
    for log in &logs {
        for &(intended, done) in log {
            if done != u64::MAX && done >= w0 && done < w1 {
                done_in_window += 1;
            }
            if intended < w0 || intended >= w1 {
                continue;
            }
            if done == u64::MAX {
                unanswered += 1;
                lat.push(u64::MAX);
            } else {
                lat.push(done - intended);
            }
        }
    }
    lat.sort_unstable();
    let q = |p: f64| -> Option<Duration> {
        if lat.is_empty() {
            return None;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        (lat[i] != u64::MAX).then(|| Duration::from_nanos(lat[i]))
    };
    HttpStep {
        offered: rate,
        replies_per_s: done_in_window as f64 / HTTP_MEASURE.as_secs_f64(),
        p99: q(0.99),
        p50: q(0.50),
        unanswered,
        errors: errors.load(Ordering::Relaxed),
        client_cpus: (cpu1 - cpu0) as f64 / 1e9 / elapsed.as_secs_f64(),
    }
}

fn thread_self_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// One keep-alive connection on a constant-rate schedule from `first`:
/// request k is due at `first + k·interval`; it goes out when due or, if the
/// previous reply is late, as soon as that reply is in (no pipelining), and
/// its latency counts from when it was due. No request is due at or after
/// `stop_at`; replies after `deadline` are not waited for.
async fn http_conn(
    addr: SocketAddr,
    first: Instant,
    interval: Duration,
    stop_at: Instant,
    deadline: Instant,
    log: &mut ConnLog,
) -> std::io::Result<()> {
    let origin = stop_at - HTTP_WARM - HTTP_MEASURE;
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let req = format!("GET {PAGE_PATH} HTTP/1.1\r\nHost: bench\r\n\r\n");
    let mut buf = vec![0u8; 64 * 1024];
    let mut have = 0usize;
    let mut k = 0u32;
    loop {
        let due = first + interval * k;
        if due >= stop_at {
            return Ok(());
        }
        k += 1;
        tokio::time::sleep_until(due.into()).await;
        let intended = (due - origin).as_nanos() as u64;
        log.push((intended, u64::MAX));
        let reply = async {
            s.write_all(req.as_bytes()).await?;
            // Head, then Content-Length bytes of body.
            let (head_len, body_len) = loop {
                let mut headers = [httparse::EMPTY_HEADER; 16];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&buf[..have]) {
                    Ok(httparse::Status::Complete(n)) => {
                        if resp.code != Some(200) {
                            return Err(std::io::Error::other(format!("status {:?}", resp.code)));
                        }
                        let len = resp
                            .headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                            .and_then(|h| std::str::from_utf8(h.value).ok())
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .ok_or_else(|| std::io::Error::other("no Content-Length"))?;
                        break (n, len);
                    }
                    Ok(httparse::Status::Partial) => {
                        if have == buf.len() {
                            return Err(std::io::Error::other("reply head too long"));
                        }
                        let n = s.read(&mut buf[have..]).await?;
                        if n == 0 {
                            return Err(std::io::ErrorKind::UnexpectedEof.into());
                        }
                        have += n;
                    }
                    Err(e) => return Err(std::io::Error::other(e.to_string())),
                }
            };
            let total = head_len + body_len;
            let mut need = total.saturating_sub(have);
            if have > total {
                // Never with one request at a time, but keep any extra bytes.
                buf.copy_within(total..have, 0);
                have -= total;
            } else {
                have = 0;
            }
            while need > 0 {
                let n = s.read(&mut buf[..need.min(64 * 1024)]).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                need -= n;
            }
            Ok::<(), std::io::Error>(())
        };
        match tokio::time::timeout_at(deadline.into(), reply).await {
            Ok(Ok(())) => {
                let done = (Instant::now() - origin).as_nanos() as u64;
                if let Some(last) = log.last_mut() {
                    last.1 = done;
                }
            }
            Ok(Err(e)) => return Err(e),
            // Unanswered by the deadline: logged as such.
            Err(_) => return Ok(()),
        }
    }
}

fn fmt_lat(d: Option<Duration>) -> String {
    match d {
        Some(d) if d >= Duration::from_millis(10) => format!("{:.0} ms", d.as_secs_f64() * 1e3),
        Some(d) => format!("{:.2} ms", d.as_secs_f64() * 1e3),
        None => format!("> {:.1} s", HTTP_GRACE.as_secs_f64()),
    }
}

/// Runs the rate ladder against one server kind, then one step at twice its
/// knee; prints the rows and returns (peak, knee, replies/s at 2x knee).
fn http_server_run(name: &str, label: &str) -> (f64, Option<u64>, Option<f64>) {
    let server = if name == "nginx" {
        let p = page();
        match Server::nginx(&[(&PAGE_PATH[1..], &p)]) {
            Ok(s) => s,
            Err(e) => {
                println!("| - | {label} | not run: {e} |||||||");
                return (0.0, None, None);
            }
        }
    } else {
        Server::start_named(name)
    };
    let mut steps = Vec::new();
    for rate in HTTP_RATES {
        let st = http_step(server.addr, rate);
        http_row(label, &st);
        steps.push(st);
    }
    // The knee: the highest offered rate the server still keeps up with
    // (at least 90% of the offered replies/s) before the first step where it
    // does not; the first step's rate when it never kept up.
    let knee = steps
        .iter()
        .position(|s| s.replies_per_s < 0.9 * s.offered as f64)
        .map(|i| steps[i.saturating_sub(1)].offered);
    let mut at_2x = None;
    if let Some(k) = knee {
        let st = http_step(server.addr, 2 * k);
        http_row(&format!("{label} (2x knee)"), &st);
        at_2x = Some(st.replies_per_s);
        steps.push(st);
    }
    let peak = steps.iter().map(|s| s.replies_per_s).fold(0.0, f64::max);
    (peak, knee, at_2x)
}

fn http_row(label: &str, st: &HttpStep) {
    println!(
        "| {} | {label} | {:.0} | {:.0}% | {} | {} | {} | {} | {:.2} |",
        st.offered,
        st.replies_per_s,
        100.0 * st.replies_per_s / st.offered as f64,
        fmt_lat(st.p50),
        fmt_lat(st.p99),
        st.unanswered,
        st.errors,
        st.client_cpus
    );
    std::io::stdout().flush().ok();
}

fn http_bench() {
    println!(
        "## HTTP overload (TS-8): GET of a static {} KB page over {} keep-alive connections, open loop (constant rate per connection, latency from the intended send time); {:.1} s warm-up and {:.0} s measured per step, {:.0} s grace",
        PAGE_BYTES / 1024,
        http_conns(),
        HTTP_WARM.as_secs_f64(),
        HTTP_MEASURE.as_secs_f64(),
        HTTP_GRACE.as_secs_f64()
    );
    println!(
        "sidecore-tcps: what `sidecore tcps serve --root` runs, 1 PPE (CPU {}) + 1 file-server thread; tokio: multi-thread, 2 workers; nginx (Debian): 2 workers, sendfile; client: 1 tokio current-thread",
        sidecore_tcps::usable_cpus().last().copied().unwrap_or(0)
    );
    println!();
    println!(
        "| offered req/s | server | replies/s | of offered | p50 | p99 | unanswered | conn errors | client CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut verdicts = Vec::new();
    let servers = [
        ("tokio-http", "tokio"),
        ("tcps-http", "sidecore-tcps"),
        ("nginx", "nginx"),
    ];
    let wanted = std::env::var("TCPS_KINDS").ok();
    for (name, label) in servers {
        if wanted
            .as_deref()
            .is_some_and(|w| !w.split(',').any(|k| k.trim() == name))
        {
            continue;
        }
        verdicts.push((label, http_server_run(name, label)));
    }
    println!();
    for (label, (peak, knee, at_2x)) in verdicts {
        match (knee, at_2x) {
            (Some(k), Some(r)) => println!(
                "{label}: peak {peak:.0} replies/s, knee {k} req/s offered (the last rate kept up with), at 2x knee ({}) {r:.0} replies/s = {:.0}% of peak: target >= 90% {}",
                2 * k,
                100.0 * r / peak.max(1e-9),
                if r >= 0.9 * peak { "MET" } else { "NOT MET" }
            ),
            _ => println!(
                "{label}: peak {peak:.0} replies/s; no knee up to {} req/s offered (not saturated): target not tested",
                HTTP_RATES[HTTP_RATES.len() - 1]
            ),
        }
    }
}
