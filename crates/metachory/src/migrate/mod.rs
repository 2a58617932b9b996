//! Live migration of a Metachory guest (`sidecore migrate`, issue 16): a
//! native checkpoint/restore of one process between two servers.
//!
//! **Why not CRIU.** CRIU was tried first and is the better tool where it
//! runs — multi-threaded processes, sockets, namespaces, many more kinds of
//! descriptor. It does not run here: Debian 12's criu 3.17.1 fails at start
//! on this machine's Linux 6.18 (`criu check`: "vdso: Failed to fill self
//! vdso symtable"), and Debian 13's 4.1 needs glibc 2.38. A Metachory guest
//! is what this migrator covers: one single-threaded process (others are
//! refused, naming their thread or child count) with regular files and
//! devices, the session's stdio pipes, and private anonymous and
//! file-backed memory; shared memory, sockets, pipes of its own, timers and
//! pending signals are not carried.
//!
//! * [`checkpoint`] (source): ptrace-freeze the guest, capture registers,
//!   FPU state, the memory map and which pages hold data (`pagemap`),
//!   descriptors (`/proc/PID/fd`, `fdinfo`), the mm fields, and — through
//!   calls injected into the guest itself — `brk`, signal dispositions, mask
//!   and alternate stack. A call the freeze interrupted is rewound to run
//!   again.
//! * [`transfer`]: the pages, eagerly before the guest resumes, or lazily
//!   (userfaultfd on the target, the source serving faults and pushing the
//!   rest in the background).
//! * [`restorer`] (target, in the container): the guest's process before it
//!   is the guest: descriptors installed, seccomp filter installed, waiting.
//! * [`restore`] (target, in the server): the restorer's address space and
//!   state replaced by the image's through injected calls ([`tracee`]).
//! * [`stream`]: the page stream ([`sidecore_wire::mx_image`]) over TCP.

pub mod checkpoint;
pub mod procfs;
pub mod restore;
pub mod restorer;
pub mod source;
pub mod stream;
pub mod target;
pub mod tracee;
pub mod transfer;

use sidecore_wire::mx_image::PageStreamError;

/// Why a migration failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Os {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The guest (or the target) cannot take part, and why.
    #[error("{0}")]
    Refused(String),
    #[error("{peer}: {source}")]
    Stream {
        peer: String,
        #[source]
        source: PageStreamError,
    },
    #[error("{peer}: {what}")]
    Peer { peer: String, what: String },
}
