//! Loom model check of the ring's publish/release protocol: every interleaving
//! (up to a preemption bound) and every value the weak memory model lets an
//! atomic load return, for rings of two slots so that the producer laps them.
//! Under `cfg(loom)` the ring's tail and heads are loom atomics and every slot
//! read or write is registered with a loom cell (`Shared::track_*` in
//! `src/ring.rs`), so loom fails the model if a consumer could read a slot the
//! producer's publish does not order before it, or the producer could rewrite
//! a slot a consumer's release does not order after its read. The messages'
//! values are checked too: no loss, duplication or reordering.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p sidecore-channel --test loom --release`
//! (`LOOM_MAX_PREEMPTIONS` overrides the bound of 3). Without `--cfg loom`
//! this file compiles to nothing.
#![cfg(loom)]
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use loom::thread;
use sidecore_channel::{Consumer, Producer, Recv, Ring, RingConfig};

/// Preemptions explored per execution unless `LOOM_MAX_PREEMPTIONS` says otherwise.
const PREEMPTION_BOUND: usize = 3;

/// Scheduling decisions allowed in one execution: three threads that poll
/// (and yield) while the ring is empty or full take more than loom's default
/// 1,000.
const MAX_BRANCHES: usize = 100_000;

/// Messages through the two-slot unicast rings: two and a half laps.
const MESSAGES: u8 = 5;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(PREEMPTION_BOUND);
    }
    b.max_branches = MAX_BRANCHES;
    b.check(f);
}

fn ring(consumers: usize, publish_batch: usize, release_batch: usize) -> (Producer, Vec<Consumer>) {
    Ring::create(RingConfig {
        slots: 2,
        slot_size: 32,
        consumers,
        publish_batch,
        release_batch,
    })
    .unwrap()
}

/// Sends `0..n` one message at a time, yielding while the ring is full.
fn send_each(p: &mut Producer, n: u8) {
    for v in 0..n {
        loop {
            if let Some(mut s) = p.try_reserve() {
                s[0] = v;
                s[1] = !v;
                s.commit(2);
                break;
            }
            thread::yield_now();
        }
    }
    p.publish();
}

/// Sends `0..n` in batches of up to `batch`, one publish per batch.
fn send_batches(p: &mut Producer, n: u8, batch: usize) {
    let mut v = 0;
    while v < n {
        let Some(mut b) = p.try_reserve_batch(batch.min(usize::from(n - v))) else {
            thread::yield_now();
            continue;
        };
        while v < n
            && b.push_with(|s| {
                s[0] = v;
                s[1] = !v;
                2
            })
        {
            v += 1;
        }
        b.commit();
    }
}

/// Reads until the ring closes; checks each message is the next value intact.
fn receive_all(c: &mut Consumer, batched: bool) -> u8 {
    let mut expect = 0u8;
    let mut check = |m: &[u8]| {
        assert_eq!(m, [expect, !expect], "lost, duplicated, reordered or torn");
        expect += 1;
    };
    loop {
        let r = if batched {
            c.recv_batch(2, |m| {
                check(m);
                true
            })
        } else {
            c.try_recv().map(|m| {
                check(&m);
                1
            })
        };
        match r {
            Ok(_) => {}
            Err(Recv::Empty) => thread::yield_now(),
            Err(Recv::Closed) => return expect,
        }
    }
}

#[test]
fn unicast_one_at_a_time_laps_the_ring() {
    model(|| {
        let (mut p, mut cs) = ring(1, 1, 1);
        let mut c = cs.pop().unwrap();
        let t = thread::spawn(move || receive_all(&mut c, false));
        send_each(&mut p, MESSAGES);
        drop(p);
        assert_eq!(t.join().unwrap(), MESSAGES);
    });
}

#[test]
fn unicast_batches_publish_once_and_release_in_batches() {
    model(|| {
        let (mut p, mut cs) = ring(1, 2, 2);
        let mut c = cs.pop().unwrap();
        let t = thread::spawn(move || receive_all(&mut c, true));
        send_batches(&mut p, MESSAGES, 2);
        drop(p);
        assert_eq!(t.join().unwrap(), MESSAGES);
    });
}

// Loom threads that poll each other with `yield_now` must be two at most: a
// yielding thread lets any other run, so three pollers can hand the turn
// around among themselves for as long as the branch limit allows, and the
// model never finishes. The multicast models therefore run one consumer on
// the producer's thread, and a departing consumer leaves from its peer's.

#[test]
fn multicast_every_consumer_gets_everything() {
    model(|| {
        let (mut p, mut cs) = ring(2, 1, 1);
        let mut remote = cs.pop().unwrap();
        let mut local = cs.pop().unwrap();
        let t = thread::spawn(move || receive_all(&mut remote, true));
        let mut expect = 0u8;
        let mut drain = |c: &mut Consumer| {
            while let Ok(m) = c.try_recv() {
                assert_eq!(&*m, [expect, !expect], "local consumer: lost or reordered");
                expect += 1;
            }
        };
        for v in 0..3u8 {
            loop {
                if let Some(mut s) = p.try_reserve() {
                    s[0] = v;
                    s[1] = !v;
                    s.commit(2);
                    break;
                }
                drain(&mut local);
                thread::yield_now();
            }
        }
        drop(p);
        drain(&mut local);
        assert_eq!(expect, 3);
        assert!(matches!(local.try_recv(), Err(Recv::Closed)));
        assert_eq!(t.join().unwrap(), 3);
    });
}

#[test]
fn a_departing_consumer_never_blocks_the_producer() {
    model(|| {
        let (mut p, mut cs) = ring(2, 1, 1);
        let quitter = cs.pop().unwrap();
        let mut c = cs.pop().unwrap();
        let t = thread::spawn(move || {
            drop(quitter);
            receive_all(&mut c, false)
        });
        send_each(&mut p, 3);
        drop(p);
        assert_eq!(t.join().unwrap(), 3);
    });
}
