//! FileWall (issue 12): a policy middlebox for NFSv3, sans-IO. This crate holds the
//! wire layer — ONC RPC headers (RFC 5531), TCP record marking, XDR for every NFSv3
//! procedure (RFC 1813), MOUNT v3 and the portmapper v2 subset — with typed errors
//! that say what was malformed and where — and the pending-request map and the
//! policy chain of §4.3 — and a first driver with sockets, the TCP proxy of
//! `proxy`, which runs the chain configured in `policy`, with three §4.4 templates:
//! statistics (`flowstats`), file-handle security (`handles`) and temporal access
//! control (`temporal`).

pub mod backend;
pub mod chain;
pub mod config;
pub mod engine;
pub mod flowstats;
pub mod handles;
pub mod latency;
pub mod message;
pub mod mount;
pub mod nfs3;
pub mod pending;
pub mod policy;
pub mod portmap;
pub mod proxy;
pub mod rbac;
pub mod rbac_file;
pub mod rbac_policy;
pub mod record;
pub mod replicate;
pub mod rpc;
pub mod store;
pub mod synthetic;
pub mod temporal;
pub mod vcn;
pub mod vcn_handler;
pub mod vcn_text;
pub mod xdr;

#[cfg(test)]
mod proptests;
