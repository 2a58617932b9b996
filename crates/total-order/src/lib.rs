//! HYDRA's offloaded total order (seed 003 §8.2, digest §7.2), sans-IO.
//!
//! | piece | what it is |
//! |---|---|
//! | [`service::ToService`] | the TO service library: [`service::ToService::to_broadcast`], [`service::ToService::to_receive`], flow control |
//! | [`lamport::LamportOrderer`] | α: Lamport timestamps, delivery once every node has been heard past a message's stamp |
//! | [`rb::ReliableBroadcast`] | β: per-sender sequence numbers, NACKs for holes, beats for the tail and for pruning |
//! | [`node::ToNode`] | the three wired together on one node |
//! | [`sequencer::SeqNode`] | the baseline: a fixed sequencer, over the same β |
//! | [`wire`] | the datagrams, decoded strictly |
//!
//! No sockets and no clocks: datagrams and the time (`now_ns`) come in as
//! calls; datagrams to send come out of `poll_transmit` and messages in order
//! out of `to_receive`. The property tests drive groups of nodes through a
//! simulated network that loses, duplicates and reorders.

pub mod lamport;
pub mod node;
pub mod rb;
pub mod sequencer;
pub mod service;
pub mod wire;

pub use lamport::{LamportOrderer, MsgId};
pub use node::ToNode;
pub use rb::{Dest, GroupError, RbConfig, RbEvent, RbStats, ReliableBroadcast, Transmit};
pub use sequencer::SeqNode;
pub use service::{BroadcastError, DEFAULT_WINDOW, Delivery, ToService};
pub use wire::{Datagram, DecodeError, NodeId};
