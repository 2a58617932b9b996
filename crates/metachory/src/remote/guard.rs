//! The supervisor of a remote guest (seccomp user notification, the
//! container profile of [`crate::filter`]).
//!
//! Opens are *emulated*: the path is copied out of the guest once, checked,
//! and opened by the supervisor inside the guest's root (`openat2` with
//! `RESOLVE_IN_ROOT` from `/proc/PID/root`, relative paths joined to the
//! guest's working directory as the guest sees it); the descriptor is
//! injected with `SECCOMP_IOCTL_NOTIF_ADDFD`. The guest never re-reads the
//! path, so a thread swapping it after the check changes nothing (no
//! TOCTTOU). `/proc`, `/dev` and `/sys` paths, and every open in the
//! unprivileged mode (where the supervisor's own rights would exceed the
//! guest's), run natively with `SECCOMP_USER_NOTIF_FLAG_CONTINUE`: there the
//! container's mounts, not the check, are what confine the guest.
//!
//! `ptrace` and cross-process memory calls are refused (EPERM) and
//! reported; `socket` continues unless it asks for a raw or packet socket.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::filter;
use crate::policy::{Decision, OpenRequest, Policy, normalise};
use crate::supervisor::{Counters, guest_dir, ioctl, read_cstr, until_gone};

/// Trees that always come from the guest's own kernel view, natively.
const NATIVE_TREES: &[&str] = &["/proc", "/dev", "/sys"];

/// What the supervisor tells the client about.
pub type Report = dyn Fn(String) + Send + Sync;

/// How the supervisor treats the guest.
pub struct Guard {
    policy: Policy,
    /// Unprivileged mode: opens continue natively.
    userns: bool,
    root: Option<File>,
}

impl Guard {
    #[must_use]
    pub fn new(userns: bool) -> Self {
        Guard {
            policy: Policy::new(),
            userns,
            root: None,
        }
    }

    /// Answers notifications until every task under the filter is gone.
    pub fn serve(&mut self, listener: &OwnedFd, report: &Report) -> Counters {
        let mut c = Counters::default();
        until_gone(listener, || self.one(listener, report, &mut c));
        c
    }

    fn one(&mut self, listener: &OwnedFd, report: &Report, c: &mut Counters) {
        // SAFETY: RECV needs a zeroed seccomp_notif; all-zero is valid.
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        if ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &raw mut req).is_err() {
            return;
        }
        let nr = i64::from(req.data.nr);
        c.trapped += 1;
        *c.by_syscall.entry(filter::container_name(nr)).or_default() += 1;
        let a = req.data.args;
        let answer = match filter::container_name(nr) {
            "ptrace" => {
                report(format!(
                    "the guest tried ptrace (request {}) on PID {}: refused",
                    a[0], a[1]
                ));
                Answer::Errno(libc::EPERM)
            }
            "process_vm_readv" | "process_vm_writev" => {
                report(format!(
                    "the guest tried to access the memory of PID {}: refused",
                    a[0]
                ));
                Answer::Errno(libc::EPERM)
            }
            "socket" => {
                let (domain, kind) = (a[0] as i32, a[1] as i32 & 0xf);
                if domain == libc::AF_PACKET || kind == libc::SOCK_RAW {
                    report(format!(
                        "the guest tried to open a raw socket (domain {domain}, type {kind}): refused"
                    ));
                    Answer::Errno(libc::EPERM)
                } else {
                    Answer::Continue
                }
            }
            "creat" => self.open(
                listener,
                &req,
                libc::AT_FDCWD,
                a[0],
                (libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, a[1] as u32),
            ),
            "open" => self.open(
                listener,
                &req,
                libc::AT_FDCWD,
                a[0],
                (a[1] as i32, a[2] as u32),
            ),
            "openat" => self.open(
                listener,
                &req,
                a[0] as i32,
                a[1],
                (a[2] as i32, a[3] as u32),
            ),
            _ => Answer::Continue,
        };
        finish(listener, req.id, answer, c);
    }

    fn open(
        &mut self,
        listener: &OwnedFd,
        req: &libc::seccomp_notif,
        dirfd: i32,
        ptr: u64,
        (flags, mode): (i32, u32),
    ) -> Answer {
        let pid = req.pid;
        let Ok(path) = read_cstr(pid, ptr) else {
            return Answer::Errno(libc::EFAULT);
        };
        let mut id = req.id;
        if ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &raw mut id).is_err() {
            return Answer::Lost;
        }
        let base = if path.is_absolute() {
            None
        } else {
            match guest_dir(pid, dirfd) {
                Some(b) => Some(b),
                // A directory descriptor that names no directory (deleted,
                // or not one): the kernel decides, natively.
                None => return Answer::Continue,
            }
        };
        let d = self.policy.decide(&OpenRequest {
            path: &path,
            base: base.as_deref(),
            flags,
        });
        if let Decision::Deny(e) = d {
            return Answer::Errno(e);
        }
        let abs = normalise(base.as_deref().unwrap_or(Path::new("/")), &path);
        if self.userns || NATIVE_TREES.iter().any(|t| abs.starts_with(t)) {
            return Answer::Continue;
        }
        if self.root.is_none() {
            self.root = File::open(format!("/proc/{pid}/root")).ok();
        }
        let Some(root) = &self.root else {
            return Answer::Continue;
        };
        // The joined path keeps `..` for the kernel to resolve inside the root.
        let joined = match &base {
            Some(b) => b.join(&path),
            None => path.clone(),
        };
        let creating = flags & (libc::O_CREAT | libc::O_TMPFILE) != 0;
        let mode = if creating { mode & !umask(pid) } else { 0 };
        match open_in(root, &joined, flags, mode) {
            Ok(fd) => Answer::Fd(fd, flags & libc::O_CLOEXEC != 0),
            Err(e) => Answer::Failed(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

/// The guest's umask, from /proc (022 when unreadable).
fn umask(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// Flags `openat2` accepts (it refuses unknown bits, unlike `openat`).
const OPEN_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_NOCTTY
    | libc::O_TRUNC
    | libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT
    | libc::O_LARGEFILE
    | libc::O_DIRECTORY
    | libc::O_NOFOLLOW
    | libc::O_NOATIME
    | libc::O_PATH
    | libc::O_TMPFILE;

fn open_in(root: &File, path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let c = std::ffi::CString::new(if rel.as_os_str().is_empty() {
        b"." as &[u8]
    } else {
        rel.as_os_str().as_bytes()
    })
    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; all-zero is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = ((flags & OPEN_FLAGS) | libc::O_CLOEXEC) as u64;
    if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        how.mode = u64::from(mode & 0o7777);
    }
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a NUL-terminated path and an open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &raw const how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

enum Answer {
    Continue,
    Errno(i32),
    /// An emulated call failed (the guest gets the errno the kernel gave).
    Failed(i32),
    Fd(OwnedFd, bool),
    Lost,
}

fn finish(listener: &OwnedFd, id: u64, a: Answer, c: &mut Counters) {
    let (error, flags, counter) = match a {
        Answer::Lost => {
            c.lost += 1;
            return;
        }
        Answer::Fd(fd, cloexec) => {
            let mut add = libc::seccomp_notif_addfd {
                id,
                flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
                srcfd: fd.as_raw_fd() as u32,
                newfd: 0,
                newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
            };
            match ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &raw mut add) {
                Ok(()) => c.projected += 1,
                Err(_) => c.lost += 1,
            }
            return;
        }
        Answer::Errno(e) => (-e, 0, &mut c.denied),
        Answer::Failed(e) => (-e, 0, &mut c.failed),
        Answer::Continue => (
            0,
            libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
            &mut c.continued,
        ),
    };
    let mut resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error,
        flags,
    };
    match ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &raw mut resp) {
        Ok(()) => *counter += 1,
        Err(_) => c.lost += 1,
    }
}

/// The guest's working directory as the guest sees it, for reports.
#[must_use]
pub fn guest_cwd(pid: u32) -> Option<PathBuf> {
    guest_dir(pid, libc::AT_FDCWD)
}
