//! Offcodes on peer nodes (HYDRA's remote PEs), over the node protocol of
//! `sidecore-wire`.
//!
//! The origin hands the part of a plan that the layout put on a peer to that
//! peer's daemon ([`origin`]); the peer deploys the part in its own runtime and
//! runs it like any app ([`peer`]). Channels that cross machines become TCP
//! stream channels (`sidecore_channel::stream`), the receiving side listening
//! and the sending side connecting. The node connection is the lease: when it
//! closes (the origin stopped the app, or died) the peer tears its part down;
//! when the peer goes away the origin marks the part's offcodes failed.
//!
//! Not yet: channels between two different peers, and channels that fan out
//! (multicast or parallel receivers) across machines; both are refused with an
//! error naming the channel.

use std::time::Duration;

use sidecore_channel::stream::{StreamListener, StreamSender};
use sidecore_types::Delivery;

use crate::transport::{Attachment, StreamEnd};

pub mod origin;
pub mod peer;

/// How often a peer reports its part's status.
pub const STATUS_EVERY: Duration = Duration::from_millis(100);
/// How long either side waits for the other at each step of the exchange.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts the stream channel `name` on `l` and attaches it to input
/// `(offcode, port)`.
fn accept_end(
    l: &StreamListener,
    name: &str,
    (offcode, port): (usize, usize),
) -> Result<Attachment, String> {
    let receiver = l
        .accept(STEP_TIMEOUT)
        .map_err(|e| format!("channel `{name}`: {e}"))?;
    receiver.expect_channel(name).map_err(|e| e.to_string())?;
    Ok(Attachment {
        channel: name.to_string(),
        offcode,
        end: StreamEnd::Recv { port, receiver },
    })
}

/// Opens the stream channel `name` to `addr` and attaches it to output
/// `(offcode, port)`.
fn connect_end(
    addr: &str,
    name: &str,
    delivery: Delivery,
    (offcode, port): (usize, usize),
) -> Result<Attachment, String> {
    let sender = StreamSender::connect(addr, name, delivery, STEP_TIMEOUT)
        .map_err(|e| format!("channel `{name}`: {e}"))?;
    Ok(Attachment {
        channel: name.to_string(),
        offcode,
        end: StreamEnd::Send { port, sender },
    })
}
