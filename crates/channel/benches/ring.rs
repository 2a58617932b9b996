//! Benchmark of the shared-memory ring against the ring as it was before issue
//! 17 (`old_ring`, per-slot stamps), the two well-kept Rust SPSC rings (rtrb,
//! ringbuf), crossbeam-channel (bounded), std::sync::mpsc (sync_channel) and a
//! Unix socket pair, all side by side in one run, with 64-byte messages
//! between two pinned cores.
//!
//! Throughput: messages per second, unbatched (one message per operation) and
//! batched (32 messages per operation: one `try_reserve_batch` and one publish
//! for the ring, one publish per 32 commits for the old ring, one chunk of 32
//! for rtrb and ringbuf, one array of 32 messages per send for the channels,
//! one 2 KiB write for the socket).
//! Latency: round trip (p50, p99) of a 64-byte message (and a 48-byte one, which
//! fits the old ring's stamp line) bounced between the cores, beside a bare
//! cache-line ping-pong measured the same way.
//!
//! Run: `cargo bench -p sidecore-channel --bench ring` (set `RING_BENCH_MSGS` to
//! change the message count, default 4,000,000; `RING_BENCH_RTT`, default
//! 200,000; `RING_BENCH_REPS`, default 3; `RING_BENCH_SLOT`, the new ring's
//! slot size for the first row, default 80 = a 64-byte payload).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::hint::black_box;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sidecore_channel::{Recv, Ring, RingConfig};

const MSG: usize = 64;
const BATCH: usize = 32;
type Msg = [u8; MSG];

mod common;
mod old_ring;
use common::{CPUS, env, pin};

/// Message `i`: its number in the first 8 bytes, 7s after, built the same
/// way for every transport.
#[inline(always)]
fn message(i: u64) -> Msg {
    let mut m = [7u8; MSG];
    m[..8].copy_from_slice(&i.to_le_bytes());
    m
}

/// Runs `producer` on core 0 and `consumer` on core 1; returns msgs/s.
fn run_pair(
    n: u64,
    producer: impl FnOnce(u64) + Send + 'static,
    consumer: impl FnOnce(u64) + Send + 'static,
) -> f64 {
    let start_gate = Arc::new(std::sync::Barrier::new(2));
    let g = Arc::clone(&start_gate);
    let c = std::thread::spawn(move || {
        pin(1);
        g.wait();
        consumer(n);
    });
    pin(0);
    start_gate.wait();
    let t = Instant::now();
    producer(n);
    c.join().unwrap();
    n as f64 / t.elapsed().as_secs_f64()
}

fn ring_throughput(n: u64, batched: bool, slot: usize) -> f64 {
    assert!(
        slot >= MSG + 16,
        "a {MSG}-byte message needs a slot of {} bytes",
        MSG + 16
    );
    let (mut p, mut cs) = Ring::create(RingConfig {
        slots: 4096,
        slot_size: slot,
        consumers: 1,
        publish_batch: 1,
        release_batch: if batched { 64 } else { 1 },
    })
    .unwrap();
    let mut c = cs.pop().unwrap();
    run_pair(
        n,
        move |n| {
            let mut i = 0;
            while i < n {
                if batched {
                    let Some(mut b) = p.try_reserve_batch((n - i).min(BATCH as u64) as usize)
                    else {
                        std::hint::spin_loop();
                        continue;
                    };
                    while b.push_with(|s| {
                        s[..MSG].copy_from_slice(&message(i));
                        MSG
                    }) {
                        i += 1;
                    }
                    b.commit();
                } else if let Some(mut s) = p.try_reserve() {
                    s[..MSG].copy_from_slice(&message(i));
                    s.commit(MSG);
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
            p.publish();
        },
        move |n| {
            let mut sum = 0u64;
            let mut got = 0;
            while got < n {
                let r = if batched {
                    c.recv_batch(BATCH * 2, |m| {
                        sum = sum.wrapping_add(u64::from_le_bytes(m[..8].try_into().unwrap()));
                        true
                    })
                } else {
                    c.try_recv().map(|m| {
                        sum = sum.wrapping_add(u64::from_le_bytes(m[..8].try_into().unwrap()));
                        1
                    })
                };
                match r {
                    Ok(k) => got += k as u64,
                    Err(Recv::Empty) => std::hint::spin_loop(),
                    Err(Recv::Closed) => break,
                }
            }
            assert_eq!(got, n);
            assert_eq!(
                sum,
                n * (n - 1) / 2,
                "lost, duplicated or corrupted messages"
            );
        },
    )
}

fn ring_throughput_default_slot(n: u64, batched: bool) -> f64 {
    ring_throughput(n, batched, env("RING_BENCH_SLOT", 80) as usize)
}

fn ring_throughput_128(n: u64, batched: bool) -> f64 {
    ring_throughput(n, batched, 128)
}

/// The ring before issue 17, driven exactly as the benchmark drove it then.
fn old_ring_throughput(n: u64, batched: bool) -> f64 {
    use old_ring::{Recv, Ring, RingConfig};
    let b = if batched { BATCH } else { 1 };
    let slot = 128;
    let (mut p, mut cs) = Ring::create(RingConfig {
        slots: 4096,
        slot_size: slot,
        consumers: 1,
        publish_batch: b,
        release_batch: if batched { 64 } else { 1 },
    })
    .unwrap();
    let mut c = cs.pop().unwrap();
    run_pair(
        n,
        move |n| {
            for i in 0..n {
                loop {
                    if let Some(mut s) = p.try_reserve() {
                        s[..MSG].copy_from_slice(&message(i));
                        s.commit(MSG);
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            p.publish();
        },
        move |n| {
            let mut sum = 0u64;
            let mut got = 0;
            while got < n {
                let r = if batched {
                    c.recv_batch(BATCH * 2, |m| {
                        sum = sum.wrapping_add(u64::from_le_bytes(m[..8].try_into().unwrap()));
                        true
                    })
                } else {
                    c.try_recv().map(|m| {
                        sum = sum.wrapping_add(u64::from_le_bytes(m[..8].try_into().unwrap()));
                        1
                    })
                };
                match r {
                    Ok(k) => got += k as u64,
                    Err(Recv::Empty) => std::hint::spin_loop(),
                    Err(Recv::Closed) => break,
                }
            }
            assert_eq!(got, n);
            black_box(sum);
        },
    )
}

fn crossbeam_throughput(n: u64, batched: bool) -> f64 {
    if batched {
        let (tx, rx) = crossbeam_channel::bounded::<[Msg; BATCH]>(4096 / BATCH);
        run_pair(
            n,
            move |n| {
                for i in 0..n / BATCH as u64 {
                    let mut b = [[7u8; MSG]; BATCH];
                    b[0][..8].copy_from_slice(&i.to_le_bytes());
                    tx.send(b).unwrap();
                }
            },
            move |n| {
                for _ in 0..n / BATCH as u64 {
                    black_box(rx.recv().unwrap());
                }
            },
        )
    } else {
        let (tx, rx) = crossbeam_channel::bounded::<Msg>(4096);
        run_pair(
            n,
            move |n| {
                for i in 0..n {
                    let mut m = [7u8; MSG];
                    m[..8].copy_from_slice(&i.to_le_bytes());
                    tx.send(m).unwrap();
                }
            },
            move |n| {
                for _ in 0..n {
                    black_box(rx.recv().unwrap());
                }
            },
        )
    }
}

fn mpsc_throughput(n: u64, batched: bool) -> f64 {
    if batched {
        let (tx, rx) = std::sync::mpsc::sync_channel::<[Msg; BATCH]>(4096 / BATCH);
        run_pair(
            n,
            move |n| {
                for i in 0..n / BATCH as u64 {
                    let mut b = [[7u8; MSG]; BATCH];
                    b[0][..8].copy_from_slice(&i.to_le_bytes());
                    tx.send(b).unwrap();
                }
            },
            move |n| {
                for _ in 0..n / BATCH as u64 {
                    black_box(rx.recv().unwrap());
                }
            },
        )
    } else {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(4096);
        run_pair(
            n,
            move |n| {
                for i in 0..n {
                    let mut m = [7u8; MSG];
                    m[..8].copy_from_slice(&i.to_le_bytes());
                    tx.send(m).unwrap();
                }
            },
            move |n| {
                for _ in 0..n {
                    black_box(rx.recv().unwrap());
                }
            },
        )
    }
}

fn rtrb_throughput(n: u64, batched: bool) -> f64 {
    let (mut tx, mut rx) = rtrb::RingBuffer::<Msg>::new(4096);
    run_pair(
        n,
        move |n| {
            if batched {
                let mut i = 0;
                while i < n {
                    let k = (n - i).min(BATCH as u64) as usize;
                    if let Ok(chunk) = tx.write_chunk_uninit(k) {
                        let written = chunk.fill_from_iter((0..k as u64).map(|j| {
                            let mut m = [7u8; MSG];
                            m[..8].copy_from_slice(&(i + j).to_le_bytes());
                            m
                        }));
                        i += written as u64;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            } else {
                for i in 0..n {
                    let mut m = [7u8; MSG];
                    m[..8].copy_from_slice(&i.to_le_bytes());
                    while tx.push(m).is_err() {
                        std::hint::spin_loop();
                    }
                }
            }
        },
        move |n| {
            let mut sum = 0u64;
            let mut got = 0u64;
            while got < n {
                if batched {
                    let k = rx.slots().min(BATCH * 2);
                    if k == 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                    let chunk = rx.read_chunk(k).unwrap();
                    for m in chunk.into_iter() {
                        sum = sum.wrapping_add(u64::from_le_bytes(m[..8].try_into().unwrap()));
                    }
                    got += k as u64;
                } else if let Ok(m) = rx.pop() {
                    sum = sum.wrapping_add(u64::from_le_bytes(m[..8].try_into().unwrap()));
                    got += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
            black_box(sum);
        },
    )
}

fn ringbuf_throughput(n: u64, batched: bool) -> f64 {
    use ringbuf::traits::{Consumer, Producer, Split};
    let (mut tx, mut rx) = ringbuf::HeapRb::<Msg>::new(4096).split();
    run_pair(
        n,
        move |n| {
            let mut batch = [[7u8; MSG]; BATCH];
            let mut i = 0;
            while i < n {
                if batched {
                    let k = (n - i).min(BATCH as u64) as usize;
                    for (j, m) in batch[..k].iter_mut().enumerate() {
                        m[..8].copy_from_slice(&(i + j as u64).to_le_bytes());
                    }
                    let pushed = tx.push_slice(&batch[..k]);
                    i += pushed as u64;
                    if pushed == 0 {
                        std::hint::spin_loop();
                    }
                } else {
                    let mut m = [7u8; MSG];
                    m[..8].copy_from_slice(&i.to_le_bytes());
                    if tx.try_push(m).is_ok() {
                        i += 1;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        },
        move |n| {
            let mut sum = 0u64;
            let mut got = 0u64;
            let mut batch = [[0u8; MSG]; BATCH * 2];
            while got < n {
                if batched {
                    let k = rx.pop_slice(&mut batch);
                    for m in &batch[..k] {
                        sum = sum.wrapping_add(u64::from_le_bytes(m[..8].try_into().unwrap()));
                    }
                    got += k as u64;
                    if k == 0 {
                        std::hint::spin_loop();
                    }
                } else if let Some(m) = rx.try_pop() {
                    sum = sum.wrapping_add(u64::from_le_bytes(m[..8].try_into().unwrap()));
                    got += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
            black_box(sum);
        },
    )
}

fn socket_throughput(n: u64, batched: bool) -> f64 {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let per_write = if batched { BATCH } else { 1 };
    run_pair(
        n,
        move |n| {
            let buf = vec![7u8; MSG * per_write];
            for _ in 0..n / per_write as u64 {
                a.write_all(&buf).unwrap();
            }
        },
        move |n| {
            let mut buf = vec![0u8; MSG * BATCH];
            let mut left = n as usize * MSG;
            while left > 0 {
                let want = left.min(buf.len());
                let got = b.read(&mut buf[..want]).unwrap();
                assert!(got > 0);
                left -= got;
            }
        },
    )
}

/// Round trips on core 0 against an echo on core 1; returns a histogram in ns.
fn rtt(
    rounds: u64,
    mut round: impl FnMut(u64) + Send,
    echo: impl FnOnce(u64) + Send + 'static,
) -> Histogram<u64> {
    let echo = std::thread::spawn(move || {
        pin(1);
        echo(rounds + 1000);
    });
    pin(0);
    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).unwrap();
    for i in 0..1000 {
        round(i); // warm-up
    }
    for i in 1000..rounds + 1000 {
        let t = Instant::now();
        round(i);
        h.record(t.elapsed().as_nanos().max(1) as u64).ok();
    }
    echo.join().unwrap();
    h
}

fn bare_pingpong(rounds: u64) -> Histogram<u64> {
    let ping = Arc::new(crossbeam_utils::CachePadded::new(AtomicU64::new(0)));
    let pong = Arc::new(crossbeam_utils::CachePadded::new(AtomicU64::new(0)));
    let (pi, po) = (Arc::clone(&ping), Arc::clone(&pong));
    rtt(
        rounds,
        move |i| {
            ping.store(i + 1, Ordering::Release);
            while pong.load(Ordering::Acquire) != i + 1 {
                std::hint::spin_loop();
            }
        },
        move |n| {
            for i in 0..n {
                while pi.load(Ordering::Acquire) != i + 1 {
                    std::hint::spin_loop();
                }
                po.store(i + 1, Ordering::Release);
            }
        },
    )
}

/// Round trips over two rings (one each way) of `slot`-byte slots carrying
/// `msg`-byte messages; the echo copies each message into its reply.
fn ring_rtt(rounds: u64, slot: usize, msg: usize) -> Histogram<u64> {
    let cfg = RingConfig {
        slots: 64,
        slot_size: slot,
        consumers: 1,
        publish_batch: 1,
        release_batch: 16,
    };
    let (mut p1, mut c1) = Ring::create(cfg).unwrap();
    let (mut p2, mut c2) = Ring::create(cfg).unwrap();
    let mut c1 = c1.pop().unwrap();
    let mut c2 = c2.pop().unwrap();
    rtt(
        rounds,
        move |i| {
            loop {
                if let Some(mut s) = p1.try_reserve() {
                    s[..8].copy_from_slice(&i.to_le_bytes());
                    s.commit(msg);
                    break;
                }
            }
            loop {
                if let Ok(m) = c2.try_recv() {
                    debug_assert_eq!(u64::from_le_bytes(m[..8].try_into().unwrap()), i);
                    break;
                }
                std::hint::spin_loop();
            }
        },
        move |n| {
            for _ in 0..n {
                loop {
                    if let Ok(m) = c1.try_recv() {
                        let mut s = loop {
                            if let Some(s) = p2.try_reserve() {
                                break s;
                            }
                        };
                        s[..msg].copy_from_slice(&m[..msg]);
                        s.commit(msg);
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
        },
    )
}

/// The same round trip over the ring before issue 17 (per-slot stamps).
fn old_ring_rtt(rounds: u64, slot: usize, msg: usize) -> Histogram<u64> {
    use old_ring::{Ring, RingConfig};
    let cfg = RingConfig {
        slots: 64,
        slot_size: slot,
        consumers: 1,
        publish_batch: 1,
        release_batch: 16,
    };
    let (mut p1, mut c1) = Ring::create(cfg).unwrap();
    let (mut p2, mut c2) = Ring::create(cfg).unwrap();
    let mut c1 = c1.pop().unwrap();
    let mut c2 = c2.pop().unwrap();
    rtt(
        rounds,
        move |i| {
            loop {
                if let Some(mut s) = p1.try_reserve() {
                    s[..8].copy_from_slice(&i.to_le_bytes());
                    s.commit(msg);
                    break;
                }
            }
            loop {
                if let Ok(m) = c2.try_recv() {
                    debug_assert_eq!(u64::from_le_bytes(m[..8].try_into().unwrap()), i);
                    break;
                }
                std::hint::spin_loop();
            }
        },
        move |n| {
            for _ in 0..n {
                loop {
                    if let Ok(m) = c1.try_recv() {
                        let mut s = loop {
                            if let Some(s) = p2.try_reserve() {
                                break s;
                            }
                        };
                        s[..msg].copy_from_slice(&m[..msg]);
                        s.commit(msg);
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
        },
    )
}

fn crossbeam_rtt(rounds: u64) -> Histogram<u64> {
    let (tx1, rx1) = crossbeam_channel::bounded::<Msg>(64);
    let (tx2, rx2) = crossbeam_channel::bounded::<Msg>(64);
    rtt(
        rounds,
        move |_| {
            tx1.send([1; MSG]).unwrap();
            black_box(rx2.recv().unwrap());
        },
        move |n| {
            for _ in 0..n {
                let m = rx1.recv().unwrap();
                tx2.send(m).unwrap();
            }
        },
    )
}

fn socket_rtt(rounds: u64) -> Histogram<u64> {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    rtt(
        rounds,
        move |_| {
            a.write_all(&[1; MSG]).unwrap();
            let mut m = [0; MSG];
            a.read_exact(&mut m).unwrap();
        },
        move |n| {
            let mut m = [0; MSG];
            for _ in 0..n {
                b.read_exact(&mut m).unwrap();
                b.write_all(&m).unwrap();
            }
        },
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let cpus = CPUS.get_or_init(|| core_affinity::get_core_ids().unwrap_or_default());
    assert!(
        cpus.len() >= 2,
        "the ring benchmark needs two CPUs, this process may use {}",
        cpus.len()
    );
    let n = env("RING_BENCH_MSGS", 4_000_000) / BATCH as u64 * BATCH as u64;
    let rounds = env("RING_BENCH_RTT", 200_000);
    let reps = env("RING_BENCH_REPS", 3) as usize;
    println!(
        "# sidecore ring benchmark: {n} messages of {MSG} B, {rounds} round trips, median of {reps} runs"
    );
    println!(
        "# cores: producer/ping on 0, consumer/echo on 1; sidecore ring slot_size {} (payload capacity {})",
        env("RING_BENCH_SLOT", 80),
        env("RING_BENCH_SLOT", 80) - 16
    );

    type Bench = fn(u64, bool) -> f64;
    let cases: [(&str, Bench); 8] = [
        ("sidecore ring", ring_throughput_default_slot),
        ("sidecore ring, 128 B slots", ring_throughput_128),
        (
            "old ring (before issue 17), 128 B slots",
            old_ring_throughput,
        ),
        ("rtrb", rtrb_throughput),
        ("ringbuf", ringbuf_throughput),
        ("crossbeam bounded", crossbeam_throughput),
        ("std mpsc sync_channel", mpsc_throughput),
        ("unix socketpair", socket_throughput),
    ];
    // Repetitions go round the transports (A B C … A B C …), so that a noisy
    // moment hits one repetition of each rather than all of one.
    let only = std::env::var("RING_BENCH_ONLY").unwrap_or_default();
    let picked: Vec<(&str, Bench)> = cases
        .into_iter()
        .filter(|(name, _)| {
            *name == "sidecore ring" || only.is_empty() || only.split(',').any(|o| name.contains(o))
        })
        .collect();
    let mut runs: Vec<(&str, bool, Vec<f64>)> = Vec::new();
    for _ in 0..reps {
        for &(name, f) in &picked {
            for batched in [false, true] {
                let r = f(n, batched);
                match runs.iter_mut().find(|r| r.0 == name && r.1 == batched) {
                    Some(run) => run.2.push(r),
                    None => runs.push((name, batched, vec![r])),
                }
            }
        }
    }
    let get = |name: &str, batched: bool| {
        let run = runs.iter().find(|r| r.0 == name && r.1 == batched).unwrap();
        median(run.2.clone())
    };
    println!(
        "\n| transport | unbatched Mmsg/s | batched Mmsg/s | ring ÷ this (unbatched) | ring ÷ this (batched) |"
    );
    println!("|---|---:|---:|---:|---:|");
    for &(name, _) in &picked {
        let (u, b) = (get(name, false), get(name, true));
        println!(
            "| {name} | {:.1} | {:.1} | {:.2}× | {:.2}× |",
            u / 1e6,
            b / 1e6,
            get("sidecore ring", false) / u,
            get("sidecore ring", true) / b
        );
    }
    for (name, batched, v) in &runs {
        let v: Vec<String> = v.iter().map(|x| format!("{:.1}", x / 1e6)).collect();
        let mode = if *batched { "batched" } else { "unbatched" };
        println!("# {name}, {mode}, each run (Mmsg/s): {}", v.join(" "));
    }
    if rounds == 0 {
        return;
    }

    let hs = [
        ("bare cache-line ping-pong", bare_pingpong(rounds)),
        ("sidecore ring (64 B)", ring_rtt(rounds, 80, MSG)),
        ("old ring, stamps (64 B)", old_ring_rtt(rounds, 128, MSG)),
        ("sidecore ring (48 B)", ring_rtt(rounds, 64, 48)),
        (
            "old ring, stamps (48 B, one line)",
            old_ring_rtt(rounds, 64, 48),
        ),
        ("crossbeam bounded", crossbeam_rtt(rounds)),
        ("unix socketpair", socket_rtt(rounds / 4)),
    ];
    let bare = &hs[0].1;
    println!("\n| round trip | p50 ns | p99 ns | p50 ÷ bare | p99 ÷ bare |");
    println!("|---|---:|---:|---:|---:|");
    for (name, h) in &hs {
        println!(
            "| {name} | {} | {} | {:.2}× | {:.2}× |",
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.5) as f64 / bare.value_at_quantile(0.5) as f64,
            h.value_at_quantile(0.99) as f64 / bare.value_at_quantile(0.99) as f64
        );
    }
    let _ = Duration::ZERO;
}
