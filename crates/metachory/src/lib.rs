//! Metachory (issue 16, in progress): run an unmodified program under a
//! supervisor that traps its file opens with seccomp user notification.
//!
//! * [`policy`] is sans-IO: given one trapped open (path already copied out of
//!   the guest and made absolute) it says continue, deny or project.
//! * [`filter`] builds the classic-BPF seccomp filter that returns
//!   `SECCOMP_RET_USER_NOTIF` for the trapped calls.
//! * [`supervisor`] starts the guest with that filter, receives the listener
//!   descriptor, answers every notification (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`,
//!   an errno, or `SECCOMP_IOCTL_NOTIF_ADDFD`) and counts what it trapped.
//! * [`remote`] runs the guest on a peer node (`sidecore exec --on`): its
//!   own namespaces, the client's files projected through FUSE and DisCo, a
//!   write-back overlay the client approves; [`ptrace`] is the
//!   PTRACE_SYSEMU fallback supervisor; [`fdpass`] passes descriptors
//!   between the container and the server; [`migrate`] moves a running
//!   guest to another server (`sidecore migrate`).

pub mod fdpass;
pub mod filter;
pub mod migrate;
pub mod policy;
pub mod ptrace;
pub mod remote;
pub mod supervisor;

pub use policy::{Decision, OpenRequest, Policy};
pub use supervisor::{Counters, Error, Outcome, SUPERVISION, run};
