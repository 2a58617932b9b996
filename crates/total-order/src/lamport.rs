//! α, `LamportOrderer` (HYDRA §8.2.1; Lamport 1978): every message carries
//! its sender's Lamport timestamp, and the total order is (timestamp,
//! sender). A message is delivered once no node can still send one that
//! sorts before it: every other node has been heard from (a message, or a
//! beat whose messages have all arrived) with a timestamp at least as large.
//! Because β delivers each sender's messages in order and a node's stamps
//! only grow, that is enough — the reason Lamport's order needs all-to-all
//! traffic, and the latency the seed attributes to it.

use std::collections::{BTreeMap, VecDeque};

use crate::rb::{GroupError, check_group};
use crate::wire::NodeId;

/// A message's identity: its sender and the sender's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MsgId {
    pub sender: NodeId,
    pub seq: u64,
}

/// α on one node.
#[derive(Debug)]
pub struct LamportOrderer {
    me: NodeId,
    clock: u64,
    /// Per node: every message it will still send has a larger stamp.
    heard: Vec<u64>,
    /// Messages received but not yet ordered, by (stamp, sender).
    pending: BTreeMap<(u64, NodeId), u64>,
    order: VecDeque<MsgId>,
}

impl LamportOrderer {
    /// Node `me` of a group of `n`.
    pub fn new(me: usize, n: usize) -> Result<Self, GroupError> {
        check_group(me, n)?;
        Ok(LamportOrderer {
            me: me as NodeId,
            clock: 0,
            heard: vec![0; n],
            pending: BTreeMap::new(),
            order: VecDeque::new(),
        })
    }

    /// The clock now.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Messages waiting for their order.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The stamp of a message this node is about to broadcast.
    pub fn stamp(&mut self) -> u64 {
        self.clock += 1;
        self.heard[usize::from(self.me)] = self.clock;
        self.clock
    }

    /// β delivered message `seq` of `sender`, stamped `stamp` (own ones too).
    pub fn on_delivered(&mut self, sender: NodeId, seq: u64, stamp: u64) {
        let Some(h) = self.heard.get_mut(usize::from(sender)) else {
            return;
        };
        *h = (*h).max(stamp);
        self.clock = self.clock.max(stamp);
        self.pending.insert((stamp, sender), seq);
        self.release();
    }

    /// β says `sender` will stamp nothing more at or below `clock`.
    pub fn on_stable(&mut self, sender: NodeId, clock: u64) {
        let Some(h) = self.heard.get_mut(usize::from(sender)) else {
            return;
        };
        *h = (*h).max(clock);
        self.clock = self.clock.max(clock);
        self.release();
    }

    fn release(&mut self) {
        while let Some((&(stamp, sender), &seq)) = self.pending.first_key_value() {
            let me = usize::from(self.me);
            let safe = self
                .heard
                .iter()
                .enumerate()
                .all(|(j, &h)| j == me || j == usize::from(sender) || h >= stamp);
            if !safe {
                break;
            }
            self.pending.pop_first();
            self.order.push_back(MsgId { sender, seq });
        }
    }

    /// The next message in the total order.
    pub fn poll_order(&mut self) -> Option<MsgId> {
        self.order.pop_front()
    }
}
