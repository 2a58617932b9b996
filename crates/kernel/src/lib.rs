//! The kernel as a processing element.
//!
//! eBPF programs are written in C (`crates/kernel/bpf`), compiled with clang
//! when this crate builds, and embedded ([`objects`]). aya loads them — the
//! kernel's verifier has the last word — and attaches them at XDP; their maps
//! are how user space talks to them: hash and array maps carry configuration
//! in, per-CPU arrays carry counters out, and a ring buffer carries events
//! (the firewall's log) to the offcode that drains it into a channel.
//!
//! Attachments are BPF links owned by this process: when it exits, or dies,
//! the kernel closes the link and detaches the program, so a crash leaves no
//! program attached. Attaching and detaching are idempotent.
//!
//! * [`firewall`] — SCIRON at XDP: the tuple-space tables of
//!   `sidecore-firewall` in BPF maps, swapped live between two generations.

mod error;
pub mod firewall;
pub mod objects;

pub use error::{KernelError, XdpMode};
pub use firewall::{FwStats, LogEvent, XdpFirewall};
