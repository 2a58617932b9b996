//! Benchmark of the stream channel (a peer node's channel) against a bare TCP
//! stream moving the same bytes in the same batches on the same link, side by
//! side in one run: 1,024-byte messages, 32 per batch (one `publish`, or one
//! `write`, per batch), sender pinned to CPU 0 and receiver to CPU 1, over
//! loopback and — as root — over a veth pair into a network namespace.
//!
//! Both sides do the same work per message: the sender writes the message
//! into its batch (the channel's `send_with` in place at the end of its send
//! buffer; the bare sender into its batch buffer), the receiver finds each
//! frame by its length prefix and reads its first byte.
//!
//! Run: `cargo bench -p sidecore-channel --bench stream` (environment:
//! `STREAM_BENCH_MSGS`, default 400,000; `STREAM_BENCH_REPS`, default 3).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use sidecore_channel::stream::{StreamListener, StreamSender};
use sidecore_types::Delivery;

const MSG: usize = 1024;
const BATCH: usize = 32;
const NS: &str = "sc-streambench";

mod common;
use common::{env, pin};

fn message() -> Vec<u8> {
    (0..MSG).map(|i| (i * 31 % 251) as u8).collect()
}

/// A listener bound in namespace `ns` (or here), and the address to reach it.
fn listen(ns: Option<&str>) -> (TcpListener, String) {
    let ip = if ns.is_some() {
        "10.233.0.2"
    } else {
        "127.0.0.1"
    };
    let l = sidecore_testbed::netns::within(ns, || TcpListener::bind(format!("{ip}:0")))
        .unwrap()
        .unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

/// Bare TCP: seconds to move `n` messages.
fn bare(n: u64, ns: Option<&str>) -> f64 {
    let (l, addr) = listen(ns);
    let rx = std::thread::spawn(move || {
        pin(1);
        let (mut s, _) = l.accept().unwrap();
        // Polled without blocking, 64 KiB per read, as the channel's receiver does.
        s.set_nonblocking(true).unwrap();
        let mut buf = vec![0u8; 128 * 1024];
        let (mut start, mut end, mut got) = (0usize, 0usize, 0u64);
        let mut sink = 0u64;
        while got < n {
            if end == buf.len() {
                buf.copy_within(start..end, 0);
                end -= start;
                start = 0;
            }
            let want = (buf.len() - end).min(64 * 1024);
            let r = match s.read(&mut buf[end..end + want]) {
                Ok(0) => panic!("sender closed early"),
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("{e}"),
            };
            end += r;
            while end - start >= 4 {
                let len = u32::from_le_bytes(buf[start..start + 4].try_into().unwrap()) as usize;
                if end - start < 4 + len {
                    break;
                }
                sink = sink.wrapping_add(u64::from(buf[start + 4]));
                start += 4 + len;
                got += 1;
            }
            if start == end {
                start = 0;
                end = 0;
            }
        }
        black_box(sink);
        Instant::now()
    });
    pin(0);
    let msg = message();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut batch = vec![0u8; BATCH * (4 + MSG)];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < n {
        let k = (n - sent).min(BATCH as u64) as usize;
        for i in 0..k {
            let at = i * (4 + MSG);
            batch[at..at + 4].copy_from_slice(&(MSG as u32).to_le_bytes());
            batch[at + 4..at + 4 + MSG].copy_from_slice(&msg);
        }
        s.write_all(&batch[..k * (4 + MSG)]).unwrap();
        sent += k as u64;
    }
    let done = rx.join().unwrap();
    done.duration_since(t0).as_secs_f64()
}

/// How the channel's sender is driven.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// As the runtime drives it: each message written in place.
    InPlace,
    /// As it was before: each message filled into a staging buffer, then copied.
    Staged,
    /// In place, with Nagle's algorithm on.
    Nagle,
}

/// The stream channel: seconds to move `n` messages.
fn channel(n: u64, ns: Option<&str>, mode: Mode) -> f64 {
    let (l, addr) = listen(ns);
    let l = StreamListener::from_std(l);
    let rx = std::thread::spawn(move || {
        pin(1);
        let mut r = l.accept(Duration::from_secs(10)).unwrap();
        let (mut got, mut sink) = (0u64, 0u64);
        while got < n {
            if let Some(f) = r.try_recv().unwrap() {
                sink = sink.wrapping_add(u64::from(f[0]));
                got += 1;
            }
        }
        black_box(sink);
        Instant::now()
    });
    pin(0);
    let msg = message();
    let mut s =
        StreamSender::connect(&addr, "bench", Delivery::Reliable, Duration::from_secs(5)).unwrap();
    s.set_nodelay(mode != Mode::Nagle).unwrap();
    let mut staging = [0u8; 2048];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < n {
        let k = (n - sent).min(BATCH as u64);
        for _ in 0..k {
            if mode == Mode::Staged {
                staging[..MSG].copy_from_slice(&msg);
                s.send(&staging[..MSG]).unwrap();
            } else {
                s.send_with(MSG, |slot| {
                    slot[..MSG].copy_from_slice(&msg);
                    MSG
                })
                .unwrap();
            }
        }
        s.publish().unwrap();
        sent += k;
    }
    let done = rx.join().unwrap();
    done.duration_since(t0).as_secs_f64()
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A namespace behind a veth pair, if this process may make one.
fn netns() -> Option<NsGuard> {
    let _ = sh(&["ip", "netns", "del", NS]);
    let _ = sh(&["ip", "link", "del", "sc-sb0"]);
    let ok = sh(&["ip", "netns", "add", NS])
        && sh(&[
            "ip", "link", "add", "sc-sb0", "type", "veth", "peer", "name", "sc-sb1",
        ])
        && sh(&["ip", "link", "set", "sc-sb1", "netns", NS])
        && sh(&["ip", "addr", "add", "10.233.0.1/24", "dev", "sc-sb0"])
        && sh(&["ip", "link", "set", "sc-sb0", "up"])
        && sh(&[
            "ip",
            "netns",
            "exec",
            NS,
            "ip",
            "addr",
            "add",
            "10.233.0.2/24",
            "dev",
            "sc-sb1",
        ])
        && sh(&[
            "ip", "netns", "exec", NS, "ip", "link", "set", "sc-sb1", "up",
        ])
        && sh(&["ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up"]);
    let g = NsGuard;
    ok.then_some(g)
}

struct NsGuard;

impl Drop for NsGuard {
    fn drop(&mut self) {
        let _ = sh(&["ip", "link", "del", "sc-sb0"]);
        let _ = sh(&["ip", "netns", "del", NS]);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n = env("STREAM_BENCH_MSGS", 400_000);
    let reps = env("STREAM_BENCH_REPS", 3).max(1);
    let guard = netns();
    let mut links: Vec<(&str, Option<&str>)> = vec![("loopback", None)];
    if guard.is_some() {
        links.push(("veth into a netns", Some(NS)));
    } else {
        println!("(not root: the network-namespace link is skipped)");
    }
    println!(
        "{n} messages of {MSG} B, {BATCH} per batch, {reps} alternating repetitions; median Mmsg/s (Gbit/s of payload)"
    );
    println!(
        "| link | sender | bare TCP | stream channel | channel ÷ bare (pairs) | median ratio |"
    );
    println!("|---|---|---:|---:|---|---:|");
    let modes = [
        (Mode::InPlace, "in place, TCP_NODELAY (as deployed)"),
        (Mode::Staged, "staged copy (before)"),
        (Mode::Nagle, "in place, Nagle on"),
    ];
    for (label, ns) in links {
        for (mode, what) in modes {
            let (mut b, mut c, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..reps {
                let tb = bare(n, ns);
                let tc = channel(n, ns, mode);
                b.push(n as f64 / tb / 1e6);
                c.push(n as f64 / tc / 1e6);
                ratios.push(tb / tc);
            }
            let gbit = |m: f64| m * 1e6 * (MSG * 8) as f64 / 1e9;
            let (mb, mc) = (median(b), median(c));
            println!(
                "| {label} | {what} | {mb:.3} ({:.1}) | {mc:.3} ({:.1}) | {} | {:.2}× |",
                gbit(mb),
                gbit(mc),
                ratios
                    .iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                median(ratios.clone())
            );
        }
    }
    drop(guard);
}
