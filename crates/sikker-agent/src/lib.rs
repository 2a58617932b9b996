//! Sikker's agent (dissertation ch. 4–6, on Linux as the digest's §7 maps it):
//! the enforcement point on a node. Local processes attach over a Unix socket;
//! the agent derives who each is from the kernel (never from the process),
//! checks every message against the part-1 NMU tables at the sender and at the
//! receiver, runs one-time permissions, and delivers each message with its
//! sender's verified identity.
//!
//! | module | what |
//! |---|---|
//! | [`header`] | the trusted header as agents forward it |
//! | [`proto`] | the messages between a process and its agent |
//! | [`attest`] | identity from peer credentials, cgroup and executable (sans-IO matching) |
//! | [`core`] | the agent's logic, sans-IO: attach, check, deliver, deny |
//! | [`rate`] | rate limits on real time: SE-TRE between the source service's processes (sans-IO) |
//! | [`tls`] | node identity: the cluster authority, host certificates, mutual TLS |
//! | [`links`] | links to other hosts' agents (TCP in mutual TLS, non-blocking) |
//! | [`server`] | the Unix-socket server around the core (per-message credentials) |
//! | [`client`] | the library a process uses to send and receive |
//! | [`store`] | where the policy and the placement are kept (watched files, or keys in etcd) and how their changes reach the agent |
//! | [`l4`] | L4 mode for plain TCP: what the kernel's cgroup programs hold for one host (sans-IO) |
//!
//! Agents on several hosts link over mutual TLS; a message for a process on
//! another host is checked at the sender's agent, forwarded, checked again
//! at the receiver's and answered with its verdict; rate limits run SE-TRE
//! between the agents on real time.

pub mod attest;
pub mod client;
pub mod core;
pub mod header;
pub mod l4;
pub mod links;
pub mod proto;
pub mod rate;
pub mod server;
pub mod store;
pub mod tls;

pub use client::{Client, ClientError};
pub use core::{
    AgentCore, AgentError, AttachError, ConnId, Counters, Effect, PlacementDelta, PlacementRefused,
    PolicyRefused,
};
pub use proto::{BadDest, Denied, Dest, FromAgent, Identity, ToAgent};
