//! FileWall (issue 12): a policy middlebox for NFSv3. The wire layer — ONC RPC
//! headers (RFC 5531), TCP record marking, XDR for every NFSv3 procedure (RFC 1813),
//! MOUNT v3 and the portmapper v2 subset, with typed errors that say what was
//! malformed and where; the pending-request map and the policy chain of §4.3 with
//! its pluggable scheduler (`chain`); the §4.4 templates — statistics
//! (`flowstats`), file-handle security (`handles`), temporal access control
//! (`temporal`), replication and failover (`replicate`) — the synthetic extension
//! of §4.7.2 (`synthetic`), and the §4.5 RBAC case study (`rbac`, `rbac_file`,
//! `rbac_policy`) with its Virtual Control Namespace (`vcn`, `vcn_text`,
//! `vcn_handler`) and persistent store (`store`). These are sans-IO but the store;
//! the event-driven proxy over TCP and UDP (`engine`, `proxy`) drives them, on its
//! own thread or as the `filewall` offcode (`offcode`) on a dedicated core.

pub mod backend;
pub mod chain;
pub mod config;
pub mod control_socket;
pub mod engine;
pub mod flowstats;
pub mod handles;
pub mod latency;
pub mod loadgen;
pub mod message;
pub mod mount;
pub mod nfs3;
pub mod offcode;
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
pub mod settings;
pub mod stats_json;
pub mod store;
pub mod synthetic;
pub mod temporal;
pub mod vcn;
pub mod vcn_handler;
pub mod vcn_text;
pub mod xdr;

#[cfg(test)]
mod proptests;
