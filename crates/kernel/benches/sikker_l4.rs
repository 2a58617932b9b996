//! Benchmark of Sikker's L4 eBPF path: TCP over loopback with the L4
//! programs attached against the same without them, side by side in one run
//! (as root). The benchmark moves itself into a fresh cgroup v2 group (the
//! client service's), so every socket it makes is the client's; the server is
//! a thread of the same process, listening at the server service's address.
//!
//! Three variants, run in turn, repetition after repetition:
//! * `plain` — nothing attached;
//! * `L4 permit` — the programs attached, the pair permitted, no rate limit
//!   (the connect check once per connection; per request packet on egress,
//!   the destination, cgroup and permit lookups and the pair's counters; per
//!   response packet, one lookup: the client's ephemeral port is no
//!   service's address);
//! * `L4 permit+rate` — also a 100 Gbps limit with a 4 MiB bucket on the
//!   pair, far above what loopback carries, so every request also takes the
//!   token bucket's spin lock but none is dropped (and the connections are
//!   not paced: 100 Gbps is above what SO_MAX_PACING_RATE takes).
//!
//! Three measurements per variant, 64-byte messages:
//! * round trip: one request, one response, on one connection (TCP_NODELAY);
//! * pipelined request/response throughput: a writer thread sends requests,
//!   the server echoes what it reads, a reader thread takes the responses;
//! * connects: connect and close, one after another (to a second address of
//!   the server service, whose thread only accepts and closes).
//!
//! Run: `cargo bench -p sidecore-kernel --bench sikker_l4` (environment:
//! `L4_BENCH_ROUNDS`, default 20,000; `L4_BENCH_MSGS`, default 200,000;
//! `L4_BENCH_CONNECTS`, default 2,000; `L4_BENCH_REPS`, default 5;
//! `L4_BENCH_CPU`, default 1: every thread runs on that CPU). Medians over
//! the repetitions.
#![allow(clippy::unwrap_used)] // benchmark code: a failed unwrap is a failed run

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sidecore_kernel::sikker_l4::{cgroup_id, cgroup2_root};
use sidecore_kernel::{L4Peer, L4Rate, L4Source, L4Tables, SikkerL4};

const MSG: usize = 64;
const CLIENT: u32 = 1;
const SERVER: u32 = 2;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Plain,
    Permit,
    PermitRate,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Permit => "L4 permit",
            Variant::PermitRate => "L4 permit+rate",
        }
    }
}

/// One repetition's figures.
#[derive(Clone, Copy, Default, Debug)]
struct Figures {
    rtt_p50_us: f64,
    rtt_p99_us: f64,
    msgs_per_sec: f64,
    connects_per_sec: f64,
}

/// Echoes every connection's bytes back until the peer closes.
fn serve(l: TcpListener) {
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                s.set_nodelay(true).unwrap();
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn round_trips(to: SocketAddr, rounds: u64) -> (f64, f64) {
    let mut s = TcpStream::connect(to).unwrap();
    s.set_nodelay(true).unwrap();
    let req = [0x5au8; MSG];
    let mut resp = [0u8; MSG];
    for _ in 0..1000 {
        s.write_all(&req).unwrap();
        s.read_exact(&mut resp).unwrap();
    }
    let mut t = Vec::with_capacity(usize::try_from(rounds).unwrap());
    for _ in 0..rounds {
        let t0 = Instant::now();
        s.write_all(&req).unwrap();
        s.read_exact(&mut resp).unwrap();
        t.push(t0.elapsed());
    }
    t.sort_unstable();
    (percentile(&t, 0.5), percentile(&t, 0.99))
}

fn pipelined(to: SocketAddr, msgs: u64) -> f64 {
    let s = TcpStream::connect(to).unwrap();
    s.set_nodelay(true).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = s;
    let t0 = Instant::now();
    let writer = std::thread::spawn(move || {
        let req = [0x5au8; MSG];
        for _ in 0..msgs {
            w.write_all(&req).unwrap();
        }
        w
    });
    let mut left = msgs * MSG as u64;
    let mut buf = [0u8; 64 * 1024];
    while left > 0 {
        let n = r.read(&mut buf).unwrap();
        assert!(n > 0, "the server closed early");
        left -= n as u64;
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(writer.join().unwrap());
    msgs as f64 / secs
}

fn connects(to: SocketAddr, n: u64) -> f64 {
    let t0 = Instant::now();
    for _ in 0..n {
        drop(TcpStream::connect(to).unwrap());
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

/// Accepts and closes connections at once, with a deep accept queue: a
/// connect loop outruns an accept thread on two cores, and an overflowing
/// queue drops SYNs (a one-second retransmission each).
fn sink(l: TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: listen(2) on a socket this function owns, already listening;
    // a second listen only changes the queue's length.
    let r = unsafe { libc::listen(l.as_raw_fd(), 4096) };
    assert_eq!(r, 0, "listen: {}", std::io::Error::last_os_error());
    std::thread::spawn(move || {
        for s in l.incoming() {
            drop(s);
        }
    });
}

fn measure(echo: SocketAddr, sink: SocketAddr) -> Figures {
    let (rtt_p50_us, rtt_p99_us) = round_trips(echo, env("L4_BENCH_ROUNDS", 20_000));
    Figures {
        rtt_p50_us,
        rtt_p99_us,
        msgs_per_sec: pipelined(echo, env("L4_BENCH_MSGS", 200_000)),
        connects_per_sec: connects(sink, env("L4_BENCH_CONNECTS", 2_000)),
    }
}

/// Pins this thread, and every thread it starts later, to CPU `cpu`.
fn pin(cpu: usize) {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes bit `cpu` of `set`, which is in bounds for any
    // CPU number below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is this thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &raw const set) };
    assert_eq!(
        r,
        0,
        "pin to CPU {cpu}: {}",
        std::io::Error::last_os_error()
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// This process's cgroup v2 directory now.
fn own_cgroup(root: &Path) -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 line");
    root.join(rel.trim().trim_start_matches('/'))
}

fn tables(id: u64, servers: [SocketAddr; 2], rate: bool) -> L4Tables {
    let mut t = L4Tables::default();
    t.cgroups.insert(
        id,
        L4Source {
            service: CLIENT,
            process: 1,
            uid: None,
        },
    );
    for server in servers {
        t.destinations.insert(
            server,
            L4Peer {
                service: SERVER,
                process: 1,
            },
        );
        t.permits.insert((CLIENT, server));
    }
    if rate {
        // 100 Gbps with a 4 MiB bucket: loopback's bursts of 64 KiB packets
        // outrun a 25 kB bucket even at this rate; this one never empties,
        // and is too large to cap the connections' segments.
        t.rates.insert(
            (CLIENT, SERVER),
            L4Rate {
                bytes_per_sec: 12_500_000_000,
                bucket_bytes: 4 << 20,
            },
        );
    }
    t
}

fn main() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("sikker_l4 bench: needs root (BPF programs on a cgroup); skipped");
        return;
    }
    let root = cgroup2_root().expect("cgroup v2 is mounted");
    let home = own_cgroup(&root);
    let top = root.join(format!("sc-l4-bench-{}", std::process::id()));
    let client = top.join("client");
    std::fs::create_dir_all(&client).unwrap();
    std::fs::write(client.join("cgroup.procs"), std::process::id().to_string()).unwrap();
    let id = cgroup_id(&client).unwrap();
    // Everything on one CPU: a wake-up on another CPU of this VM costs tens
    // of microseconds, and whether the scheduler crosses CPUs or not
    // decided the round trip (4 or 67 µs) more than anything measured.
    pin(usize::try_from(env("L4_BENCH_CPU", 1)).unwrap());

    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let conn = TcpListener::bind("127.0.0.1:0").unwrap();
    let servers = [echo.local_addr().unwrap(), conn.local_addr().unwrap()];
    serve(echo);
    sink(conn);
    let mut l4 = SikkerL4::load().unwrap();
    let variants = [Variant::Plain, Variant::Permit, Variant::PermitRate];
    let mut runs: Vec<Vec<Figures>> = vec![Vec::new(); variants.len()];
    for rep in 0..env("L4_BENCH_REPS", 5) {
        for (i, &v) in variants.iter().enumerate() {
            if v == Variant::Plain {
                l4.detach(&top);
            } else {
                l4.install(&tables(id, servers, v == Variant::PermitRate))
                    .unwrap();
                l4.attach(&top).unwrap();
            }
            let f = measure(servers[0], servers[1]);
            eprintln!("rep {rep} {:>15}: {f:?}", v.name());
            runs[i].push(f);
        }
    }
    let c = l4.counters().unwrap();
    let pair = c.pair(Some(CLIENT), SERVER);
    l4.detach(&top);
    drop(l4);
    std::fs::write(home.join("cgroup.procs"), std::process::id().to_string()).unwrap();
    let _ = std::fs::remove_dir(&client);
    let _ = std::fs::remove_dir(&top);

    let med = |i: usize, f: fn(&Figures) -> f64| median(runs[i].iter().map(f).collect());
    let base = (
        med(0, |f| f.rtt_p50_us),
        med(0, |f| f.rtt_p99_us),
        med(0, |f| f.msgs_per_sec),
        med(0, |f| f.connects_per_sec),
    );
    println!(
        "| variant | round trip p50 | p99 | p50 ÷ plain | p99 ÷ plain | pipelined msg/s | ÷ plain | connects/s | ÷ plain |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, v) in variants.iter().enumerate() {
        let (p50, p99, mps, cps) = (
            med(i, |f| f.rtt_p50_us),
            med(i, |f| f.rtt_p99_us),
            med(i, |f| f.msgs_per_sec),
            med(i, |f| f.connects_per_sec),
        );
        println!(
            "| {} | {p50:.1} µs | {p99:.1} µs | {:.2}× | {:.2}× | {mps:.0} | {:.2}× | {cps:.0} | {:.2}× |",
            v.name(),
            p50 / base.0,
            p99 / base.1,
            mps / base.2,
            cps / base.3
        );
    }
    println!(
        "\nL4 counters, client → server: {} connects allowed, {} denied; {} packets passed ({} bytes), {} dropped",
        pair.connects_allowed,
        pair.connects_denied,
        pair.packets_passed,
        pair.bytes_passed,
        pair.packets_dropped
    );
}
