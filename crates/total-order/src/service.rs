//! The TO service (HYDRA §8.2.1): the application's library. `to_broadcast`
//! hands a message to the orderer, with flow control (at most `window` of
//! this node's messages broadcast and not yet received back in order);
//! `to_receive` returns the next message in the total order. Payloads and
//! the order arrive separately, as in the seed: β hands each payload up as
//! soon as it arrives (to free the NIC's memory), α later says in which
//! order they go (through a call); a message is delivered when both are here.

use std::collections::{HashMap, VecDeque};

use crate::lamport::MsgId;
use crate::rb::{GroupError, check_group};
use crate::wire::{MAX_PAYLOAD_BYTES, NodeId};

/// Default flow-control window: own messages in flight.
pub const DEFAULT_WINDOW: usize = 64;

/// A message in the total order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: MsgId,
    pub payload: Vec<u8>,
}

/// Why `to_broadcast` refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BroadcastError {
    #[error("{0} of this node's messages are in flight (the window); receive first")]
    WindowFull(usize),
    #[error("a payload of {0} bytes (at most {MAX_PAYLOAD_BYTES})")]
    TooLong(usize),
}

/// The TO service on one node.
#[derive(Debug)]
pub struct ToService {
    me: NodeId,
    window: usize,
    in_flight: usize,
    outbox: VecDeque<Vec<u8>>,
    payloads: HashMap<MsgId, Vec<u8>>,
    order: VecDeque<MsgId>,
    delivered: u64,
}

impl ToService {
    /// Node `me` of a group of `n`, with `window` own messages in flight at most.
    pub fn new(me: usize, n: usize, window: usize) -> Result<Self, GroupError> {
        check_group(me, n)?;
        if window == 0 {
            return Err(GroupError::Zero { field: "window" });
        }
        Ok(ToService {
            me: me as NodeId,
            window,
            in_flight: 0,
            outbox: VecDeque::new(),
            payloads: HashMap::new(),
            order: VecDeque::new(),
            delivered: 0,
        })
    }

    /// Broadcasts `payload` in the total order.
    pub fn to_broadcast(&mut self, payload: Vec<u8>) -> Result<(), BroadcastError> {
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(BroadcastError::TooLong(payload.len()));
        }
        if self.in_flight >= self.window {
            return Err(BroadcastError::WindowFull(self.in_flight));
        }
        self.in_flight += 1;
        self.outbox.push_back(payload);
        Ok(())
    }

    /// Whether `to_broadcast` would take a message now.
    pub fn can_broadcast(&self) -> bool {
        self.in_flight < self.window
    }

    /// The next message for the orderer.
    pub fn take_outgoing(&mut self) -> Option<Vec<u8>> {
        self.outbox.pop_front()
    }

    /// A payload from β (not yet deliverable).
    pub fn on_payload(&mut self, id: MsgId, payload: Vec<u8>) {
        self.payloads.insert(id, payload);
    }

    /// The next message in the order, from α.
    pub fn on_order(&mut self, id: MsgId) {
        self.order.push_back(id);
    }

    /// The next message in the total order, if its payload is here.
    pub fn to_receive(&mut self) -> Option<Delivery> {
        let id = *self.order.front()?;
        let payload = self.payloads.remove(&id)?;
        self.order.pop_front();
        if id.sender == self.me {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        self.delivered += 1;
        Some(Delivery { id, payload })
    }

    /// Messages delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }
}
