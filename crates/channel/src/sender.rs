//! Delivery policy on top of a ring producer (HYDRA §4.2.2): a *reliable* channel
//! never drops, it pushes back on the sender; an *unreliable* channel drops when
//! the ring is full and counts the drop.
//!
//! Back-pressure is non-blocking by default (`try_send*` returns
//! [`SendOutcome::Full`]) because offcodes on run-to-completion cores must never
//! block inside a handler: the executor retries them later. Application threads
//! that may block use the `send_blocking*` forms, which wait with a bounded
//! spin-then-yield backoff and give up at a deadline.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_utils::Backoff;
use sidecore_types::Delivery;

use crate::ring::{MessageTooLarge, Producer, RingStats};

/// What happened to a message handed to a sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// Written into the ring (visible to receivers after the next publish).
    Sent,
    /// Unreliable channel, ring full: the message was dropped and counted.
    Dropped,
    /// Reliable channel, ring full: nothing was sent; try again later.
    Full,
}

/// Why a send failed outright.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    TooLarge(#[from] MessageTooLarge),
    #[error("every receiver of the channel has gone away")]
    Disconnected,
    #[error("reliable channel still full at the deadline")]
    Timeout,
}

/// A ring producer with a delivery policy.
pub struct Sender {
    producer: Producer,
    delivery: Delivery,
}

impl Sender {
    /// Wraps a producer.
    pub fn new(producer: Producer, delivery: Delivery) -> Self {
        Sender { producer, delivery }
    }

    /// The channel's delivery policy.
    pub fn delivery(&self) -> Delivery {
        self.delivery
    }

    /// Largest message one slot carries.
    pub fn payload_capacity(&self) -> usize {
        self.producer.payload_capacity()
    }

    /// Shared counters (published, dropped, full waits).
    pub fn stats(&self) -> &RingStats {
        self.producer.stats()
    }

    /// Free slots as far as the sender knows.
    pub fn free_slots(&mut self) -> u64 {
        self.producer.free_slots()
    }

    /// Messages published so far.
    pub fn published(&self) -> u64 {
        self.producer.published()
    }

    /// True when every receiver has gone away.
    pub fn is_disconnected(&self) -> bool {
        self.producer.is_disconnected()
    }

    /// Free slots, the consumers' heads reloaded if fewer than `want` seem free.
    pub fn free_slots_at_least(&mut self, want: u64) -> u64 {
        self.producer.free_slots_at_least(want)
    }

    /// The underlying producer, for callers that manage slots themselves.
    pub fn producer(&mut self) -> &mut Producer {
        &mut self.producer
    }

    /// Makes committed messages visible.
    pub fn publish(&mut self) {
        self.producer.publish();
    }

    /// Writes a message in place: `fill` receives the slot and returns the
    /// number of bytes it wrote. Never blocks.
    #[inline]
    pub fn try_send_with(
        &mut self,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<SendOutcome, SendError> {
        if self.producer.is_disconnected() {
            return Err(SendError::Disconnected);
        }
        match self.producer.try_reserve() {
            Some(mut slot) => {
                let cap = slot.len();
                let len = fill(&mut slot);
                if len > cap {
                    return Err(SendError::TooLarge(MessageTooLarge { len, capacity: cap }));
                }
                slot.commit(len);
                Ok(SendOutcome::Sent)
            }
            None => Ok(self.full()),
        }
    }

    /// Copies `msg` into the next slot. Never blocks.
    #[inline]
    pub fn try_send(&mut self, msg: &[u8]) -> Result<SendOutcome, SendError> {
        if msg.len() > self.producer.payload_capacity() {
            return Err(SendError::TooLarge(MessageTooLarge {
                len: msg.len(),
                capacity: self.producer.payload_capacity(),
            }));
        }
        self.try_send_with(|slot| {
            slot[..msg.len()].copy_from_slice(msg);
            msg.len()
        })
    }

    /// Sends `msg`, waiting for space on a reliable channel until `deadline`
    /// (or for ever when `None`). An unreliable channel never waits.
    pub fn send_blocking(
        &mut self,
        msg: &[u8],
        deadline: Option<Instant>,
    ) -> Result<SendOutcome, SendError> {
        let backoff = Backoff::new();
        let mut counted = false;
        loop {
            match self.try_send(msg)? {
                SendOutcome::Full => {
                    if !counted {
                        self.producer
                            .stats()
                            .full_waits
                            .fetch_add(1, Ordering::Relaxed);
                        counted = true;
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(SendError::Timeout);
                    }
                    backoff.snooze();
                    if backoff.is_completed() {
                        std::thread::yield_now();
                    }
                }
                done => return Ok(done),
            }
        }
    }

    fn full(&mut self) -> SendOutcome {
        match self.delivery {
            Delivery::Reliable => SendOutcome::Full,
            Delivery::Unreliable => {
                self.producer
                    .stats()
                    .dropped
                    .fetch_add(1, Ordering::Relaxed);
                SendOutcome::Dropped
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Ring, RingConfig};

    fn sender(delivery: Delivery) -> (Sender, Vec<crate::ring::Consumer>) {
        let (p, c) = Ring::create(RingConfig {
            slots: 2,
            ..RingConfig::default()
        })
        .unwrap();
        (Sender::new(p, delivery), c)
    }

    #[test]
    fn unreliable_drops_and_counts_when_full() {
        let (mut s, _c) = sender(Delivery::Unreliable);
        assert_eq!(s.try_send(b"a").unwrap(), SendOutcome::Sent);
        assert_eq!(s.try_send(b"b").unwrap(), SendOutcome::Sent);
        assert_eq!(s.try_send(b"c").unwrap(), SendOutcome::Dropped);
        assert_eq!(s.try_send(b"d").unwrap(), SendOutcome::Dropped);
        assert_eq!(s.stats().dropped.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn reliable_pushes_back_and_never_drops() {
        let (mut s, _c) = sender(Delivery::Reliable);
        s.try_send(b"a").unwrap();
        s.try_send(b"b").unwrap();
        assert_eq!(s.try_send(b"c").unwrap(), SendOutcome::Full);
        assert_eq!(s.stats().dropped.load(Ordering::Relaxed), 0);
        let deadline = Some(Instant::now() + std::time::Duration::from_millis(20));
        assert_eq!(s.send_blocking(b"c", deadline), Err(SendError::Timeout));
        assert_eq!(s.stats().full_waits.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn sending_to_nobody_is_an_error() {
        let (mut s, c) = sender(Delivery::Reliable);
        drop(c);
        assert_eq!(s.try_send(b"a"), Err(SendError::Disconnected));
    }

    #[test]
    fn fill_reporting_too_much_is_an_error() {
        let (mut s, _c) = sender(Delivery::Reliable);
        let e = s.try_send_with(|slot| slot.len() + 1).unwrap_err();
        assert!(matches!(e, SendError::TooLarge(_)));
    }
}
