//! β, `ReliableBroadcast` (HYDRA §8.2.1): every node numbers its messages
//! 0, 1, 2, … and sends each to every other node; a receiver delivers each
//! sender's messages in that order, exactly once. A hole in a sender's
//! numbers (a later message arrived, or a beat says more were sent) makes the
//! receiver send that sender a NACK at once and again every `nack_interval_ns`
//! while the hole lasts; the sender answers with the messages it still holds.
//! A sender keeps a message until every node's beat says it has it.
//!
//! Sans-IO: datagrams and the time come in as calls, datagrams to send and
//! deliveries go out through [`ReliableBroadcast::poll_transmit`] and
//! [`ReliableBroadcast::poll_event`]. Malformed or foreign datagrams are
//! counted in [`RbStats`] and dropped.

use std::collections::{BTreeMap, VecDeque};

use crate::wire::{Datagram, MAX_NACK_SEQS, MAX_NODES, MAX_PAYLOAD_BYTES, NodeId};

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// Every other node.
    All,
    /// One node.
    To(NodeId),
}

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub dest: Dest,
    pub bytes: Vec<u8>,
}

/// What β hands up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RbEvent {
    /// The next message of `sender`, in its order (own messages included).
    Delivered {
        sender: NodeId,
        seq: u64,
        stamp: u64,
        payload: Vec<u8>,
    },
    /// Every message of `sender` stamped up to `clock` has been delivered,
    /// and every later one will carry a larger stamp (from its beat).
    Stable { sender: NodeId, clock: u64 },
}

/// Timers and bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RbConfig {
    /// How often a hole is NACKed again, ns.
    pub nack_interval_ns: u64,
    /// How often a beat goes out when nothing else does, ns.
    pub beat_interval_ns: u64,
    /// Messages held ahead of a hole per sender; later ones are dropped (and NACKed later).
    pub max_ahead: u64,
}

impl Default for RbConfig {
    fn default() -> Self {
        RbConfig {
            nack_interval_ns: 2_000_000,
            beat_interval_ns: 1_000_000,
            max_ahead: 4096,
        }
    }
}

/// Why a group or a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("a group of {n} nodes (between 1 and {MAX_NODES})")]
    Size { n: usize },
    #[error("node {me} is not in a group of {n}")]
    NotMember { me: usize, n: usize },
    #[error("a payload of {len} bytes (at most {MAX_PAYLOAD_BYTES})")]
    TooLong { len: usize },
    #[error("`{field}` must be at least 1")]
    Zero { field: &'static str },
}

/// Checks a group's size and a member's index.
pub fn check_group(me: usize, n: usize) -> Result<(), GroupError> {
    if n == 0 || n > MAX_NODES {
        return Err(GroupError::Size { n });
    }
    if me >= n {
        return Err(GroupError::NotMember { me, n });
    }
    Ok(())
}

/// Counters: what came in, what was dropped and why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RbStats {
    pub received: u64,
    pub malformed: u64,
    /// From a node outside the group, or claiming to be this node.
    pub foreign: u64,
    pub duplicates: u64,
    /// Too far ahead of a hole to hold.
    pub overflow: u64,
    pub nacks_sent: u64,
    pub retransmitted: u64,
    /// Asked for messages no longer held (every node had acknowledged them).
    pub unavailable: u64,
}

/// What this node knows of one sender.
#[derive(Debug, Default)]
struct Peer {
    /// The next sequence number to deliver.
    next: u64,
    /// Messages that arrived ahead of a hole: seq → (stamp, payload).
    ahead: BTreeMap<u64, (u64, Vec<u8>)>,
    /// The sender has sent at least this many messages (from its beats).
    sent: u64,
    /// The latest beat still waiting for its messages: (sent, clock).
    beat: Option<(u64, u64)>,
    /// How far this sender has received this node's messages (its beats).
    acked: u64,
    last_nack_ns: Option<u64>,
}

/// β on one node.
#[derive(Debug)]
pub struct ReliableBroadcast {
    me: NodeId,
    cfg: RbConfig,
    peers: Vec<Peer>,
    /// Own messages not yet acknowledged by every node, from `history_base`.
    history: VecDeque<(u64, Vec<u8>)>,
    history_base: u64,
    next_seq: u64,
    /// The orderer's clock, carried by beats.
    clock: u64,
    last_beat_ns: Option<u64>,
    /// The clock the last datagram sent carried.
    clock_sent: u64,
    out: VecDeque<Transmit>,
    events: VecDeque<RbEvent>,
    stats: RbStats,
}

impl ReliableBroadcast {
    /// Node `me` of a group of `n`.
    pub fn new(me: usize, n: usize, cfg: RbConfig) -> Result<Self, GroupError> {
        check_group(me, n)?;
        if cfg.max_ahead == 0 {
            return Err(GroupError::Zero { field: "max_ahead" });
        }
        Ok(ReliableBroadcast {
            me: me as NodeId,
            cfg,
            peers: (0..n).map(|_| Peer::default()).collect(),
            history: VecDeque::new(),
            history_base: 0,
            next_seq: 0,
            clock: 0,
            last_beat_ns: None,
            clock_sent: 0,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: RbStats::default(),
        })
    }

    pub fn me(&self) -> NodeId {
        self.me
    }

    pub fn group_size(&self) -> usize {
        self.peers.len()
    }

    pub fn stats(&self) -> RbStats {
        self.stats
    }

    /// Own messages broadcast so far (the next one's sequence number).
    pub fn sent(&self) -> u64 {
        self.next_seq
    }

    /// Own messages held for retransmission.
    pub fn held(&self) -> usize {
        self.history.len()
    }

    /// Sends `payload` to every node with the orderer's `stamp`; returns its
    /// sequence number. It is delivered here at once.
    pub fn broadcast(&mut self, stamp: u64, payload: Vec<u8>) -> Result<u64, GroupError> {
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(GroupError::TooLong { len: payload.len() });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.clock = self.clock.max(stamp);
        self.clock_sent = self.clock_sent.max(stamp);
        if self.peers.len() > 1 {
            let d = Datagram::Data {
                from: self.me,
                seq,
                stamp,
                payload: payload.clone(),
            };
            self.out.push_back(Transmit {
                dest: Dest::All,
                bytes: d.encode(),
            });
            self.history.push_back((stamp, payload.clone()));
        } else {
            self.history_base += 1;
        }
        let me = usize::from(self.me);
        self.peers[me].next = seq + 1;
        self.peers[me].sent = seq + 1;
        self.events.push_back(RbEvent::Delivered {
            sender: self.me,
            seq,
            stamp,
            payload,
        });
        Ok(seq)
    }

    /// The orderer's clock now: beats carry it, and [`Self::flush`] sends one
    /// if it has moved past what the last datagram carried.
    pub fn set_clock(&mut self, clock: u64) {
        self.clock = self.clock.max(clock);
    }

    /// One datagram from the network.
    pub fn on_datagram(&mut self, bytes: &[u8], now_ns: u64) {
        self.stats.received += 1;
        let Ok(d) = Datagram::decode(bytes) else {
            self.stats.malformed += 1;
            return;
        };
        self.on_decoded(d, now_ns);
    }

    /// One decoded datagram (the sequencer's baseline decodes first).
    pub fn on_decoded(&mut self, d: Datagram, now_ns: u64) {
        let from = d.from();
        if usize::from(from) >= self.peers.len() || from == self.me {
            self.stats.foreign += 1;
            return;
        }
        match d {
            Datagram::Data {
                seq,
                stamp,
                payload,
                ..
            } => self.on_data(from, seq, stamp, payload, now_ns),
            Datagram::Nack { sender, seqs, .. } if sender == self.me => self.on_nack(from, &seqs),
            Datagram::Beat {
                sent, clock, next, ..
            } if next.len() == self.peers.len() => self.on_beat(from, sent, clock, &next, now_ns),
            // A NACK for another sender, a beat of a different group size, a submit.
            _ => self.stats.malformed += 1,
        }
    }

    fn on_data(&mut self, from: NodeId, seq: u64, stamp: u64, payload: Vec<u8>, now_ns: u64) {
        let p = &mut self.peers[usize::from(from)];
        if seq < p.next || p.ahead.contains_key(&seq) {
            self.stats.duplicates += 1;
            return;
        }
        if seq - p.next > self.cfg.max_ahead {
            self.stats.overflow += 1;
            return;
        }
        p.sent = p.sent.max(seq + 1);
        if seq > p.next {
            p.ahead.insert(seq, (stamp, payload));
            // A new hole: ask at once, unless asked very recently.
            self.nack(from, now_ns, false);
            return;
        }
        self.deliver(from, seq, stamp, payload);
        loop {
            let p = &mut self.peers[usize::from(from)];
            let Some(e) = p.ahead.first_entry() else {
                break;
            };
            if *e.key() != p.next {
                break;
            }
            let (seq, (stamp, payload)) = e.remove_entry();
            self.deliver(from, seq, stamp, payload);
        }
        self.release_beat(from);
    }

    fn deliver(&mut self, sender: NodeId, seq: u64, stamp: u64, payload: Vec<u8>) {
        let p = &mut self.peers[usize::from(sender)];
        assert_eq!(
            seq, p.next,
            "β delivers sender {sender}'s messages in order"
        );
        p.next += 1;
        self.events.push_back(RbEvent::Delivered {
            sender,
            seq,
            stamp,
            payload,
        });
    }

    /// A beat waiting for messages now all delivered becomes `Stable`.
    fn release_beat(&mut self, from: NodeId) {
        let p = &mut self.peers[usize::from(from)];
        if let Some((sent, clock)) = p.beat
            && p.next >= sent
        {
            p.beat = None;
            self.events.push_back(RbEvent::Stable {
                sender: from,
                clock,
            });
        }
    }

    fn on_nack(&mut self, from: NodeId, seqs: &[u64]) {
        for &seq in seqs {
            let held = seq
                .checked_sub(self.history_base)
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| self.history.get(i));
            let Some((stamp, payload)) = held else {
                if seq < self.next_seq {
                    self.stats.unavailable += 1;
                }
                continue;
            };
            let d = Datagram::Data {
                from: self.me,
                seq,
                stamp: *stamp,
                payload: payload.clone(),
            };
            self.stats.retransmitted += 1;
            self.out.push_back(Transmit {
                dest: Dest::To(from),
                bytes: d.encode(),
            });
        }
    }

    fn on_beat(&mut self, from: NodeId, sent: u64, clock: u64, next: &[u64], now_ns: u64) {
        let me = usize::from(self.me);
        let p = &mut self.peers[usize::from(from)];
        p.acked = p.acked.max(next[me]);
        p.sent = p.sent.max(sent);
        // Keep the beat that covers the most; an older one says less.
        if p.beat.is_none_or(|(s, _)| s <= sent) {
            p.beat = Some((sent, clock));
        }
        let hole = p.next < p.sent;
        self.release_beat(from);
        if hole {
            self.nack(from, now_ns, false);
        }
        self.prune();
    }

    /// Drops own messages every node has acknowledged.
    fn prune(&mut self) {
        let me = usize::from(self.me);
        let low = self
            .peers
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != me)
            .map(|(_, p)| p.acked)
            .min()
            .unwrap_or(self.next_seq);
        while self.history_base < low && !self.history.is_empty() {
            self.history.pop_front();
            self.history_base += 1;
        }
    }

    /// Sends `sender` a NACK for its holes, unless one went out within the
    /// interval (`force`: the timer says it is due).
    fn nack(&mut self, sender: NodeId, now_ns: u64, force: bool) {
        let interval = self.cfg.nack_interval_ns;
        let p = &mut self.peers[usize::from(sender)];
        let recent = p
            .last_nack_ns
            .is_some_and(|t| now_ns.saturating_sub(t) < interval);
        if recent && !force {
            return;
        }
        let top = p
            .ahead
            .last_key_value()
            .map_or(p.sent, |(s, _)| p.sent.max(s + 1));
        let seqs: Vec<u64> = (p.next..top)
            .filter(|s| !p.ahead.contains_key(s))
            .take(MAX_NACK_SEQS)
            .collect();
        if seqs.is_empty() {
            return;
        }
        p.last_nack_ns = Some(now_ns);
        self.stats.nacks_sent += 1;
        self.out.push_back(Transmit {
            dest: Dest::To(sender),
            bytes: Datagram::Nack {
                from: self.me,
                sender,
                seqs,
            }
            .encode(),
        });
    }

    /// The timers: NACKs for holes still open, a beat when one is due.
    pub fn tick(&mut self, now_ns: u64) {
        for s in 0..self.peers.len() {
            let p = &self.peers[s];
            let due = p
                .last_nack_ns
                .is_none_or(|t| now_ns.saturating_sub(t) >= self.cfg.nack_interval_ns);
            if s != usize::from(self.me)
                && p.next
                    < p.sent
                        .max(p.ahead.last_key_value().map_or(0, |(s, _)| s + 1))
                && due
            {
                self.nack(s as NodeId, now_ns, true);
            }
        }
        let beat_due = self
            .last_beat_ns
            .is_none_or(|t| now_ns.saturating_sub(t) >= self.cfg.beat_interval_ns);
        if beat_due {
            self.beat(now_ns);
        }
    }

    /// Sends a beat now if the orderer's clock moved past what the last
    /// datagram carried (so the others can order without waiting for the timer).
    pub fn flush(&mut self, now_ns: u64) {
        if self.clock > self.clock_sent {
            self.beat(now_ns);
        }
    }

    fn beat(&mut self, now_ns: u64) {
        self.last_beat_ns = Some(now_ns);
        self.clock_sent = self.clock;
        if self.peers.len() < 2 {
            return;
        }
        let d = Datagram::Beat {
            from: self.me,
            sent: self.next_seq,
            clock: self.clock,
            next: self.peers.iter().map(|p| p.next).collect(),
        };
        self.out.push_back(Transmit {
            dest: Dest::All,
            bytes: d.encode(),
        });
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    /// The next delivery or stability notice.
    pub fn poll_event(&mut self) -> Option<RbEvent> {
        self.events.pop_front()
    }
}
