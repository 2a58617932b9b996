//! The three pieces on one node, wired as the seed's layout wires them: the
//! TO service hands each message to α, α stamps it and hands it to β, β
//! delivers payloads up to the service and (sender, seq, stamp) to α, α
//! hands the order to the service. [`ToNode`] runs all three in one place;
//! a driver that puts α beside β on another thread (or core) makes the same
//! calls across a channel.

use crate::lamport::{LamportOrderer, MsgId};
use crate::rb::{GroupError, RbConfig, RbEvent, RbStats, ReliableBroadcast, Transmit};
use crate::service::{BroadcastError, Delivery, ToService};

/// The TO service, α and β of one node.
#[derive(Debug)]
pub struct ToNode {
    pub service: ToService,
    pub orderer: LamportOrderer,
    pub rb: ReliableBroadcast,
    /// This node's next sequence number (β numbers its broadcasts the same way).
    next_seq: u64,
}

impl ToNode {
    /// Node `me` of a group of `n`.
    pub fn new(me: usize, n: usize, window: usize, cfg: RbConfig) -> Result<Self, GroupError> {
        Ok(ToNode {
            service: ToService::new(me, n, window)?,
            orderer: LamportOrderer::new(me, n)?,
            rb: ReliableBroadcast::new(me, n, cfg)?,
            next_seq: 0,
        })
    }

    /// `TO_Broadcast`.
    pub fn to_broadcast(&mut self, payload: Vec<u8>) -> Result<(), BroadcastError> {
        self.service.to_broadcast(payload)?;
        while let Some(p) = self.service.take_outgoing() {
            let stamp = self.orderer.stamp(self.next_seq);
            // The service checked the length already.
            match self.rb.broadcast(stamp, p) {
                Ok(seq) => assert_eq!(seq, self.next_seq, "α and β number alike"),
                Err(e) => unreachable!("the service let through a payload β refuses: {e}"),
            }
            self.next_seq += 1;
        }
        self.pump();
        Ok(())
    }

    /// `TO_Receive`: the next message in the total order.
    pub fn to_receive(&mut self) -> Option<Delivery> {
        self.service.to_receive()
    }

    /// A datagram from the network.
    pub fn on_datagram(&mut self, bytes: &[u8], now_ns: u64) {
        self.rb.on_datagram(bytes, now_ns);
        self.pump();
    }

    /// The timers.
    pub fn tick(&mut self, now_ns: u64) {
        self.rb.tick(now_ns);
        self.pump();
    }

    /// After a batch of datagrams: tell the others how far the clock moved.
    pub fn flush(&mut self, now_ns: u64) {
        self.rb.flush(now_ns);
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.rb.poll_transmit()
    }

    pub fn stats(&self) -> RbStats {
        self.rb.stats()
    }

    /// β's events to α and the service, α's order to the service.
    fn pump(&mut self) {
        while let Some(e) = self.rb.poll_event() {
            match e {
                RbEvent::Delivered {
                    sender,
                    seq,
                    stamp,
                    payload,
                } => {
                    self.service.on_payload(MsgId { sender, seq }, payload);
                    self.orderer.on_delivered(sender, seq, stamp);
                }
                RbEvent::Stable { sender, clock } => self.orderer.on_stable(sender, clock),
            }
        }
        while let Some(id) = self.orderer.poll_order() {
            self.service.on_order(id);
        }
        self.rb.set_clock(self.orderer.clock());
    }
}
