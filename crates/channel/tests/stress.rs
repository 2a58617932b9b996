//! Concurrent stress tests of the channels across real threads: ordering, no
//! loss on reliable channels, exactly counted drops on unreliable ones, and
//! multicast fan-out to every consumer.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::sync::atomic::Ordering;
use std::thread;

use sidecore_channel::sender::{SendOutcome, Sender};
use sidecore_channel::{Recv, Ring, RingConfig};
use sidecore_types::Delivery;

const N: u64 = 300_000;

fn config(slots: usize, consumers: usize, publish_batch: usize) -> RingConfig {
    RingConfig {
        slots,
        slot_size: 64,
        consumers,
        publish_batch,
        release_batch: 8,
    }
}

/// Reads every message until the producer closes; returns the sequence numbers.
fn drain(mut c: sidecore_channel::Consumer) -> Vec<u64> {
    let mut got = Vec::new();
    loop {
        match c.try_recv() {
            Ok(m) => {
                assert_eq!(m.len(), 16, "message length survives");
                let seq = u64::from_le_bytes(m[..8].try_into().unwrap());
                let check = u64::from_le_bytes(m[8..16].try_into().unwrap());
                assert_eq!(check, !seq, "payload intact for message {seq}");
                got.push(seq);
            }
            Err(Recv::Empty) => thread::yield_now(),
            Err(Recv::Closed) => return got,
        }
    }
}

fn message(i: u64) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&i.to_le_bytes());
    m[8..].copy_from_slice(&(!i).to_le_bytes());
    m
}

#[test]
fn reliable_unicast_delivers_everything_in_order() {
    for publish_batch in [1, 16] {
        let (p, mut cs) = Ring::create(config(64, 1, publish_batch)).unwrap();
        let c = cs.pop().unwrap();
        let reader = thread::spawn(move || drain(c));
        let mut s = Sender::new(p, Delivery::Reliable);
        for i in 0..N {
            assert_eq!(
                s.send_blocking(&message(i), None).unwrap(),
                SendOutcome::Sent
            );
        }
        assert_eq!(s.stats().dropped.load(Ordering::Relaxed), 0);
        drop(s);
        let got = reader.join().unwrap();
        assert_eq!(
            got.len() as u64,
            N,
            "reliable: no loss (batch {publish_batch})"
        );
        assert!(
            got.iter().enumerate().all(|(i, &v)| v == i as u64),
            "in order"
        );
    }
}

#[test]
fn unreliable_unicast_counts_every_drop_and_keeps_order() {
    let (p, mut cs) = Ring::create(config(16, 1, 1)).unwrap();
    let mut c = cs.pop().unwrap();
    let reader = thread::spawn(move || {
        // A slow reader, so the ring overflows.
        let mut got = Vec::new();
        loop {
            match c.try_recv() {
                Ok(m) => {
                    got.push(u64::from_le_bytes(m[..8].try_into().unwrap()));
                    for _ in 0..50 {
                        std::hint::spin_loop();
                    }
                }
                Err(Recv::Empty) => thread::yield_now(),
                Err(Recv::Closed) => return got,
            }
        }
    });
    let mut s = Sender::new(p, Delivery::Unreliable);
    let (mut sent, mut dropped) = (0u64, 0u64);
    for i in 0..N {
        match s.try_send(&message(i)).unwrap() {
            SendOutcome::Sent => sent += 1,
            SendOutcome::Dropped => dropped += 1,
            SendOutcome::Full => panic!("an unreliable channel never reports Full"),
        }
    }
    assert_eq!(
        s.stats().dropped.load(Ordering::Relaxed),
        dropped,
        "every drop is counted"
    );
    drop(s);
    let got = reader.join().unwrap();
    assert_eq!(got.len() as u64, sent, "everything not dropped arrives");
    assert_eq!(sent + dropped, N);
    assert!(dropped > 0, "the slow reader must have caused drops");
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "survivors stay in order"
    );
}

#[test]
fn multicast_fans_out_every_message_to_every_consumer() {
    const CONSUMERS: usize = 3;
    let (p, cs) = Ring::create(config(128, CONSUMERS, 8)).unwrap();
    let readers: Vec<_> = cs
        .into_iter()
        .map(|c| thread::spawn(move || drain(c)))
        .collect();
    let mut s = Sender::new(p, Delivery::Reliable);
    for i in 0..N / 2 {
        s.send_blocking(&message(i), None).unwrap();
    }
    drop(s);
    for r in readers {
        let got = r.join().unwrap();
        assert_eq!(got.len() as u64, N / 2);
        assert!(got.iter().enumerate().all(|(i, &v)| v == i as u64));
    }
}

#[test]
fn unreliable_multicast_drops_are_counted_once_for_all_consumers() {
    let (p, cs) = Ring::create(config(8, 2, 1)).unwrap();
    let readers: Vec<_> = cs
        .into_iter()
        .map(|c| thread::spawn(move || drain(c)))
        .collect();
    let mut s = Sender::new(p, Delivery::Unreliable);
    let mut sent = 0;
    for i in 0..N / 4 {
        if s.try_send(&message(i)).unwrap() == SendOutcome::Sent {
            sent += 1;
        }
    }
    let dropped = s.stats().dropped.load(Ordering::Relaxed);
    drop(s);
    for r in readers {
        let got = r.join().unwrap();
        assert_eq!(
            got.len() as u64,
            sent,
            "each consumer sees exactly what was sent"
        );
    }
    assert_eq!(sent + dropped, N / 4);
}
