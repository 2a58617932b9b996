//! HYDRA's offloaded total order (seed 003 §8.2) on a network of
//! namespaces. The state machines are in `sidecore-total-order` (sans-IO);
//! this crate gives them sockets and threads and measures them.
//!
//! * [`bed`] — a full mesh of namespaces (one veth pair per pair of nodes)
//!   with loss injected on every egress: tc netem where the kernel has it,
//!   otherwise an nftables `numgen random` drop rule.
//! * [`drive`] — one node's threads: the application with the TO service,
//!   and the "NIC" thread that owns the socket and runs β — with α beside
//!   it (the offloaded orderer) or beside the application (the host orderer);
//!   the fixed sequencer in plain user space, one thread per node.
//! * [`etcd`] — the baseline a user would pick today: etcd's Raft log as the
//!   sequencer, a put per broadcast, a watch per node.
//! * [`offcodes`] — `reliable-broadcast` (β), `lamport-orderer` (α) and
//!   `to-service` for manifests: the layout puts α beside β or beside the
//!   TO service.
//! * [`deployed`] — the same offcodes deployed by the product: one
//!   `sidecore up` of the example manifest per node.
//! * [`run`] — a measured run: every node's sequence checked (same order, no
//!   gap, no duplicate), throughput and broadcast-to-deliver latency.

pub mod bed;
pub mod deployed;
pub mod drive;
pub mod etcd;
pub mod offcodes;
pub mod run;

pub use bed::{Bed, BedError, LossMethod};
pub use deployed::Deploy;
pub use run::{Measured, RunError, RunOptions, Variant, run};
