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
//! A channel between two peers goes straight from one to the other: the
//! origin asks the receiving peer for its part first, and gives the sending
//! peer the address the receiver listens on ([`origin::delegate`]); channels
//! running both ways between peers (a cycle) are refused.
//!
//! Not yet: channels that fan out (multicast or parallel receivers) across
//! machines; refused with an error naming the channel.

use std::time::Duration;

use std::net::IpAddr;

use sidecore_channel::stream::{StreamError, StreamListener, StreamSender};
use sidecore_types::Delivery;

use crate::transport::{Attachment, StreamEnd};

pub mod origin;
pub mod peer;

/// How often a peer reports its part's status.
pub const STATUS_EVERY: Duration = Duration::from_millis(100);
/// How long either side waits for the other at each step of the exchange.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a stream channel between the origin and a peer could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ChannelSetupError {
    #[error("channel `{channel}`: cannot listen: {source}")]
    Listen {
        channel: String,
        #[source]
        source: std::io::Error,
    },
    #[error("channel `{channel}`: {source}")]
    Stream {
        channel: String,
        #[source]
        source: StreamError,
    },
    #[error("the peer does not listen for channel `{0}`")]
    NotListening(String),
}

/// A listener for stream channel `channel` on this side's address `here`,
/// and the address to give the other side.
fn listen(here: IpAddr, channel: &str) -> Result<(StreamListener, String), ChannelSetupError> {
    let fail = |source| ChannelSetupError::Listen {
        channel: channel.to_string(),
        source,
    };
    let l = StreamListener::bind((here, 0)).map_err(fail)?;
    let addr = l.local_addr().map_err(fail)?.to_string();
    Ok((l, addr))
}

/// Accepts the stream channel `name` on `l` and attaches it to input
/// `(offcode, port)`.
fn accept_end(
    l: &StreamListener,
    name: &str,
    (offcode, port): (usize, usize),
) -> Result<Attachment, ChannelSetupError> {
    let fail = |source| ChannelSetupError::Stream {
        channel: name.to_string(),
        source,
    };
    let receiver = l.accept(STEP_TIMEOUT).map_err(fail)?;
    receiver.expect_channel(name).map_err(fail)?;
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
) -> Result<Attachment, ChannelSetupError> {
    let sender = StreamSender::connect(addr, name, delivery, STEP_TIMEOUT).map_err(|source| {
        ChannelSetupError::Stream {
            channel: name.to_string(),
            source,
        }
    })?;
    Ok(Attachment {
        channel: name.to_string(),
        offcode,
        end: StreamEnd::Send { port, sender },
    })
}
