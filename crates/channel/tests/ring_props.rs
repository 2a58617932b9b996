//! Property tests of the ring: no loss, duplication or reordering, for random
//! shapes (slots, publish and release batches, consumers) under (1) random
//! interleavings of producer and consumer steps on one thread, which explores
//! orderings exhaustively enough to hit wrap-around, full and empty edges, and
//! (2) two real threads with random batch sizes on each side.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use proptest::prelude::*;
use sidecore_channel::{Recv, Ring, RingConfig};

#[derive(Debug, Clone)]
enum Step {
    /// Commit up to `n` messages (as many as fit), then publish if asked.
    Produce { n: usize, publish: bool },
    /// Consumer `c` reads up to `max` messages, batched or one by one.
    Consume { c: usize, max: usize, batched: bool },
}

fn step(consumers: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        (1..40usize, any::<bool>()).prop_map(|(n, publish)| Step::Produce { n, publish }),
        (0..consumers, 1..40usize, any::<bool>()).prop_map(|(c, max, batched)| Step::Consume {
            c,
            max,
            batched
        }),
    ]
}

fn shape() -> impl Strategy<Value = RingConfig> {
    (1u32..7, 1usize..3, 1usize..20, 1usize..20).prop_map(|(log, consumers, pb, rb)| RingConfig {
        slots: 1 << log,
        slot_size: 32,
        consumers,
        publish_batch: pb,
        release_batch: rb,
    })
}

/// Reads up to `max` from `c`, checking each against `expect` (advanced).
fn read(c: &mut sidecore_channel::Consumer, max: usize, batched: bool, expect: &mut u64) -> usize {
    let mut got = 0;
    let index = c.index();
    let mut check = |m: &[u8]| {
        let v = u64::from_le_bytes(m[..8].try_into().unwrap());
        assert_eq!(
            v, *expect,
            "consumer {index}: out of order, lost or duplicated"
        );
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
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn interleaved_steps_deliver_every_message_once_in_order(
        (cfg, steps) in shape().prop_flat_map(|cfg| (Just(cfg), proptest::collection::vec(step(cfg.consumers), 1..120)))
    ) {
        let (mut p, mut cs) = Ring::create(cfg).unwrap();
        let mut sent = 0u64;
        let mut expect = vec![0u64; cfg.consumers];
        for s in &steps {
            match *s {
                Step::Produce { n, publish } => {
                    for _ in 0..n {
                        let Some(mut slot) = p.try_reserve() else { break };
                        slot[..8].copy_from_slice(&sent.to_le_bytes());
                        slot.commit(8);
                        sent += 1;
                    }
                    if publish {
                        p.publish();
                    }
                    // Never more in flight than the ring holds.
                    prop_assert!(p.in_flight() <= cfg.slots as u64);
                }
                Step::Consume { c, max, batched } => {
                    read(&mut cs[c], max, batched, &mut expect[c]);
                    prop_assert!(expect[c] <= sent);
                }
            }
        }
        // Close: every consumer gets exactly what was sent, in order.
        drop(p);
        for (i, c) in cs.iter_mut().enumerate() {
            while read(c, 64, i % 2 == 0, &mut expect[i]) > 0 {}
            prop_assert_eq!(expect[i], sent, "consumer {} got {} of {}", i, expect[i], sent);
            prop_assert!(matches!(c.try_recv(), Err(Recv::Closed)));
        }
    }

    #[test]
    fn two_threads_with_random_batches_lose_nothing(
        cfg in shape(),
        produce in proptest::collection::vec(1usize..64, 1..8),
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
                    let mut k = 0;
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
            let n = produce[k % produce.len()];
            k += 1;
            for _ in 0..n {
                if sent == N {
                    break;
                }
                match p.try_reserve() {
                    Some(mut slot) => {
                        slot[..8].copy_from_slice(&sent.to_le_bytes());
                        slot.commit(8);
                        sent += 1;
                    }
                    None => std::thread::yield_now(),
                }
            }
            p.publish();
        }
        drop(p);
        for r in readers {
            let (i, got) = r.join().unwrap();
            prop_assert_eq!(got, N, "consumer {} got {} of {}", i, got, N);
        }
    }
}
