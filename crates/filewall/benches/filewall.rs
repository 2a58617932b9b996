//! FileWall's §4.7 measurements, side by side in one run against one nfs-ganesha
//! (FSAL_VFS, loopback): NFS direct, a pass-through tunnel (FileWall's engine with
//! an empty chain) and FileWall with the file-handle security policy.
//!
//! ```sh
//! cargo bench -p sidecore-filewall --bench filewall            # everything
//! cargo bench -p sidecore-filewall --bench filewall -- latency # one part:
//!     latency | postmark | throughput | policies
//! FILEWALL_RATES=60000,70000 cargo bench -p sidecore-filewall --bench filewall -- throughput
//! ```
//!
//! - latency (Fig. 4.8, Eqs. 4.1–4.5): 1,000 timed calls per operation and
//!   system, in interleaved rounds; T_F = (L_FileWall − L_Tun)/2 and
//!   T_P = (L_Tun − L_NFS)/2 − (D_CF + D_FS − D_CS), the bracket being one
//!   loopback one-way delay (every hop is loopback here), measured in the same run
//!   by a TCP ping-pong;
//! - postmark (Fig. 4.11's workload): 5,000 files of 1–16 KB, 20,000
//!   transactions, 8 KB blocks;
//! - throughput (Fig. 4.14's shape): a metadata-heavy mix offered open-loop at
//!   rising rates on 4 connections, achieved rate and latency, to saturation;
//!   beside them two controls that copy bytes both ways and parse nothing —
//!   a relay in one `mio` thread (FileWall's shape: the hop's cost on one
//!   thread) and one with two blocking threads per connection (the hop on
//!   every CPU) — and FileWall as a
//!   dedicated core (`ProxyConfig::core`: pinned to CPU 1, busy-polling);
//! - policies (Fig. 4.12): GETATTR and WRITE latency with 0..20 synthetic
//!   extensions (20 keys of 50 B stored per request, looked up and deleted per
//!   reply).

#![allow(clippy::unwrap_used, clippy::too_many_lines)] // benchmark code: a failed unwrap is a failed run

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::ganesha::Ganesha;
use sidecore_filewall::handles::HandleKey;
use sidecore_filewall::loadgen::{
    NfsClient, Postmark, create, dirop, open_loop, postmark, read, readdirplus, time_calls, write,
};
use sidecore_filewall::mount;
use sidecore_filewall::nfs3::{self, Nfs3Call, NfsFh3, StableHow};
use sidecore_filewall::policy::parse_chain;
use sidecore_filewall::proxy::{Backend, Listen, Proxy, ProxyConfig};

const LOCAL: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// A system under test: where its NFS and MOUNT are, and its proxy if any.
struct System {
    name: &'static str,
    nfs: SocketAddr,
    mount: SocketAddr,
    _proxy: Option<Proxy>,
}

fn proxied(g: &Ganesha, name: &'static str, chain: &str, key: Option<HandleKey>) -> System {
    proxied_on(g, name, chain, key, None)
}

/// The control for one thread's hop: a bare relay in one `mio` event loop
/// (the shape of FileWall's engine: one thread, non-blocking sockets), which
/// copies bytes both ways and parses nothing. Its thread lives until the
/// bench ends.
fn one_thread_relay(to: SocketAddr) -> SocketAddr {
    use mio::net::{TcpListener as MioListener, TcpStream as MioStream};
    use mio::{Events, Interest, Poll, Token};
    let mut l = MioListener::bind(LOCAL).unwrap();
    let at = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut poll = Poll::new().unwrap();
        poll.registry()
            .register(&mut l, Token(0), Interest::READABLE)
            .unwrap();
        // Token 2k+1 and 2k+2 are a pair's client and server; each side keeps
        // the bytes its peer could not take yet.
        let mut socks: Vec<(MioStream, Vec<u8>)> = Vec::new();
        let mut events = Events::with_capacity(256);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if poll.poll(&mut events, None).is_err() {
                continue;
            }
            for e in &events {
                if e.token() == Token(0) {
                    while let Ok((c, _)) = l.accept() {
                        let Ok(srv) = std::net::TcpStream::connect(to) else {
                            continue;
                        };
                        srv.set_nonblocking(true).unwrap();
                        let mut srv = MioStream::from_std(srv);
                        let mut c = c;
                        let _ = c.set_nodelay(true);
                        let _ = srv.set_nodelay(true);
                        let k = socks.len();
                        let both = Interest::READABLE | Interest::WRITABLE;
                        poll.registry()
                            .register(&mut c, Token(k + 1), both)
                            .unwrap();
                        poll.registry()
                            .register(&mut srv, Token(k + 2), both)
                            .unwrap();
                        socks.push((c, Vec::new()));
                        socks.push((srv, Vec::new()));
                    }
                    continue;
                }
                let i = e.token().0 - 1;
                let j = i ^ 1;
                // Flush what waited for this side, then move what it sent.
                let (a, b) = if i < j {
                    let (x, y) = socks.split_at_mut(j);
                    (&mut x[i], &mut y[0])
                } else {
                    let (x, y) = socks.split_at_mut(i);
                    (&mut y[0], &mut x[j])
                };
                while !a.1.is_empty() {
                    match a.0.write(&a.1) {
                        Ok(n) if n > 0 => {
                            a.1.drain(..n);
                        }
                        _ => break,
                    }
                }
                loop {
                    match a.0.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut at = 0;
                            if b.1.is_empty() {
                                while at < n {
                                    match b.0.write(&buf[at..n]) {
                                        Ok(m) if m > 0 => at += m,
                                        _ => break,
                                    }
                                }
                            }
                            b.1.extend_from_slice(&buf[at..n]);
                        }
                    }
                }
            }
        }
    });
    at
}

/// The same-run control for the proxy's hop: a bare TCP relay that copies
/// bytes both ways (two blocking threads per connection, no parsing, no
/// XIDs), in front of `to`. Its threads live until the bench ends.
fn bare_relay(to: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind(LOCAL).unwrap();
    let at = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in l.incoming().flatten() {
            let Ok(server) = TcpStream::connect(to) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut c1, mut s1) = (client, server);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c1, &mut s1);
                let _ = s1.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    at
}

/// [`proxied`], its thread a dedicated core busy-polling on `core`.
fn proxied_on(
    g: &Ganesha,
    name: &'static str,
    chain: &str,
    key: Option<HandleKey>,
    core: Option<u32>,
) -> System {
    let mut c = ProxyConfig::with(
        vec![
            Listen::tcp(LOCAL).serving(&[nfs3::PROGRAM]),
            Listen::tcp(LOCAL).serving(&[mount::PROGRAM]),
        ],
        vec![Backend::nfs_mount(g.nfs_addr(), g.mount_addr())],
    );
    c.chain = parse_chain(chain, name).unwrap();
    c.key = key;
    c.core = core;
    let p = Proxy::start(c).unwrap();
    System {
        name,
        nfs: p.local_addrs()[0],
        mount: p.local_addrs()[1],
        _proxy: Some(p),
    }
}

fn key() -> HandleKey {
    HandleKey::new(b"filewall-bench-key-0123456789abcdef".to_vec()).unwrap()
}

/// Half the round trip of a 128-byte TCP ping-pong on loopback: the one-way delay
/// D of every hop here.
fn loopback_one_way() -> Duration {
    let l = TcpListener::bind(LOCAL).unwrap();
    let addr = l.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 128];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let mut b = [7u8; 128];
    let mut rtts = Vec::new();
    for i in 0..2100 {
        let t = Instant::now();
        c.write_all(&b).unwrap();
        c.read_exact(&mut b).unwrap();
        if i >= 100 {
            rtts.push(t.elapsed());
        }
    }
    drop(c);
    let _ = echo.join();
    let mean = rtts.iter().sum::<Duration>() / rtts.len() as u32;
    mean / 2
}

/// Handles a client of `s` needs: root, the 4 KB file, the 32-entry directory.
fn handles(s: &System, export: &str) -> (NfsClient, NfsFh3, NfsFh3, NfsFh3) {
    let root = NfsClient::connect(s.mount).unwrap().mnt(export).unwrap();
    let mut c = NfsClient::connect(s.nfs).unwrap();
    let file = c.lookup(&root, "file4k").unwrap();
    let dir = c.lookup(&root, "dir32").unwrap();
    (c, root, file, dir)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn mean(v: &[Duration]) -> Duration {
    v.iter().sum::<Duration>() / v.len().max(1) as u32
}

fn latency(g: &Ganesha, systems: &[System]) {
    let export = g.export.display().to_string();
    let d = loopback_one_way();
    let ops = [
        "GETATTR",
        "LOOKUP",
        "READ",
        "WRITE",
        "READDIRPLUS",
        "READ 8 KB",
        "WRITE 8 KB",
        "CREATE",
        "REMOVE",
    ];
    // [system][op] -> samples
    let mut samples = vec![vec![Vec::new(); ops.len()]; systems.len()];
    let mut clients: Vec<_> = systems.iter().map(|s| handles(s, &export)).collect();
    for round in 0..5 {
        for (si, (c, root, file, dir)) in clients.iter_mut().enumerate() {
            let calls = [
                Nfs3Call::Getattr(file.clone()),
                Nfs3Call::Lookup(dirop(root, "file4k")),
                read(file, 0, 4096),
                write(file, 0, vec![round as u8; 4096], StableHow::Unstable),
                readdirplus(dir),
                read(file, 0, 8192),
                write(file, 0, vec![round as u8; 8192], StableHow::Unstable),
            ];
            for (oi, call) in calls.iter().enumerate() {
                samples[si][oi].extend(time_calls(c, call, 20, 200).unwrap());
            }
            for i in 0..200 {
                let name = format!("c{round}-{si}-{i}");
                let t = Instant::now();
                c.nfs(create(root, &name)).unwrap();
                samples[si][7].push(t.elapsed());
                let t = Instant::now();
                c.nfs(Nfs3Call::Remove(dirop(root, &name))).unwrap();
                samples[si][8].push(t.elapsed());
            }
        }
    }
    println!("\n### Per-operation latency (µs, mean of 1,000; p50 in brackets)\n");
    println!(
        "loopback one-way delay D (TCP ping-pong / 2): {:.1} µs\n",
        us(d)
    );
    println!(
        "| op | NFS direct | tunnel | FileWall (handles) | tunnel / direct | FileWall / direct | T_P (µs) | T_F (µs) | T_P, T_F from p50 (µs) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (oi, op) in ops.iter().enumerate() {
        let m: Vec<f64> = (0..systems.len())
            .map(|si| us(mean(&samples[si][oi])))
            .collect();
        let p50: Vec<f64> = (0..systems.len())
            .map(|si| {
                let mut v = samples[si][oi].clone();
                v.sort();
                us(v[v.len() / 2])
            })
            .collect();
        let t_p = (m[1] - m[0]) / 2.0 - us(d);
        let t_f = (m[2] - m[1]) / 2.0;
        let (p_p, p_f) = ((p50[1] - p50[0]) / 2.0 - us(d), (p50[2] - p50[1]) / 2.0);
        println!(
            "| {op} | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.2} | {:.2} | {t_p:.1} | {t_f:.1} | {p_p:.1}, {p_f:.1} |",
            m[0],
            p50[0],
            m[1],
            p50[1],
            m[2],
            p50[2],
            m[1] / m[0],
            m[2] / m[0]
        );
    }
}

fn run_postmark(g: &Ganesha, systems: &[System]) {
    let export = g.export.display().to_string();
    println!("\n### Postmark (5,000 files of 1–16 KB, 20,000 transactions, 8 KB blocks)\n");
    println!(
        "| system | transactions/s | transactions phase (s) | whole run (s) | NFS calls | vs direct |"
    );
    println!("|---|---|---|---|---|---|");
    let mut base = None;
    let mut inside = Vec::new();
    for (i, s) in systems.iter().enumerate() {
        let (mut c, root, _, _) = handles(s, &export);
        let before = s._proxy.as_ref().map(Proxy::stats);
        let r = postmark(&mut c, &root, &format!("postmark-{i}"), Postmark::default()).unwrap();
        if let (Some(p), Some(b)) = (&s._proxy, before) {
            // Time from a call reaching the proxy to its reply leaving it (the
            // server's time included), against what the client saw per call.
            let after = p.stats();
            let (mut n, mut ns) = (0u64, 0u64);
            for (op, h) in &after.latency {
                let prev = b.latency.get(op).map_or((0, 0), |x| (x.count, x.sum_ns));
                n += h.count - prev.0;
                ns += h.sum_ns - prev.1;
            }
            inside.push((
                s.name,
                ns as f64 / n.max(1) as f64 / 1e3,
                r.total_secs * 1e6 / r.calls as f64,
            ));
        } else {
            inside.push((s.name, f64::NAN, r.total_secs * 1e6 / r.calls as f64));
        }
        let b = *base.get_or_insert(r.tps());
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {} | {:.3} |",
            s.name,
            r.tps(),
            r.transactions_secs,
            r.total_secs,
            r.calls,
            r.tps() / b
        );
    }
    println!(
        "\n| system | client-seen µs per call | inside the proxy (call in → reply out, server included) µs |"
    );
    println!("|---|---|---|");
    for (name, inside, seen) in inside {
        println!("| {name} | {seen:.1} | {inside:.1} |");
    }
}

fn throughput(g: &Ganesha, standing: &[System], cored: &dyn Fn() -> System) {
    let export = g.export.display().to_string();
    // `FILEWALL_RATES=60000,70000` runs only those points.
    let rates: Vec<f64> = std::env::var("FILEWALL_RATES").map_or_else(
        |_| {
            vec![
                2_000.0, 5_000.0, 10_000.0, 15_000.0, 20_000.0, 30_000.0, 40_000.0, 50_000.0,
                60_000.0, 70_000.0, 80_000.0,
            ]
        },
        |v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect(),
    );
    println!(
        "\n### Throughput against offered load (mix: 40% GETATTR, 25% LOOKUP, 20% READ 4 KB, 10% WRITE 4 KB, 5% READDIRPLUS; 4 connections, 3 s a point; for a FileWall engine, its thread's CPU per completed call)\n"
    );
    let names: Vec<&str> = standing
        .iter()
        .map(|s| s.name)
        .chain(["FileWall (handles), core 1"])
        .collect();
    println!(
        "| offered (calls/s) | {} |",
        names
            .iter()
            .map(|n| format!("{n} achieved (p50 / p99 ms)"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(names.len()));
    let mut best = vec![0.0f64; names.len()];
    for rate in rates {
        let mut row = format!("| {rate:.0} |");
        for si in 0..names.len() {
            // The dedicated core lives only for its own point.
            let made = (si == standing.len()).then(cored);
            let s = made.as_ref().unwrap_or_else(|| &standing[si]);
            let (_, root, file, dir) = handles(s, &export);
            let mut mix = Vec::new();
            for _ in 0..8 {
                mix.push(Nfs3Call::Getattr(file.clone()));
            }
            for _ in 0..5 {
                mix.push(Nfs3Call::Lookup(dirop(&root, "file4k")));
            }
            for _ in 0..4 {
                mix.push(read(&file, 0, 4096));
            }
            for _ in 0..2 {
                mix.push(write(&file, 4096, vec![1; 4096], StableHow::Unstable));
            }
            mix.push(readdirplus(&dir));
            let engine = format!("filewall-{}", s.nfs.port());
            let cpu0 = thread_cpu_ns(&engine);
            let r = open_loop(s.nfs, &mix, rate, 3.0, 4).unwrap();
            // The proxy's own CPU per call (its thread's run time from the
            // scheduler), where the system has a FileWall engine.
            let per_call = cpu0
                .zip(thread_cpu_ns(&engine))
                .map(|(a, b)| format!(", {:.1} µs CPU", (b - a) as f64 / 1e3 / r.completed as f64))
                .unwrap_or_default();
            best[si] = best[si].max(r.achieved);
            row.push_str(&format!(
                " {:.0} ({:.2} / {:.2}{per_call}) |",
                r.achieved,
                r.p50.as_secs_f64() * 1e3,
                r.p99.as_secs_f64() * 1e3
            ));
        }
        println!("{row}");
    }
    println!(
        "\nsaturation (highest achieved): {}",
        names
            .iter()
            .zip(&best)
            .map(|(n, b)| format!("{n} {b:.0}/s ({:.3} of direct)", b / best[0]))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Run time so far (ns) of this process's thread named `name`, from
/// `/proc/self/task/*/schedstat` (the scheduler's own count, not sampled).
fn thread_cpu_ns(name: &str) -> Option<u64> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .flatten()
        .find_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            (comm.trim() == name).then_some(())?;
            std::fs::read_to_string(t.path().join("schedstat"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

fn policies(g: &Ganesha) {
    let export = g.export.display().to_string();
    println!(
        "\n### Latency as synthetic policies grow (µs, mean of 500; 20 keys of 50 B per request)\n"
    );
    println!("| policies | GETATTR | WRITE 4 KB | GETATTR − 0 | WRITE − 0 |");
    println!("|---|---|---|---|---|");
    let mut base = None;
    for n in [0usize, 1, 2, 5, 10, 15, 20] {
        let chain = "[[policy]]\nkind = \"synthetic\"\n".repeat(n);
        let s = proxied(g, "synthetic", &chain, None);
        let (mut c, _, file, _) = handles(&s, &export);
        let ga = mean(&time_calls(&mut c, &Nfs3Call::Getattr(file.clone()), 50, 500).unwrap());
        let wr = mean(
            &time_calls(
                &mut c,
                &write(&file, 0, vec![2; 4096], StableHow::Unstable),
                50,
                500,
            )
            .unwrap(),
        );
        let (g0, w0) = *base.get_or_insert((ga, wr));
        println!(
            "| {n} | {:.1} | {:.1} | {:+.1} | {:+.1} |",
            us(ga),
            us(wr),
            us(ga) - us(g0),
            us(wr) - us(w0)
        );
    }
}

fn main() {
    let which: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let want = |p: &str| which.is_empty() || which.iter().any(|w| w == p);
    let Some(g) = Ganesha::start() else {
        eprintln!("filewall bench: needs nfs-ganesha and root");
        return;
    };
    std::fs::write(g.export.join("file4k"), vec![5u8; 8192]).unwrap();
    let dir = g.export.join("dir32");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..32 {
        std::fs::write(dir.join(format!("entry{i:02}")), b"x").unwrap();
    }
    let systems = [
        System {
            name: "NFS direct",
            nfs: g.nfs_addr(),
            mount: g.mount_addr(),
            _proxy: None,
        },
        proxied(&g, "tunnel", "", None),
        proxied(
            &g,
            "FileWall (handles)",
            "[[policy]]\nkind = \"handles\"\n",
            Some(key()),
        ),
    ];
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load().trim());
    println!(
        "## FileWall benchmarks ({} CPUs)",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    if want("latency") {
        latency(&g, &systems);
    }
    if want("postmark") {
        run_postmark(&g, &systems);
    }
    if want("throughput") {
        // The same proxy as a dedicated core (pinned to CPU 1, polling without
        // sleep), started for its own points only: while it lives it keeps
        // its CPU busy, which the other systems' points must not pay for.
        let cored = || {
            proxied_on(
                &g,
                "FileWall (handles), core 1",
                "[[policy]]\nkind = \"handles\"\n",
                Some(key()),
                Some(1),
            )
        };
        let relay = System {
            name: "bare TCP relay",
            nfs: bare_relay(g.nfs_addr()),
            mount: bare_relay(g.mount_addr()),
            _proxy: None,
        };
        let one = System {
            name: "bare relay, one thread",
            nfs: one_thread_relay(g.nfs_addr()),
            mount: one_thread_relay(g.mount_addr()),
            _proxy: None,
        };
        let [a, b, c] = systems;
        throughput(&g, &[a, b, c, one, relay], &cored);
    }
    if want("policies") {
        policies(&g);
    }
    println!("\nload average at the end: {}", load().trim());
}
