//! Property tests of the ring: no loss, duplication, reordering or torn
//! messages, for random shapes (slots, slot sizes, publish and release batches,
//! one to three consumers) under (1) random interleavings of producer and
//! consumer steps on one thread — single commits, batch reservations filled
//! partly or wholly, abandoned reservations, explicit publishes — which
//! explores orderings exhaustively enough to hit wrap-around, full and empty
//! edges, and (2) real threads (a producer and every consumer on its own)
//! with random batch sizes on each side. Messages have lengths that vary with
//! their sequence number and bytes derived from it, so a length or payload
//! from the wrong slot or lap is caught, not only a wrong sequence number.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use proptest::prelude::*;
use sidecore_channel::{Producer, Recv, Ring, RingConfig};

#[derive(Debug, Clone)]
enum Step {
    /// Commit up to `n` messages (as many as fit), then publish if asked.
    Produce { n: usize, publish: bool },
    /// Reserve a batch of up to `max` slots, write `write` messages into it
    /// (as many as it holds), commit it (one publish).
    ProduceBatch { max: usize, write: usize },
    /// Reserve a slot, scribble on it and drop it uncommitted: nothing is sent.
    Abandon,
    /// Consumer `c` reads up to `max` messages, batched or one by one.
    Consume { c: usize, max: usize, batched: bool },
}

fn step(consumers: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1..40usize, any::<bool>()).prop_map(|(n, publish)| Step::Produce { n, publish }),
        2 => (1..40usize, 0..40usize).prop_map(|(max, write)| Step::ProduceBatch { max, write }),
        1 => Just(Step::Abandon),
        4 => (0..consumers, 1..40usize, any::<bool>()).prop_map(|(c, max, batched)| Step::Consume {
            c,
            max,
            batched
        }),
    ]
}

fn shape() -> impl Strategy<Value = RingConfig> {
    (
        1u32..7,
        1usize..4,
        1usize..20,
        1usize..20,
        prop_oneof![Just(32usize), Just(48), Just(80), Just(144)],
    )
        .prop_map(|(log, consumers, pb, rb, slot_size)| RingConfig {
            slots: 1 << log,
            slot_size,
            consumers,
            publish_batch: pb,
            release_batch: rb,
        })
}

/// Length of message `seq` in a slot of `cap` payload bytes: 8 to `cap`.
fn msg_len(seq: u64, cap: usize) -> usize {
    8 + (seq.wrapping_mul(0x9e37_79b9) as usize) % (cap - 7)
}

/// Writes message `seq` into `slot` and returns its length.
fn write_msg(slot: &mut [u8], seq: u64) -> usize {
    let len = msg_len(seq, slot.len());
    slot[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in slot[8..len].iter_mut().enumerate() {
        *b = (seq as u8).wrapping_add(i as u8);
    }
    len
}

/// Checks message `m` is message `seq` of a ring with `cap`-byte slots.
fn check_msg(m: &[u8], seq: u64, cap: usize, who: &str) {
    let got = u64::from_le_bytes(m[..8].try_into().unwrap());
    assert_eq!(got, seq, "{who}: out of order, lost or duplicated");
    assert_eq!(m.len(), msg_len(seq, cap), "{who}: length of message {seq}");
    for (i, b) in m[8..].iter().enumerate() {
        assert_eq!(
            *b,
            (seq as u8).wrapping_add(i as u8),
            "{who}: byte {i} of message {seq}"
        );
    }
}

/// Commits up to `n` single messages numbered from `*sent`; returns how many.
fn produce(p: &mut Producer, n: usize, sent: &mut u64) -> usize {
    for k in 0..n {
        let Some(mut slot) = p.try_reserve() else {
            return k;
        };
        let len = write_msg(&mut slot, *sent);
        slot.commit(len);
        *sent += 1;
    }
    n
}

/// Reserves a batch of up to `max` and writes up to `write` messages into it.
fn produce_batch(p: &mut Producer, max: usize, write: usize, sent: &mut u64) -> usize {
    let Some(mut b) = p.try_reserve_batch(max) else {
        return 0;
    };
    assert!(b.capacity() <= max && b.is_empty());
    let mut k = 0;
    while k < write && b.push_with(|slot| write_msg(slot, *sent)) {
        *sent += 1;
        k += 1;
    }
    assert_eq!(b.len(), k);
    assert_eq!(b.remaining(), b.capacity() - k);
    b.commit();
    // The batch's commit published everything.
    assert_eq!(p.unpublished(), 0);
    k
}

/// Reads up to `max` from `c`, checking each against `expect` (advanced).
fn read(c: &mut sidecore_channel::Consumer, max: usize, batched: bool, expect: &mut u64) -> usize {
    let mut got = 0;
    let who = format!("consumer {}", c.index());
    let cap = c.payload_capacity();
    let mut check = |m: &[u8]| {
        check_msg(m, *expect, cap, &who);
        *expect += 1;
    };
    if batched {
        while got < max {
            match c.recv_batch(max - got, |m| {
                check(m);
                true
            }) {
                Ok(k) => got += k,
                Err(Recv::Empty | Recv::Closed) => break,
            }
        }
    } else {
        while got < max {
            match c.try_recv() {
                Ok(m) => {
                    check(&m);
                    got += 1;
                }
                Err(_) => break,
            }
        }
    }
    got
}

proptest! {
    // Single-threaded and cheap (about 0.2 s in a debug build): many cases.
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn interleaved_steps_deliver_every_message_once_in_order(
        (cfg, steps) in shape().prop_flat_map(|cfg| (Just(cfg), proptest::collection::vec(step(cfg.consumers), 1..120)))
    ) {
        let (mut p, mut cs) = Ring::create(cfg).unwrap();
        let probe = p.probe();
        let mut sent = 0u64;
        let mut expect = vec![0u64; cfg.consumers];
        for s in &steps {
            match *s {
                Step::Produce { n, publish } => {
                    produce(&mut p, n, &mut sent);
                    if publish {
                        p.publish();
                    }
                }
                Step::ProduceBatch { max, write } => {
                    produce_batch(&mut p, max, write, &mut sent);
                }
                Step::Abandon => {
                    // (A full ring publishes what it holds instead.)
                    let before = p.published() + p.unpublished();
                    if let Some(mut slot) = p.try_reserve() {
                        slot.fill(0xa5);
                    }
                    prop_assert_eq!(p.published() + p.unpublished(), before);
                }
                Step::Consume { c, max, batched } => {
                    let n = read(&mut cs[c], max, batched, &mut expect[c]);
                    prop_assert!(n <= max);
                    prop_assert!(expect[c] <= p.published());
                }
            }
            // Never more in flight than the ring holds, and the probe agrees
            // with the producer.
            prop_assert_eq!(p.published() + p.unpublished(), sent);
            prop_assert!(p.in_flight() <= cfg.slots as u64);
            let snap = probe.snapshot();
            prop_assert_eq!(snap.published, p.published());
            prop_assert!(snap.occupancy <= snap.capacity);
        }
        // Close: every consumer gets exactly what was sent, in order.
        drop(p);
        for (i, c) in cs.iter_mut().enumerate() {
            while read(c, 64, i % 2 == 0, &mut expect[i]) > 0 {}
            prop_assert_eq!(expect[i], sent, "consumer {} got {} of {}", i, expect[i], sent);
            prop_assert!(matches!(c.try_recv(), Err(Recv::Closed)));
            prop_assert!(c.is_producer_closed());
        }
    }
}

proptest! {
    // Up to four threads yielding to each other on two cores: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn threads_with_random_batches_lose_nothing(
        cfg in shape(),
        produce_sizes in proptest::collection::vec((1usize..64, any::<bool>()), 1..8),
        consume in proptest::collection::vec(1usize..64, 1..8),
    ) {
        const N: u64 = 20_000;
        let (mut p, cs) = Ring::create(cfg).unwrap();
        let readers: Vec<_> = cs
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                let sizes = consume.clone();
                std::thread::spawn(move || {
                    let mut expect = 0u64;
                    let mut k = i;
                    loop {
                        let max = sizes[k % sizes.len()];
                        k += 1;
                        let batched = k % 3 != 0;
                        if read(&mut c, max, batched, &mut expect) == 0 {
                            // Closed, and nothing arrived before the close.
                            if c.is_producer_closed() && read(&mut c, max, batched, &mut expect) == 0 {
                                break;
                            }
                            std::thread::yield_now();
                        }
                    }
                    (i, expect)
                })
            })
            .collect();
        let mut sent = 0u64;
        let mut k = 0;
        while sent < N {
            let (n, as_batch) = produce_sizes[k % produce_sizes.len()];
            k += 1;
            let n = n.min((N - sent) as usize);
            let done = if as_batch {
                produce_batch(&mut p, n, n, &mut sent)
            } else {
                let done = produce(&mut p, n, &mut sent);
                p.publish();
                done
            };
            if done < n {
                std::thread::yield_now();
            }
        }
        drop(p);
        for r in readers {
            let (i, got) = r.join().unwrap();
            prop_assert_eq!(got, N, "consumer {} got {} of {}", i, got, N);
        }
    }
}
