//! Transports: how a channel's messages travel (HYDRA's channel executive
//! choosing a provider), chosen in one place ([`Transport::choose`]) and built
//! in one place ([`build`]).
//!
//! * [`Transport::Ring`] — a shared-memory ring in this daemon (unicast, or
//!   multicast to every receiver).
//! * [`Transport::WorkQueue`] — a shared-memory work queue: each message to
//!   exactly one of the receivers (a parallel channel).
//! * [`Transport::Stream`] — a TCP stream to or from a peer node; its ends are
//!   connected by the node protocol ([`crate::node`]) and handed to the start
//!   stage as [`Attachment`]s.

use serde::Serialize;
use sidecore_channel::parallel::work_queue;
use sidecore_channel::stream::{StreamReceiver, StreamSender};
use sidecore_channel::{Ring, RingConfig, RingProbe, Sender as RingSender};
use sidecore_offcode::{Inlet, Outlet};
use sidecore_types::{ChannelProps, Order};

use crate::error::DeployError;

/// Commits after which a ring's producer publishes on its own, and slots a
/// consumer reads before handing them back: one cache-line exchange per this
/// many messages when traffic is heavy.
pub const RING_BATCH: usize = 32;

/// How a channel's messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// Shared-memory ring (unicast or multicast) in this daemon.
    Ring,
    /// Shared-memory work queue: each message to one receiver.
    WorkQueue,
    /// TCP stream to a peer node.
    Stream,
}

impl Transport {
    /// The transport for a channel whose ends landed as given: a stream when
    /// an end is on another machine (`crosses_machines`), otherwise a work
    /// queue for a parallel channel and a ring for the rest.
    pub fn choose(props: &ChannelProps, crosses_machines: bool) -> Transport {
        if crosses_machines {
            Transport::Stream
        } else if props.order == Order::Parallel {
            Transport::WorkQueue
        } else {
            Transport::Ring
        }
    }
}

/// The local ends of one channel: the sender's outlet and one inlet per
/// receiver, in the channel's receiver order.
pub struct Ends {
    pub outlet: Outlet,
    pub inlets: Vec<Inlet>,
    /// The ring's counters for observers (`None` for a work queue).
    pub probe: Option<RingProbe>,
}

/// Builds a local channel (`Ring` or `WorkQueue`) with `receivers` receiving
/// ends. Streams are not built here: the node protocol connects them.
pub fn build(
    channel: &str,
    transport: Transport,
    props: &ChannelProps,
    receivers: usize,
) -> Result<Ends, DeployError> {
    let fail = |error: String| DeployError::Channel {
        channel: channel.to_string(),
        error,
    };
    let (slots, slot_size) = (props.slots as usize, props.slot_size as usize);
    match transport {
        Transport::Ring => {
            let (p, cs) = Ring::create(RingConfig {
                slots,
                slot_size,
                consumers: receivers,
                publish_batch: RING_BATCH,
                release_batch: RING_BATCH,
            })
            .map_err(|e| fail(e.to_string()))?;
            Ok(Ends {
                probe: Some(p.probe()),
                outlet: Outlet::Ring(RingSender::new(p, props.delivery)),
                inlets: cs.into_iter().map(Inlet::Ring).collect(),
            })
        }
        Transport::WorkQueue => {
            let (p, c) = work_queue(slots, slot_size).map_err(|e| fail(e.to_string()))?;
            Ok(Ends {
                outlet: Outlet::Parallel(p, props.delivery, 0),
                inlets: (0..receivers).map(|_| Inlet::Parallel(c.clone())).collect(),
                probe: None,
            })
        }
        Transport::Stream => Err(fail(
            "a stream channel is connected by the node protocol, not built locally".into(),
        )),
    }
}

/// A stream end already connected, to attach to one port of a local offcode.
pub struct Attachment {
    pub channel: String,
    /// Index of the offcode in the plan.
    pub offcode: usize,
    pub end: StreamEnd,
}

/// Which end of a stream channel an [`Attachment`] is.
pub enum StreamEnd {
    Send {
        port: usize,
        sender: StreamSender,
    },
    Recv {
        port: usize,
        receiver: StreamReceiver,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transport_follows_where_the_ends_are_and_the_order() {
        let seq = ChannelProps::default();
        let par = ChannelProps {
            order: Order::Parallel,
            ..seq
        };
        assert_eq!(Transport::choose(&seq, false), Transport::Ring);
        assert_eq!(Transport::choose(&par, false), Transport::WorkQueue);
        assert_eq!(Transport::choose(&seq, true), Transport::Stream);
        assert_eq!(Transport::choose(&par, true), Transport::Stream);
    }

    #[test]
    fn built_channels_have_an_end_per_receiver_and_bad_sizes_name_the_channel() {
        let ends = build("c", Transport::Ring, &ChannelProps::default(), 3).unwrap();
        assert_eq!(ends.inlets.len(), 3);
        let bad = ChannelProps {
            slots: 3,
            ..ChannelProps::default()
        };
        let Err(e) = build("odd", Transport::Ring, &bad, 1) else {
            panic!("3 slots must be refused")
        };
        assert!(e.to_string().starts_with("channel `odd`: "), "{e}");
        let Err(e) = build("s", Transport::Stream, &ChannelProps::default(), 1) else {
            panic!("streams are not built locally")
        };
        assert!(e.to_string().contains("node protocol"), "{e}");
    }
}
