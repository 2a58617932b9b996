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

    /// The stamp of this node's message `seq`, about to be broadcast. The
    /// message joins the pending ones at once: were it to wait for β to hand
    /// it back (across a channel, when α and β run apart), a later message of
    /// another node could be ordered before it although it sorts after.
    pub fn stamp(&mut self, seq: u64) -> u64 {
        self.clock += 1;
        let me = self.me;
        self.heard[usize::from(me)] = self.clock;
        self.pending.insert((self.clock, me), seq);
        let stamp = self.clock;
        self.release();
        stamp
    }

    /// β delivered message `seq` of `sender`, stamped `stamp`. Own messages
    /// are pending from [`Self::stamp`] on; β handing them back changes nothing.
    pub fn on_delivered(&mut self, sender: NodeId, seq: u64, stamp: u64) {
        if sender == self.me {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_own_message_is_pending_from_its_stamp_on() {
        // α and β apart: node 0's own message has not come back from β yet
        // when node 1's later message and everyone's progress arrive.
        let mut a = LamportOrderer::new(0, 3).unwrap();
        let t = a.stamp(0);
        a.on_delivered(1, 0, t + 1);
        a.on_stable(2, t + 5);
        assert_eq!(a.poll_order(), Some(MsgId { sender: 0, seq: 0 }));
        assert_eq!(a.poll_order(), Some(MsgId { sender: 1, seq: 0 }));
        // β hands the own message back later: nothing changes.
        a.on_delivered(0, 0, t);
        assert_eq!(a.poll_order(), None);
    }
}
