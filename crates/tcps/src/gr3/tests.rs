use super::*;
use proptest::prelude::*;

fn limits() -> Limits {
    Limits {
        max_snd_bytes: 64 * 1024,
        max_rcv_bytes: 64 * 1024,
        max_rq_size: 32,
    }
}

fn load() -> Load {
    Load {
        pending_send_bytes: 0,
        max_snd_bytes: 64 * 1024,
        pending_rcv_bytes: 0,
        max_rcv_bytes: 64 * 1024,
        pending_packets: 0,
        max_rq_size: 32,
        segment_size: 1024,
    }
}

#[test]
fn weights_follow_equations_2_1_to_2_7() {
    // Empty receive queue, nothing else: W = W_r = 64 KiB / 1 KiB.
    assert_eq!(weight(&load(), &limits()), 64);
    // 8 KiB to send adds 8; 3 pending packets add 3; 16 KiB unread takes 16.
    let l = Load {
        pending_send_bytes: 8 * 1024,
        pending_rcv_bytes: 16 * 1024,
        pending_packets: 3,
        ..load()
    };
    assert_eq!(weight(&l, &limits()), 8 + 48 + 3);
    // A full receive queue (unresponsive application) contributes nothing.
    let full = Load {
        pending_rcv_bytes: 64 * 1024,
        ..load()
    };
    assert_eq!(weight(&full, &limits()), 0);
    // Normalisation (2.4–2.6): a socket with a buffer 4x the system maximum
    // counts its free space at a quarter.
    let big = Load {
        max_rcv_bytes: 256 * 1024,
        max_rq_size: 128,
        pending_packets: 8,
        ..load()
    };
    assert_eq!(weight(&big, &limits()), 64 + 2);
    // Zero sizes (bad input) do not divide by zero.
    let zero = Load {
        segment_size: 0,
        max_rcv_bytes: 0,
        max_snd_bytes: 0,
        max_rq_size: 0,
        pending_send_bytes: 5,
        ..Load::default()
    };
    assert!(weight(&zero, &limits()) > 0);
    // Saturates at 32 bits.
    let huge = Load {
        pending_send_bytes: u64::MAX,
        segment_size: 1,
        ..load()
    };
    assert_eq!(weight(&huge, &limits()), MAX_WEIGHT);
}

#[test]
fn groups_follow_equation_2_8() {
    assert_eq!(group_order(0), None);
    assert_eq!(group_order(1), Some(0));
    assert_eq!(group_order(2), Some(1));
    assert_eq!(group_order(3), Some(1));
    assert_eq!(group_order(4), Some(2));
    assert_eq!(group_order(MAX_WEIGHT), Some(31));
    assert_eq!(group_order(u64::MAX), Some(31));
}

proptest! {
    #[test]
    fn group_order_brackets_the_weight(w in 1u64..=MAX_WEIGHT) {
        let s = group_order(w).expect("positive weight has a group");
        prop_assert!(1u64 << s <= w && w < 1u64 << (s + 1));
    }
}

/// Runs `steps` decisions and returns the largest service error any client
/// had at any prefix: |served − t·w/Σw|.
fn max_error(weights: &[u64], steps: usize, rule: GroupRule) -> (f64, usize) {
    let mut s = Gr3::new(rule);
    for (k, &w) in weights.iter().enumerate() {
        s.set(k, w);
    }
    let total: f64 = weights.iter().map(|&w| w as f64).sum();
    let mut served = vec![0u64; weights.len()];
    let mut worst = 0.0f64;
    for t in 1..=steps {
        let k = s.pick().expect("clients are scheduled");
        served[k] += 1;
        for (c, &w) in weights.iter().enumerate() {
            let ideal = t as f64 * w as f64 / total;
            worst = worst.max((served[c] as f64 - ideal).abs());
        }
    }
    (worst, s.groups())
}

/// GR³'s bound (Caprita et al., USENIX 2005): the service error of a client
/// is O(g), g the number of groups — a constant independent of the number of
/// clients and of time. We check |error| ≤ 2g + 2 at every prefix.
fn gr3_bound(groups: usize) -> f64 {
    2.0 * groups as f64 + 2.0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn shares_are_proportional_within_gr3_bound(
        weights in prop::collection::vec(1u64..=1 << 16, 1..24),
        rounds in 1usize..4,
    ) {
        let total: u64 = weights.iter().sum();
        // Enough decisions for every client to be served many times.
        let steps = ((total / weights.iter().min().copied().unwrap_or(1)) as usize)
            .clamp(64, 4000) * rounds;
        let (err, g) = max_error(&weights, steps, GroupRule::Gr3);
        prop_assert!(err <= gr3_bound(g), "error {err:.2} > bound {} with {g} groups for {weights:?}", gr3_bound(g));
    }

    #[test]
    fn within_one_group_drr_is_proportional(
        // Every weight in [2^10, 2^11): one group of order 10.
        weights in prop::collection::vec(1024u64..2048, 1..32),
    ) {
        let (err, g) = max_error(&weights, 3000, GroupRule::Gr3);
        prop_assert_eq!(g, 1);
        // DRR with quanta q in [1, 2): a client is ahead by less than one
        // quantum and behind by less than one round's quantum plus a carried
        // fraction, so within 3 slots of the ideal.
        prop_assert!(err < 3.0, "error {err:.2} for {weights:?}");
    }
}

#[test]
fn the_printed_group_test_is_not_proportional() {
    // E1: with line 4 as printed, the first group never lets the others run.
    let weights = [6, 3, 1];
    let (err, _) = max_error(&weights, 1000, GroupRule::AsPrinted);
    assert!(
        err > 100.0,
        "the printed rule was proportional: error {err}"
    );
    let (err, g) = max_error(&weights, 1000, GroupRule::Gr3);
    assert!(err <= gr3_bound(g), "error {err}");
}

#[test]
fn gr3_gives_exact_ratios_over_a_frame() {
    // Three groups of φ 6, 3, 1 (one client each): 10 slots give 6, 3, 1.
    let mut s = Gr3::default();
    s.set('a', 6);
    s.set('b', 3);
    s.set('c', 1);
    let mut n = HashMap::default();
    for _ in 0..10 {
        *n.entry(s.pick().expect("scheduled")).or_insert(0) += 1;
    }
    assert_eq!((n[&'a'], n[&'b'], n[&'c']), (6, 3, 1));
}

#[test]
fn weight_zero_leaves_the_groups() {
    let mut s = Gr3::default();
    s.set(1, 5);
    s.set(2, 9);
    assert_eq!(s.len(), 2);
    s.set(1, 0);
    assert_eq!(s.len(), 1);
    for _ in 0..10 {
        assert_eq!(s.pick(), Some(2));
    }
    s.remove(&2);
    assert_eq!(s.pick(), None);
    // Moves between groups keep one entry.
    s.set(3, 1);
    s.set(3, 1000);
    s.set(3, 2);
    assert_eq!(s.len(), 1);
    assert_eq!(s.weight_of(&3), Some(2));
}

#[test]
fn queues_serve_control_then_ready_then_syn() {
    let mut s = Scheduler::new(Role::Master);
    s.set_syn_pending(true);
    s.update(
        1,
        Pending {
            teardown: false,
            weight: 10,
        },
    );
    s.update(
        2,
        Pending {
            teardown: true,
            weight: 10,
        },
    );
    s.update(
        3,
        Pending {
            teardown: false,
            weight: 0,
        },
    );
    assert_eq!(s.queue_of(&1), Some(SchedQueue::Ready));
    assert_eq!(s.queue_of(&2), Some(SchedQueue::Control));
    assert_eq!(s.queue_of(&3), Some(SchedQueue::Wait));
    assert_eq!(s.pick(), Some(Pick::Control(2)));
    assert_eq!(s.pick(), Some(Pick::Ready(1)));
    s.update(
        1,
        Pending {
            teardown: false,
            weight: 0,
        },
    );
    assert_eq!(s.pick(), Some(Pick::Accept));
    s.set_syn_pending(false);
    assert_eq!(s.pick(), None);
    assert_eq!(
        s.counts(),
        SchedCounts {
            control: 1,
            ready: 1,
            accept: 1
        }
    );
}

#[test]
fn helpers_serve_only_ready() {
    let mut s = Scheduler::new(Role::Helper);
    s.set_syn_pending(true);
    s.update(
        7,
        Pending {
            teardown: true,
            weight: 0,
        },
    );
    s.update(
        8,
        Pending {
            teardown: false,
            weight: 4,
        },
    );
    assert_eq!(s.pick(), Some(Pick::Ready(8)));
    s.remove(&8);
    assert_eq!(s.pick(), None);
    assert_eq!(s.take_control(), vec![7]);
}
