//! sidecore's control plane.
//!
//! * [`Daemon`] — one runtime plus the offcode library and the PE inventory:
//!   `up` (load, plan, deploy), `ps`, `down`.
//! * [`server`] — the Unix control socket: one JSON request per line, one JSON
//!   response per line ([`Request`], [`Response`]), and its client.
//! * [`node`] — the TCP node listener: peers' hellos over the node protocol,
//!   their deploy requests, handed to the runtime's peer side, and Orion
//!   monitors' requests for views of this node's sensors.
//! * [`replace`] — HYDRA's reaction to a PE an Orion monitor declares dead: its
//!   apps re-solved without it and started again.
//!
//! Control traffic is a handful of short requests, so the servers use a thread
//! per connection rather than an async runtime: simpler, and the daemon's
//! thread count stays predictable (no threads are left behind on shutdown).

pub mod daemon;
pub mod node;
pub mod protocol;
pub mod replace;
pub mod server;

pub use daemon::{Daemon, DaemonError, DaemonOptions, UpReport};
pub use protocol::{Request, Response};
pub use server::{ClientError, ControlServer, ServerError, default_socket, request};
