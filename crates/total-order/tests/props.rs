//! Groups of nodes driven through a simulated network that loses,
//! duplicates and reorders datagrams: every node delivers the same sequence,
//! every message exactly once, no gap — for the Lamport orderer over β (α
//! beside β, and α apart from it behind delaying queues, as when it runs on
//! the host) and for the fixed sequencer. Garbage datagrams are counted, never a panic.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code

use std::collections::{HashSet, VecDeque};

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sidecore_total_order::{
    Datagram, Delivery, Dest, LamportOrderer, MsgId, RbConfig, RbEvent, ReliableBroadcast, SeqNode,
    ToNode, ToService, Transmit,
};

/// What the simulation needs of a node.
trait Node {
    fn broadcast(&mut self, p: Vec<u8>, now: u64) -> bool;
    fn datagram(&mut self, b: &[u8], now: u64);
    fn tick(&mut self, now: u64);
    fn transmit(&mut self) -> Option<Transmit>;
    fn receive(&mut self) -> Option<Delivery>;
}

impl Node for ToNode {
    fn broadcast(&mut self, p: Vec<u8>, _now: u64) -> bool {
        self.to_broadcast(p).is_ok()
    }
    fn datagram(&mut self, b: &[u8], now: u64) {
        self.on_datagram(b, now);
        self.flush(now);
    }
    fn tick(&mut self, now: u64) {
        ToNode::tick(self, now);
    }
    fn transmit(&mut self) -> Option<Transmit> {
        self.poll_transmit()
    }
    fn receive(&mut self) -> Option<Delivery> {
        self.to_receive()
    }
}

impl Node for SeqNode {
    fn broadcast(&mut self, p: Vec<u8>, now: u64) -> bool {
        self.to_broadcast(p, now).is_ok()
    }
    fn datagram(&mut self, b: &[u8], now: u64) {
        self.on_datagram(b, now);
    }
    fn tick(&mut self, now: u64) {
        SeqNode::tick(self, now);
    }
    fn transmit(&mut self) -> Option<Transmit> {
        self.poll_transmit()
    }
    fn receive(&mut self) -> Option<Delivery> {
        self.to_receive()
    }
}

/// α apart from β (the host orderer): what passes between them waits in
/// two queues and moves a random number of entries at each step.
struct Split {
    rb: ReliableBroadcast,
    alpha: LamportOrderer,
    svc: ToService,
    down: VecDeque<(Option<Vec<u8>>, u64)>,
    up: VecDeque<RbEvent>,
    stamped: u64,
    told: u64,
    rng: ChaCha8Rng,
}

impl Split {
    fn new(me: usize, n: usize, window: usize, seed: u64) -> Split {
        Split {
            rb: ReliableBroadcast::new(me, n, cfg()).unwrap(),
            alpha: LamportOrderer::new(me, n).unwrap(),
            svc: ToService::new(me, n, window).unwrap(),
            down: VecDeque::new(),
            up: VecDeque::new(),
            stamped: 0,
            told: 0,
            rng: ChaCha8Rng::seed_from_u64(seed ^ me as u64),
        }
    }

    fn step(&mut self, now: u64) {
        let k = self.rng.random_range(0..=self.down.len());
        for _ in 0..k {
            match self.down.pop_front() {
                Some((Some(p), stamp)) => {
                    self.rb.broadcast(stamp, p).unwrap();
                }
                Some((None, clock)) => self.rb.set_clock(clock),
                None => break,
            }
        }
        while let Some(e) = self.rb.poll_event() {
            self.up.push_back(e);
        }
        self.rb.flush(now);
        let k = self.rng.random_range(0..=self.up.len());
        for _ in 0..k {
            match self.up.pop_front() {
                Some(RbEvent::Delivered {
                    sender,
                    seq,
                    stamp,
                    payload,
                }) => {
                    self.svc.on_payload(MsgId { sender, seq }, payload);
                    self.alpha.on_delivered(sender, seq, stamp);
                }
                Some(RbEvent::Stable { sender, clock }) => self.alpha.on_stable(sender, clock),
                None => break,
            }
        }
        while let Some(id) = self.alpha.poll_order() {
            self.svc.on_order(id);
        }
        if self.alpha.clock() > self.told {
            self.told = self.alpha.clock();
            self.down.push_back((None, self.told));
        }
    }
}

impl Node for Split {
    fn broadcast(&mut self, p: Vec<u8>, now: u64) -> bool {
        if self.svc.to_broadcast(p).is_err() {
            return false;
        }
        while let Some(p) = self.svc.take_outgoing() {
            let stamp = self.alpha.stamp(self.stamped);
            self.stamped += 1;
            self.down.push_back((Some(p), stamp));
        }
        self.step(now);
        true
    }
    fn datagram(&mut self, b: &[u8], now: u64) {
        self.rb.on_datagram(b, now);
        self.step(now);
    }
    fn tick(&mut self, now: u64) {
        self.rb.tick(now);
        self.step(now);
    }
    fn transmit(&mut self) -> Option<Transmit> {
        self.rb.poll_transmit()
    }
    fn receive(&mut self) -> Option<Delivery> {
        self.svc.to_receive()
    }
}

#[derive(Debug, Clone)]
struct Net {
    loss: f64,
    dup: f64,
    /// Chance that a step takes a random datagram in flight rather than the oldest.
    shuffle: f64,
    garbage: f64,
}

/// Runs `nodes` until each has delivered `per_node` messages from every
/// node, or a step bound; returns what each delivered.
fn simulate<N: Node>(nodes: &mut [N], per_node: usize, net: &Net, seed: u64) -> Vec<Vec<MsgId>> {
    let n = nodes.len();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut flight: VecDeque<(usize, Vec<u8>)> = VecDeque::new();
    let mut sent = vec![0usize; n];
    let mut got: Vec<Vec<MsgId>> = vec![Vec::new(); n];
    let mut now: u64 = 0;
    let want = n * per_node;
    for _ in 0..400_000 {
        if got.iter().all(|g| g.len() >= want) {
            break;
        }
        // Senders offer what their window takes.
        for (i, node) in nodes.iter_mut().enumerate() {
            while sent[i] < per_node && rng.random_bool(0.5) {
                let p = format!("{i}:{}", sent[i]).into_bytes();
                if !node.broadcast(p, now) {
                    break;
                }
                sent[i] += 1;
            }
        }
        // Everything sent goes into the network.
        for (i, node) in nodes.iter_mut().enumerate() {
            while let Some(t) = node.transmit() {
                let to: Vec<usize> = match t.dest {
                    Dest::All => (0..n).filter(|&j| j != i).collect(),
                    Dest::To(j) => vec![usize::from(j)],
                };
                for j in to {
                    if rng.random_bool(net.loss) {
                        continue;
                    }
                    if rng.random_bool(net.dup) {
                        flight.push_back((j, t.bytes.clone()));
                    }
                    flight.push_back((j, t.bytes.clone()));
                }
            }
        }
        // Some datagrams arrive, oldest first or any (up to half of what is
        // in flight, so the network keeps up with what the nodes send).
        let burst = rng.random_range(0..=flight.len().div_ceil(2).max(8).min(flight.len()));
        for _ in 0..burst {
            let k = if rng.random_bool(net.shuffle) {
                rng.random_range(0..flight.len())
            } else {
                0
            };
            let Some((j, b)) = flight.swap_remove_back(k) else {
                break;
            };
            nodes[j].datagram(&b, now);
        }
        if rng.random_bool(net.garbage) {
            let j = rng.random_range(0..n);
            let len = rng.random_range(0..40);
            let junk: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            nodes[j].datagram(&junk, now);
        }
        now += 50_000;
        for node in nodes.iter_mut() {
            node.tick(now);
        }
        for (i, node) in nodes.iter_mut().enumerate() {
            while let Some(d) = node.receive() {
                let text = String::from_utf8(d.payload).unwrap();
                assert_eq!(text, format!("{}:{}", d.id.sender, d.id.seq), "node {i}");
                got[i].push(d.id);
            }
        }
    }
    got
}

fn check(got: &[Vec<MsgId>], n: usize, per_node: usize) {
    let want = n * per_node;
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.len(), want, "node {i} delivered {} of {want}", g.len());
        let unique: HashSet<_> = g.iter().collect();
        assert_eq!(unique.len(), want, "node {i} delivered a duplicate");
        for s in 0..n {
            let seqs: Vec<u64> = g
                .iter()
                .filter(|m| usize::from(m.sender) == s)
                .map(|m| m.seq)
                .collect();
            let expect: Vec<u64> = (0..per_node as u64).collect();
            assert_eq!(
                seqs, expect,
                "node {i}: sender {s}'s messages out of order or gapped"
            );
        }
        assert_eq!(g, &got[0], "node {i} and node 0 disagree on the order");
    }
}

fn cfg() -> RbConfig {
    RbConfig {
        nack_interval_ns: 400_000,
        beat_interval_ns: 300_000,
        max_ahead: 64,
    }
}

fn net() -> impl Strategy<Value = Net> {
    (0.0..0.3f64, 0.0..0.2f64, 0.0..0.8f64, 0.0..0.05f64).prop_map(
        |(loss, dup, shuffle, garbage)| Net {
            loss,
            dup,
            shuffle,
            garbage,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn lamport_over_beta_agrees_everywhere(n in 1usize..=5, per_node in 1usize..40, window in 1usize..16, net in net(), seed: u64) {
        let mut nodes: Vec<ToNode> = (0..n).map(|i| ToNode::new(i, n, window, cfg()).unwrap()).collect();
        let got = simulate(&mut nodes, per_node, &net, seed);
        check(&got, n, per_node);
    }

    #[test]
    fn the_fixed_sequencer_agrees_everywhere(n in 1usize..=5, per_node in 1usize..40, window in 1usize..16, net in net(), seed: u64) {
        let mut nodes: Vec<SeqNode> = (0..n).map(|i| SeqNode::new(i, n, window, cfg()).unwrap()).collect();
        let got = simulate(&mut nodes, per_node, &net, seed);
        check(&got, n, per_node);
    }

    #[test]
    fn the_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Datagram::decode(&bytes);
    }
}

proptest! {
    // Slower per case (two queues per node): fewer cases.
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn lamport_with_alpha_apart_from_beta_agrees_everywhere(n in 1usize..=5, per_node in 1usize..40, window in 1usize..16, net in net(), seed: u64) {
        let mut nodes: Vec<Split> = (0..n).map(|i| Split::new(i, n, window, seed)).collect();
        let got = simulate(&mut nodes, per_node, &net, seed);
        check(&got, n, per_node);
    }
}

#[test]
fn bad_parameters_are_refused() {
    use sidecore_total_order::{GroupError, LamportOrderer, ToService};
    assert_eq!(
        ToNode::new(0, 0, 4, cfg()).unwrap_err(),
        GroupError::Size { n: 0 }
    );
    assert_eq!(
        ToNode::new(0, 65, 4, cfg()).unwrap_err(),
        GroupError::Size { n: 65 }
    );
    assert_eq!(
        LamportOrderer::new(3, 3).unwrap_err(),
        GroupError::NotMember { me: 3, n: 3 }
    );
    assert_eq!(
        ToService::new(0, 3, 0).unwrap_err(),
        GroupError::Zero { field: "window" }
    );
    let mut c = cfg();
    c.max_ahead = 0;
    assert!(ToNode::new(0, 3, 4, c).is_err());
    let mut node = ToNode::new(0, 3, 1, cfg()).unwrap();
    assert!(node.to_broadcast(vec![0; 1401]).is_err());
    node.to_broadcast(vec![1]).unwrap();
    assert!(node.to_broadcast(vec![2]).is_err(), "the window holds one");
}

#[test]
fn malformed_and_foreign_datagrams_are_counted_and_dropped() {
    let mut node = ToNode::new(1, 3, 4, cfg()).unwrap();
    node.on_datagram(b"", 0);
    node.on_datagram(b"garbage!", 0);
    // From a node outside the group, and one claiming to be this node.
    let d = |from| {
        Datagram::Data {
            from,
            seq: 0,
            stamp: 1,
            payload: vec![],
        }
        .encode()
    };
    node.on_datagram(&d(9), 0);
    node.on_datagram(&d(1), 0);
    // A beat for a group of another size.
    node.on_datagram(
        &Datagram::Beat {
            from: 0,
            sent: 1,
            clock: 1,
            next: vec![0; 5],
        }
        .encode(),
        0,
    );
    let s = node.stats();
    assert_eq!((s.received, s.malformed, s.foreign), (5, 3, 2));
    assert!(node.to_receive().is_none());
}
