//! Network namespaces for sidecore's tests, demos and benchmarks.
//!
//! * [`netns`] — run code inside a named namespace (a socket or BPF link made
//!   there stays there).
//! * [`topology`] — the testbed: hosts as namespaces joined by veth pairs,
//!   with addresses, routes and forwarding, built and removed without a trace.
//! * [`testing`] — for tests: may they build one, and a clean-up guard.

pub mod netns;
pub mod testing;
pub mod topology;

pub use netns::{NetnsError, within};
pub use topology::{Host, Iface, Testbed, TestbedError, Topology};
