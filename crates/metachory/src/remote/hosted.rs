//! What the server holds for one session's guest, shared by the session's
//! threads ([`super::server`]) and a migration's ([`super::migration`]):
//! the guest's init, its stdio state, the migration flags.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32};
use std::sync::{Arc, Mutex};

use sidecore_wire::mx_msg::{MxBody, MxOpen};

use super::conn::{Conn, ConnError, lock};
use super::freeze::Freeze;

/// The guest's init, as a pidfd (signals reach it after it is reaped never).
#[derive(Default)]
pub(super) struct Init(Mutex<Option<OwnedFd>>);

impl Init {
    pub(super) fn set(&self, pid: i32) {
        // SAFETY: pidfd_open with a PID and no flags.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            // SAFETY: a new descriptor, ours.
            *lock(&self.0) = Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
    }

    pub(super) fn signal(&self, sig: i32) {
        if let Some(fd) = lock(&self.0).as_ref() {
            // SAFETY: pidfd_send_signal on our pidfd, no siginfo, no flags.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    }
}

/// What the receiving loop hands on.
pub(super) struct Shared {
    pub(super) conn: Arc<Conn>,
    pub(super) init: Init,
    pub(super) verdict: Mutex<Option<bool>>,
    pub(super) stdin_ready: std::sync::Condvar,
    pub(super) master: Option<RawFd>,
    pub(super) failed: Mutex<Option<String>>,
    /// The guest's PID (in the server's namespace), once it runs.
    pub(super) guest: AtomicI32,
    /// Inodes of the session's stdin, stdout and stderr pipes (0 with a terminal).
    pub(super) stdio_inodes: [u64; 3],
    pub(super) freeze: Freeze,
    /// The guest migrated away: its end here is no exit of the session's.
    pub(super) moved: AtomicBool,
    /// A migration out is under way.
    pub(super) migrating: AtomicBool,
    /// Bytes (and the end) to write to the guest's stdin before any the
    /// client sends: a migrated guest's unread input.
    pub(super) prefill: Mutex<Option<(Vec<u8>, bool)>>,
    /// A migrating guest's userfaultfd, from its restorer.
    pub(super) uffd: Mutex<Option<OwnedFd>>,
    /// The restorer's `installed …` report, for the restore.
    pub(super) installed: Mutex<Option<std::sync::mpsc::Sender<String>>>,
}

/// Tells the client the guest runs.
pub(super) fn started(conn: &Conn, open: &MxOpen, supervision: &str) -> Result<(), ConnError> {
    let namespaces = if open.userns {
        "user,mnt,pid,net,ipc,uts"
    } else {
        "mnt,pid,net,ipc,uts"
    };
    conn.send(MxBody::Started {
        guest_pid: 0,
        supervision: supervision.to_string(),
        projection: "fuse+overlayfs".into(),
        namespaces: namespaces.into(),
    })
}
