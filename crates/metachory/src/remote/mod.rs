//! Running a program on a peer node (`sidecore exec --on NODE`): the
//! client ([`client`]) projects its directories and carries stdio and
//! signals over the node protocol; the server ([`server`]) builds the
//! guest's container ([`shim`]), serves the projection through FUSE
//! ([`projection`]) with file data fetched through DisCo ([`conn`]),
//! supervises the guest ([`guard`], or [`crate::ptrace`]) and returns the
//! write-back overlay ([`overlay`]) for the client to approve. [`export`] is
//! the client's file server; [`relay`] forwards sessions for nodes a
//! client cannot reach.

pub mod client;
pub mod conn;
pub mod ctl;
pub mod export;
pub mod freeze;
pub mod guard;
pub mod hosted;
pub mod migration;
pub mod overlay;
pub mod projection;
pub mod relay;
pub mod server;
pub mod session;
pub mod shim;
