//! Raw packet I/O for the packet offcodes (the SCIRON firewall on a core, the
//! traffic generator and its analyser).
//!
//! * [`frame`] — Ethernet/IPv4 frames with UDP, TCP or ICMP, built in place
//!   with correct checksums, and parsed back to the firewall's 5-tuple.
//! * [`raw`] — AF_PACKET sockets bound to one interface (in a network
//!   namespace if asked), sending and receiving batches with one system call
//!   each, optionally bypassing the qdisc and stamping arrivals in the kernel.
//!
//! libc directly rather than a wrapper crate: the calls are few (socket,
//! bind, setsockopt, sendmmsg, recvmmsg) and the batch structures must stay
//! allocated across calls, which the wrappers' owned-buffer APIs do not allow.

pub mod frame;
pub mod raw;

pub use frame::{FrameSpec, parse};
pub use raw::{RawOptions, RawSocket, RecvBatch, enable_timestamps, recv_batch};
