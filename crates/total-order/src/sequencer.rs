//! The baseline: total order by a fixed sequencer (node 0), in plain user
//! space. A node sends its message to the sequencer (`Submit`, retried until
//! it comes back ordered); the sequencer numbers the messages in the order it
//! accepts them and sends them to everyone through the same reliable
//! broadcast β, whose single sender's order is then the total order. One
//! hop to the sequencer and one out: the centralised round the seed says
//! Lamport's algorithm cannot match in latency.

use std::collections::VecDeque;

use crate::lamport::MsgId;
use crate::rb::{Dest, GroupError, RbConfig, RbEvent, RbStats, ReliableBroadcast, Transmit};
use crate::service::{BroadcastError, Delivery};
use crate::wire::{Datagram, MAX_PAYLOAD_BYTES, NodeId};

/// The sequencer's index.
pub const SEQUENCER: NodeId = 0;
/// Bytes the sequencer adds to a payload: origin (u16) and its id (u64).
pub const ORIGIN_BYTES: usize = 10;
/// Largest payload through the sequencer.
pub const MAX_SEQ_PAYLOAD_BYTES: usize = MAX_PAYLOAD_BYTES - ORIGIN_BYTES;

/// One node of the fixed-sequencer total order.
#[derive(Debug)]
pub struct SeqNode {
    me: NodeId,
    window: usize,
    retry_ns: u64,
    rb: ReliableBroadcast,
    next_id: u64,
    /// Own messages not yet back in order: (id, payload, last sent).
    unordered: VecDeque<(u64, Vec<u8>, u64)>,
    /// At the sequencer: the next id it takes from each node.
    expect: Vec<u64>,
    out: VecDeque<Transmit>,
    delivered: VecDeque<Delivery>,
    /// Submits out of turn, or ordered payloads too short to carry an origin.
    pub refused: u64,
}

impl SeqNode {
    /// Node `me` of `n`; own messages are submitted again after `retry_ns`.
    pub fn new(me: usize, n: usize, window: usize, cfg: RbConfig) -> Result<Self, GroupError> {
        if window == 0 {
            return Err(GroupError::Zero { field: "window" });
        }
        Ok(SeqNode {
            me: me as NodeId,
            window,
            retry_ns: cfg.nack_interval_ns,
            rb: ReliableBroadcast::new(me, n, cfg)?,
            next_id: 0,
            unordered: VecDeque::new(),
            expect: vec![0; n],
            out: VecDeque::new(),
            delivered: VecDeque::new(),
            refused: 0,
        })
    }

    /// `TO_Broadcast`.
    pub fn to_broadcast(&mut self, payload: Vec<u8>, now_ns: u64) -> Result<(), BroadcastError> {
        if payload.len() > MAX_SEQ_PAYLOAD_BYTES {
            return Err(BroadcastError::TooLong(payload.len()));
        }
        if self.unordered.len() >= self.window {
            return Err(BroadcastError::WindowFull(self.unordered.len()));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.unordered.push_back((id, payload.clone(), now_ns));
        self.submit(self.me, id, payload, now_ns);
        self.pump();
        Ok(())
    }

    /// Whether `to_broadcast` would take a message now.
    pub fn can_broadcast(&self) -> bool {
        self.unordered.len() < self.window
    }

    fn submit(&mut self, from: NodeId, id: u64, payload: Vec<u8>, now_ns: u64) {
        if self.me == SEQUENCER {
            self.sequence(from, id, payload);
            return;
        }
        let _ = now_ns;
        self.out.push_back(Transmit {
            dest: Dest::To(SEQUENCER),
            bytes: Datagram::Submit { from, id, payload }.encode(),
        });
    }

    /// At the sequencer: order `id` of `from` if it is the next one from it.
    fn sequence(&mut self, from: NodeId, id: u64, payload: Vec<u8>) {
        let Some(e) = self.expect.get_mut(usize::from(from)) else {
            self.refused += 1;
            return;
        };
        if id != *e {
            // A retry of one already ordered, or one past a lost submit
            // (the sender retries in order).
            self.refused += 1;
            return;
        }
        *e += 1;
        let mut p = Vec::with_capacity(ORIGIN_BYTES + payload.len());
        p.extend_from_slice(&from.to_le_bytes());
        p.extend_from_slice(&id.to_le_bytes());
        p.extend_from_slice(&payload);
        if let Err(e) = self.rb.broadcast(0, p) {
            unreachable!("a submit the decoder let through is too long: {e}");
        }
    }

    /// A datagram from the network.
    pub fn on_datagram(&mut self, bytes: &[u8], now_ns: u64) {
        match Datagram::decode(bytes) {
            Ok(Datagram::Submit { from, id, payload }) if self.me == SEQUENCER => {
                if payload.len() > MAX_SEQ_PAYLOAD_BYTES {
                    self.refused += 1;
                } else {
                    self.sequence(from, id, payload);
                }
            }
            Ok(Datagram::Submit { .. }) => self.refused += 1,
            Ok(d) => self.rb.on_decoded(d, now_ns),
            Err(_) => self.rb.on_datagram(bytes, now_ns),
        }
        self.pump();
    }

    /// The timers: β's, and own messages submitted again when overdue.
    pub fn tick(&mut self, now_ns: u64) {
        self.rb.tick(now_ns);
        if self.me != SEQUENCER {
            let retry = self.retry_ns;
            let mut again = Vec::new();
            for (id, p, at) in &mut self.unordered {
                if now_ns.saturating_sub(*at) >= retry {
                    *at = now_ns;
                    again.push((*id, p.clone()));
                }
            }
            for (id, p) in again {
                self.submit(self.me, id, p, now_ns);
            }
        }
        self.pump();
    }

    fn pump(&mut self) {
        while let Some(e) = self.rb.poll_event() {
            let RbEvent::Delivered {
                sender, payload, ..
            } = e
            else {
                continue;
            };
            if sender != SEQUENCER || payload.len() < ORIGIN_BYTES {
                self.refused += 1;
                continue;
            }
            let origin = u16::from_le_bytes([payload[0], payload[1]]);
            let mut idb = [0u8; 8];
            idb.copy_from_slice(&payload[2..ORIGIN_BYTES]);
            let id = u64::from_le_bytes(idb);
            if origin == self.me && self.unordered.front().is_some_and(|(i, _, _)| *i == id) {
                self.unordered.pop_front();
            }
            self.delivered.push_back(Delivery {
                id: MsgId {
                    sender: origin,
                    seq: id,
                },
                payload: payload[ORIGIN_BYTES..].to_vec(),
            });
        }
    }

    /// `TO_Receive`.
    pub fn to_receive(&mut self) -> Option<Delivery> {
        self.delivered.pop_front()
    }

    /// The next datagram to send (the sequencer's own β first).
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front().or_else(|| self.rb.poll_transmit())
    }

    pub fn stats(&self) -> RbStats {
        self.rb.stats()
    }
}
