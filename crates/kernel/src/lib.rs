//! The kernel as a processing element.
//!
//! eBPF programs are written in C (`crates/kernel/bpf`), compiled with clang
//! when this crate builds, and embedded ([`objects`]). aya loads them — the
//! kernel's verifier has the last word — and attaches them at XDP or to cgroup
//! v2 directories; their maps are how user space talks to them: hash and
//! array maps carry configuration in, per-CPU arrays and hashes carry
//! counters out, and a ring buffer carries events (the firewall's log) to the
//! offcode that drains it into a channel.
//!
//! Attachments are BPF links owned by this process: when it exits, or dies,
//! the kernel closes the link and detaches the program, so a crash leaves no
//! program attached. Attaching and detaching are idempotent.
//!
//! * [`firewall`] — SCIRON at XDP: the tuple-space tables of
//!   `sidecore-firewall` in BPF maps, swapped live between two generations.
//! * [`orion_sched`] — Orion's explicit process sensors: `sched_process_fork`,
//!   `_exec` and `_exit` tracepoints of one cgroup subtree into a ring buffer.
//! * [`sikker_l4`] — Sikker's L4 mode: cgroup connect4/connect6 and egress
//!   programs holding plain TCP to service permissions and rate limits.
//! * [`user_object`] — a user's own BPF object: its programs attached at XDP
//!   or tc, its ring buffers drained, its arrays and hash maps configured.
//! * [`xsk`] — AF_XDP receive: IPv4 frames redirected by queue into the
//!   AF_XDP sockets of `sidecore-packetio`.

mod error;
pub mod firewall;
pub mod objects;
pub mod orion_sched;
pub mod sikker_l4;
pub mod user_object;
pub mod xsk;

pub use error::{BadXdpMode, KernelError, XdpMode};
pub use firewall::{FwStats, LogEvent, XdpFirewall};
pub use sikker_l4::{
    L4Counters, L4PairCounters, L4Peer, L4Rate, L4Source, L4Tables, L4Totals, L4Update, SikkerL4,
};
pub use user_object::{Hook, ObjectError, RingReader, UserObject};
pub use xsk::XskRedirect;
