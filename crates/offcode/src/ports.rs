//! Ports: the offcode's ends of its channels. An [`Outlet`] sends, an [`Inlet`]
//! receives; each wraps whichever transport the runtime chose for the channel
//! (a ring between cores, a parallel work queue, a TCP stream to a peer node).
//! Enums rather than trait objects keep the per-message path free of dynamic
//! dispatch.

use sidecore_channel::parallel::{WorkConsumer, WorkProducer};
use sidecore_channel::ring::Recv;
use sidecore_channel::stream::{StreamError, StreamReceiver, StreamSender};
use sidecore_channel::{Consumer, SendOutcome, Sender};
use sidecore_types::Delivery;

use crate::OffcodeError;

/// Largest message a stream outlet takes: the room a message is given at the
/// end of the stream's send buffer, where it is written in place.
pub const STREAM_MESSAGE_BYTES: usize = 2048;

/// Below this many free slots (as the sender last saw them), [`Outlet::free`]
/// reads the receivers' positions again: enough for a provider's two replies
/// per call and for a burst of useful size, without a shared-line read per
/// turn when the ring is roomy.
pub const FRESH_BELOW: u64 = 64;

/// The sending end of a channel.
pub enum Outlet {
    /// Shared-memory ring (unicast or multicast) with its delivery policy.
    Ring(Sender),
    /// Parallel work queue; each message goes to one worker.
    Parallel(WorkProducer, Delivery, u64),
    /// TCP stream to a peer node.
    Stream(StreamSender),
    /// Declared but not connected: messages are discarded and counted.
    Unconnected(u64),
}

impl Outlet {
    /// Writes one message in place; `fill` returns its length.
    #[inline]
    pub fn send_with(
        &mut self,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<SendOutcome, OffcodeError> {
        match self {
            Outlet::Ring(s) => Ok(s.try_send_with(fill)?),
            Outlet::Parallel(p, delivery, dropped) => match p.try_send_with(fill) {
                Ok(true) => Ok(SendOutcome::Sent),
                Ok(false) if *delivery == Delivery::Unreliable => {
                    *dropped += 1;
                    Ok(SendOutcome::Dropped)
                }
                Ok(false) => Ok(SendOutcome::Full),
                Err(e) => Err(OffcodeError::Send(e.into())),
            },
            // Written in place at the end of the stream's send buffer.
            Outlet::Stream(s) => s
                .send_with(STREAM_MESSAGE_BYTES, fill)
                .map_err(|e| OffcodeError::Channel(e.to_string())),
            Outlet::Unconnected(n) => {
                *n += 1;
                Ok(SendOutcome::Dropped)
            }
        }
    }

    /// Makes sent messages visible to receivers (batched publication).
    #[inline]
    pub fn publish(&mut self) -> Result<(), OffcodeError> {
        match self {
            Outlet::Ring(s) => {
                s.publish();
                Ok(())
            }
            Outlet::Stream(s) => s
                .publish()
                .map_err(|e| OffcodeError::Channel(e.to_string())),
            Outlet::Parallel(..) | Outlet::Unconnected(_) => Ok(()),
        }
    }

    /// Free space (messages), for back-pressure decisions once a turn: exact
    /// whenever fewer than [`FRESH_BELOW`] slots seem free.
    pub fn free(&mut self) -> u64 {
        match self {
            // Every receiver gone: nothing will ever free a slot, and a send
            // fails at once, so nothing need wait for room.
            Outlet::Ring(s) if s.is_disconnected() => u64::MAX,
            Outlet::Ring(s) => s.free_slots_at_least(FRESH_BELOW),
            // Lost: nothing goes until it is rewired or given up.
            Outlet::Stream(s) if s.is_lost() => 0,
            _ => u64::MAX,
        }
    }

    /// Largest message accepted.
    pub fn capacity(&self) -> usize {
        match self {
            Outlet::Ring(s) => s.payload_capacity(),
            Outlet::Parallel(p, ..) => p.payload_capacity(),
            Outlet::Stream(_) => STREAM_MESSAGE_BYTES,
            Outlet::Unconnected(_) => usize::MAX,
        }
    }

    /// (sent, dropped) counters.
    pub fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        match self {
            Outlet::Ring(s) => (s.published(), s.stats().dropped.load(Relaxed)),
            Outlet::Parallel(_, _, d) => (0, *d),
            Outlet::Stream(s) => s.counts(),
            Outlet::Unconnected(n) => (0, *n),
        }
    }
}

/// What draining an inlet found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drained {
    /// Messages handled.
    pub messages: usize,
    /// The sender has gone and everything is read.
    pub closed: bool,
}

/// The receiving end of a channel.
pub enum Inlet {
    Ring(Consumer),
    Parallel(WorkConsumer),
    Stream(StreamReceiver),
    /// Declared but not connected: never delivers, counts as closed.
    Unconnected,
}

impl Inlet {
    /// Whether a message (or the sender's close) may be waiting: exact for a
    /// ring, `true` for transports that cannot tell without reading.
    pub fn may_have_input(&self) -> bool {
        match self {
            Inlet::Ring(c) => c.available() > 0 || c.is_producer_closed(),
            Inlet::Parallel(_) | Inlet::Stream(_) => true,
            Inlet::Unconnected => false,
        }
    }

    /// Hands up to `max` messages to `f`, each read in place.
    #[inline]
    pub fn drain(
        &mut self,
        max: usize,
        mut f: impl FnMut(&[u8]) -> Result<(), OffcodeError>,
    ) -> Result<Drained, OffcodeError> {
        let mut d = Drained::default();
        match self {
            Inlet::Ring(c) => {
                let mut err = None;
                while d.messages < max && err.is_none() {
                    let r = c.recv_batch(max - d.messages, |m| match f(m) {
                        Ok(()) => true,
                        Err(e) => {
                            err = Some(e);
                            false
                        }
                    });
                    match r {
                        Ok(n) => d.messages += n,
                        Err(Recv::Empty) => break,
                        Err(Recv::Closed) => {
                            d.closed = true;
                            break;
                        }
                    }
                }
                if let Some(e) = err {
                    return Err(e);
                }
                if d.messages < max {
                    c.release();
                }
            }
            Inlet::Parallel(c) => {
                while d.messages < max {
                    match c.try_claim() {
                        Ok(m) => {
                            d.messages += 1;
                            f(&m)?;
                        }
                        Err(closed) => {
                            d.closed = closed;
                            break;
                        }
                    }
                }
            }
            Inlet::Stream(r) => {
                while d.messages < max {
                    match r.try_recv() {
                        Ok(Some(m)) => {
                            d.messages += 1;
                            f(m)?;
                        }
                        Ok(None) => break,
                        Err(StreamError::Closed { .. }) => {
                            d.closed = true;
                            break;
                        }
                        Err(e) => return Err(OffcodeError::Channel(e.to_string())),
                    }
                }
            }
            Inlet::Unconnected => d.closed = true,
        }
        Ok(d)
    }
}
