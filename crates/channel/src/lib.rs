//! Channels between offcodes (HYDRA §4.2, §5.5): the transports sidecore moves
//! messages and calls over.
//!
//! | transport | module | use |
//! |---|---|---|
//! | shared-memory ring, one producer, 1..N consumers | [`ring`] | between cores in one daemon (unicast and multicast) |
//! | delivery policy (reliable / unreliable) | [`sender`] | back-pressure or counted drops |
//! | parallel work queue | [`parallel`] | the *parallel* order: each message to one of several workers |
//! | calls (PENDING → ACKED → FINISHED) | [`call`] | request/response on a channel |
//! | TCP stream | [`stream`] | to a peer node |
//! | out-of-band channel | [`oob`] | control and management events |
//!
//! The runtime picks the transport from the placement (HYDRA's channel
//! executive choosing a provider): rings when both ends are on this machine,
//! streams when one is on a peer node.

pub mod call;
pub mod oob;
pub mod parallel;
pub mod ring;
pub mod sender;
pub mod stream;

pub use ring::{
    BatchMut, BufferPool, Consumer, Producer, Recv, Ring, RingConfig, RingProbe, RingSnapshot,
    SlotMut, SlotRef,
};
pub use sender::{SendError, SendOutcome, Sender};
