//! sidecore's node protocol: what daemons on different machines say to each
//! other, in one crate, without I/O at its core.
//!
//! * [`frame`] — the one framing: a preamble with the protocol version, then
//!   frames of length, sequence number and CRC around each message, with one
//!   size limit ([`frame::MAX_FRAME_BYTES`]).
//! * [`msg`] — the typed messages ([`Message`]), JSON inside the frames.
//! * [`part`] — the deploy request ([`RemotePart`]) and its checks.
//! * [`session`] — the origin's and the peer's state machines: bytes in, bytes
//!   out, each message checked against who may send it when. Tests and
//!   simulators drive them without sockets.
//! * [`tcp`] — the thin blocking driver that runs a session over a socket.
//! * [`line`] — the control socket's JSON lines, through one bounded reader.
//!
//! * [`agents`] — Sikker's agent-to-agent link and its grammar; [`agent_msg`]
//!   the bodies of its messages.
//!
//! * [`orion_msg`] — Orion's monitors asking a node for views of its sensors
//!   (`sense`, `sense-view`) on an ordinary node connection.
//!
//! * [`mx_image`] — the image a migrating guest travels in, and its page stream.
//!
//! * [`mx_msg`] — Metachory's sessions (`mx-open`, then `mx` frames between
//!   numbered endpoints) on an ordinary node connection.
//!
//! Later conversations add their messages to [`Message`] and their rules
//! beside [`session`]'s; the framing, the handshake and the driver stay as
//! they are.

pub mod agent_msg;
pub mod agents;
pub mod frame;
pub mod line;
pub mod msg;
pub mod mx_image;
pub mod mx_msg;
pub mod orion_msg;
pub mod part;
pub mod session;
pub mod tcp;

pub use agent_msg::{AgentHello, AgentResult, AgentSend, RateExchange, WireHeader, WireOtp};
pub use agents::AgentLink;
pub use msg::{Hello, Message, NodeInfo};
pub use part::{PartError, RemoteChannel, RemoteOffcode, RemotePart};
pub use session::{Error, ErrorKind, Origin, Peer};
pub use tcp::{Link, LinkError, Received};

/// This build's sidecore version, as hellos and welcomes carry it.
pub const SOFTWARE_VERSION: &str = env!("CARGO_PKG_VERSION");
