//! Raw packet I/O for the packet offcodes (the SCIRON firewall on a core, the
//! traffic generator and its analyser).
//!
//! * [`frame`] — Ethernet/IPv4 frames with UDP, TCP or ICMP, built in place
//!   with correct checksums, and parsed back to the firewall's 5-tuple.
//! * [`raw`] — AF_PACKET sockets bound to one interface (in a network
//!   namespace if asked), sending and receiving batches with one system call
//!   each, optionally bypassing the qdisc and stamping arrivals in the kernel.
//! * [`xsk`] — AF_XDP sockets: a UMEM of frames and the fill, completion,
//!   RX and TX rings shared with the kernel, on one queue of one interface.
//!
//! libc directly rather than a wrapper crate: the calls are few (socket,
//! bind, setsockopt, sendmmsg, recvmmsg, mmap) and the batch structures must
//! stay allocated across calls, which the wrappers' owned-buffer APIs do not
//! allow (see [`xsk`] for why not an AF_XDP crate).

pub mod frame;
pub mod raw;
pub mod xsk;

pub use frame::{FrameSpec, parse};
pub use raw::{
    RawOptions, RawSocket, RecvBatch, enable_timestamps, recv_batch, set_receive_buffer,
};
pub use xsk::{Sent, XskBind, XskError, XskOptions, XskSocket};
