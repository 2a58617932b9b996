//! Sikker's agent (dissertation ch. 4–6, on Linux as the digest's §7 maps it):
//! the enforcement point on a node. Local processes attach over a Unix socket;
//! the agent derives who each is from the kernel (never from the process),
//! checks every message against the part-1 NMU tables at the sender and at the
//! receiver, runs one-time permissions, and delivers each message with its
//! sender's verified identity.
//!
//! | module | what |
//! |---|---|
//! | [`proto`] | the messages between a process and its agent |
//! | [`attest`] | identity from peer credentials, cgroup and executable (sans-IO matching) |
//! | [`core`] | the agent's logic, sans-IO: attach, check, deliver, deny |
//! | [`rate`] | rate limits on real time: SE-TRE between the source service's processes (sans-IO) |
//! | [`server`] | the Unix-socket server around the core (per-message credentials) |
//! | [`client`] | the library a process uses to send and receive |
//!
//! Not here yet: agents on several nodes talking to each other (with mutual
//! authentication), SE-TRE between them on real time, etcd for the Network
//! OS's state, and the eBPF L4 mode.

pub mod attest;
pub mod client;
pub mod core;
pub mod proto;
pub mod rate;
pub mod server;

pub use client::{Client, ClientError};
pub use core::{AgentCore, AgentError, ConnId, Counters, Effect};
pub use proto::{Denied, Dest, FromAgent, Identity, ToAgent};
