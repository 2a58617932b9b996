//! TCPServers (Bohra 2008, chapter 2) rebuilt for today's Linux: packet
//! processing engines (PPEs) on dedicated cores own the listening and
//! connected sockets; applications get per-connection receive queues and
//! never enter the network stack.
//!
//! | module | what |
//! |---|---|
//! | [`autoscale`] | when to grow or shrink ActivePPE from the PPEs' load (sans-IO, with hysteresis) |
//! | [`gr3`] | the connection scheduler (Eqs. 2.1–2.8, Alg. 1 with E1), sans-IO |
//! | [`poller`] | the PPE's event source: io_uring multishot poll, or epoll |
//! | [`conn`] | the application's side: `Conn` (recv/send rings), `App` (events) |
//! | [`offcode`] | the servers as offcodes: `tcps-ppe`, `tcps-http`, `tcps-stream`, `tcps-autoscale` |
//! | [`pconn`] | the PPE's side of a connection: early demux, sends, closes |
//! | [`ppe`] | the PPE loop on a dedicated core |
//! | [`pool`] | connections' rings, their buffers pooled |
//! | [`shared`] | configuration, AllowedPPE/ActivePPE, mailboxes |
//! | [`server`] | start, add/remove PPEs, stats |
//! | [`stats`] | counters |
//! | [`http`] | HTTP/1.1 request heads (httparse) with limits and statuses |
//! | [`ctl`] | the control socket (`ppe add|remove`, `stats`) |
//! | [`apps`] | example applications: static file server, block streamer |
//!
//! What the kernel still does: TCP itself (the seed replaced FreeBSD's stack
//! below the socket layer; a user-space PPE over Linux owns the sockets
//! instead, so "packets" are socket readiness events and receive-queue
//! slots, and the kernel's window is the back-pressure).

pub mod apps;
pub mod autoscale;
pub mod conn;
pub mod ctl;
pub mod gr3;
pub mod http;
pub mod offcode;
pub mod pconn;
pub mod poller;
pub mod pool;
pub mod ppe;
pub mod server;
pub mod shared;
pub mod stats;

pub use conn::{App, AppEvent, BlobId, CloseReason, Conn, RecvStatus};
pub use poller::Backend;
pub use server::{Counters, Error, TcpServers, usable_cpus};
pub use shared::{BadCoreSet, Config, CoreSet};
pub use stats::{PpeSnapshot, Snapshot};
