//! DisCo, Metachory's distributed coherence (seed §4.3, Ch. 5–6), sans-IO.
//!
//! * [`types`] — endpoints, objects, vnodes, accesses and the MOESI states.
//! * [`msg`] — the messages, with the seed's names (`VNODECHMAN`,
//!   `VNODEWRITE`, `STREAMPUSH`, …), their JSON form and their limits.
//! * [`coherence`] — one endpoint's engine: Ivy's fixed distributed manager
//!   with request, forward, grant, invalidate and fetch, asynchronous releases
//!   and manager changes.
//! * [`space`] — the physical space: 4 GiB chunks, each with a manager (the
//!   chunk managers), regions allocated in them, and chunk notices.
//! * [`vnode`] — virtual inodes: stat, regions mapping a file's blocks into
//!   the physical space, open and close lists, write-through and the valid
//!   ranges of a write-back overlay.
//! * [`stream`] — the stream protocol: windowed pushes between one writer and
//!   one reader, buffer moves to a new reader, reader/writer presence.
//!
//! Nothing here does I/O: messages go in through `handle` and come out of
//! `take_output`; `tests/props.rs` drives several endpoints against each
//! other with random message orders.

pub mod b64;
pub mod b64opt;
pub mod coherence;
pub mod msg;
pub mod space;
pub mod stream;
pub mod types;
pub mod vnode;

pub use coherence::{Engine, Error, Event};
pub use msg::{DecodeError, Msg};
pub use types::{Access, Endpoint, Moesi, ObjectId, VnodeId};
