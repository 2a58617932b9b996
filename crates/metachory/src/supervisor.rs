//! The supervisor: start the guest under the seccomp filter, take its
//! listener descriptor and answer every notification until the guest and all
//! its descendants are gone.
//!
//! Pointer arguments are copied out of the guest (`/proc/PID/mem`) and the
//! notification is re-validated (`SECCOMP_IOCTL_NOTIF_ID_VALID`) before the
//! decision. Known limit of this slice: a `Continue` lets the kernel re-read
//! the path, so another guest thread could swap it after the check (TOCTTOU);
//! only projected opens, done on the supervisor's side, are race-free.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::fdpass;
use crate::filter;
use crate::policy::{Decision, OpenRequest, Policy};

/// The supervision this crate implements, as `sidecore exec` reports it.
pub const SUPERVISION: &str = "seccomp-user-notif";

/// Why the guest could not be supervised.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start {prog:?} under seccomp user notification: {source}")]
    Spawn { prog: OsString, source: io::Error },
    #[error("cannot receive the seccomp listener descriptor from the guest: {0}")]
    Listener(io::Error),
    #[error("cannot open the projected root {path}: {source}")]
    Root { path: PathBuf, source: io::Error },
    #[error("waiting for the guest: {0}")]
    Wait(io::Error),
    #[error("no program given")]
    NoProgram,
}

/// What the supervisor trapped and how it answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Notifications received.
    pub trapped: u64,
    /// Answered with `SECCOMP_USER_NOTIF_FLAG_CONTINUE`.
    pub continued: u64,
    /// Answered with an errno.
    pub denied: u64,
    /// Answered by injecting a descriptor opened from the projected root.
    pub projected: u64,
    /// Notifications whose guest vanished before the answer.
    pub lost: u64,
    /// Emulated calls that failed as the kernel would have failed them
    /// (ENOENT and the like): not denials.
    pub failed: u64,
    /// Trapped calls by syscall name.
    pub by_syscall: BTreeMap<&'static str, u64>,
}

impl std::fmt::Display for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "trapped={} continued={} denied={} projected={} failed={} lost={}",
            self.trapped, self.continued, self.denied, self.projected, self.failed, self.lost
        )?;
        for (name, n) in &self.by_syscall {
            write!(f, " {name}={n}")?;
        }
        Ok(())
    }
}

/// How the guest ended and what was trapped.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The guest's exit code, or 128+N when signal N killed it.
    pub code: i32,
    pub counters: Counters,
}

/// Run `argv` under supervision with `policy`; stdio is inherited.
///
/// # Errors
/// When the guest cannot be started under the filter, the listener cannot be
/// received, or the projected root cannot be opened.
pub fn run(argv: &[OsString], policy: Policy) -> Result<Outcome, Error> {
    let (prog, args) = argv.split_first().ok_or(Error::NoProgram)?;
    let root = match policy.root() {
        Some(p) => Some(File::open(p).map_err(|source| Error::Root {
            path: p.to_path_buf(),
            source,
        })?),
        None => None,
    };
    let (parent_sock, child_sock) = fdpass::seqpacket_pair().map_err(|source| Error::Spawn {
        prog: prog.clone(),
        source,
    })?;
    let prog_filter = filter::program();
    let child_raw = child_sock.as_raw_fd();
    let mut cmd = Command::new(prog);
    cmd.args(args);
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog_filter.len()).unwrap_or(u16::MAX),
        filter: prog_filter.as_ptr().cast_mut(),
    };
    // The pointer inside `fprog` is plain data that the child only reads.
    let fprog_addr = &raw const fprog as usize;
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, seccomp, sendmsg, close); it does
    // not allocate. `fprog` and `prog_filter` outlive `spawn`, and the child
    // has its own copy of that memory.
    unsafe {
        cmd.pre_exec(move || {
            // SAFETY: `fprog_addr` is the address of `fprog`, alive in the
            // child's copy of this memory (above).
            let fprog = &*(fprog_addr as *const libc::sock_fprog);
            filter::install_listener_and_send(fprog, child_raw, &[0])
        });
    }
    // The handlers go in before the guest exists: a signal sent once the
    // guest has started (it may say so before this thread runs again) waits
    // in the iterator instead of meeting the default action, or SIG_IGN
    // inherited from a shell's background job, and being lost.
    let signals = signal_hook::iterator::Signals::new(FORWARDED).ok();
    let mut child = cmd.spawn().map_err(|source| Error::Spawn {
        prog: prog.clone(),
        source,
    })?;
    drop(child_sock);
    let listener = match recv_fd(&parent_sock) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Listener(e));
        }
    };
    drop(parent_sock);
    let serve = std::thread::spawn(move || serve(&listener, &policy, root.as_ref()));
    let forward = signals.and_then(|s| forward_signals(s, child.id()));
    let status = child.wait().map_err(Error::Wait)?;
    if let Some((handle, thread)) = forward {
        handle.close();
        let _ = thread.join();
    }
    let counters = serve.join().unwrap_or_default();
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    };
    Ok(Outcome { code, counters })
}

/// Signals that end a program when sent to it: passed on to the guest, as a
/// shell's foreground job would get them, so that `kill -TERM` on `sidecore
/// exec` ends the guest (with its own status) rather than orphaning it.
/// (A terminal's Ctrl-C reaches the guest directly too, since it shares the
/// foreground process group; it may see that SIGINT twice.)
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Starts forwarding what `signals` (registered for [`FORWARDED`]) caught,
/// and catches, to `pid` through a pidfd, which keeps naming the guest after
/// it is reaped (a late signal then fails with ESRCH instead of reaching
/// whatever process reuses the number); `None` when the pidfd cannot be had
/// (the guest then only gets what its process group gets).
fn forward_signals(
    mut signals: signal_hook::iterator::Signals,
    pid: u32,
) -> Option<(signal_hook::iterator::Handle, std::thread::JoinHandle<()>)> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open(2) with a pid this process spawned and has not reaped
    // (the caller waits for it only after this returns).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: the descriptor was just returned by the kernel and is owned by
    // nothing else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let handle = signals.handle();
    let thread = std::thread::spawn(move || {
        for sig in signals.forever() {
            // SAFETY: pidfd_send_signal(2) on the pidfd this thread owns, with
            // no siginfo (null) and no flags.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    });
    Some((handle, thread))
}

/// The listener the child sends (through [`fdpass::recv`]).
fn recv_fd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    fdpass::recv(sock.as_raw_fd())?
        .and_then(|r| r.fd)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the guest exited before sending its listener (seccomp user notification unavailable?)",
            )
        })
}

/// Answer notifications until every task using the filter is gone.
fn serve(listener: &OwnedFd, policy: &Policy, root: Option<&File>) -> Counters {
    let mut counters = Counters::default();
    until_gone(listener, || {
        handle_one(listener, policy, root, &mut counters);
    });
    counters
}

/// `SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP` (Linux 6.6, not in the `libc`
/// crate yet): the guest waiting on a notification is woken on the CPU of the
/// thread that answers it, as a synchronous hand-off, instead of through the
/// scheduler's wake-up path (another CPU, an interrupt). A trapped call is two
/// such hand-offs, and on this VM a cross-CPU wake-up costs 10–30 µs.
const SYNC_WAKE_UP: libc::c_ulong = 1;

/// Calls `on_notification` for each notification the seccomp `listener`
/// has, until every task under its filter is gone (the listener hangs up).
/// The listener is first asked for synchronous wake-ups ([`SYNC_WAKE_UP`]);
/// a kernel without them answers as before.
pub(crate) fn until_gone(listener: &OwnedFd, mut on_notification: impl FnMut()) {
    // SAFETY: SET_FLAGS takes its flags by value; the result is only a hint.
    let _ = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS,
            SYNC_WAKE_UP,
        )
    };
    loop {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&raw mut pfd, 1, -1) };
        if r < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if pfd.revents & libc::POLLIN != 0 {
            on_notification();
        } else if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            break;
        }
    }
}

pub(crate) fn ioctl<T>(fd: &OwnedFd, req: libc::Ioctl, arg: *mut T) -> io::Result<()> {
    // SAFETY: callers pass the struct type that `req` encodes.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn handle_one(listener: &OwnedFd, policy: &Policy, root: Option<&File>, c: &mut Counters) {
    // SAFETY: the kernel requires a zeroed seccomp_notif for RECV; all-zero is valid.
    let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    if ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &raw mut req).is_err() {
        return; // the guest died between poll and recv
    }
    let nr = i64::from(req.data.nr);
    c.trapped += 1;
    *c.by_syscall.entry(filter::name(nr)).or_default() += 1;
    let (dirfd, ptr, flags) = if nr == libc::SYS_openat {
        (
            req.data.args[0] as i32,
            req.data.args[1],
            req.data.args[2] as i32,
        )
    } else {
        (libc::AT_FDCWD, req.data.args[0], req.data.args[1] as i32)
    };
    let pid = req.pid;
    let decision = match read_cstr(pid, ptr) {
        Ok(path) => {
            let mut id = req.id;
            if ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &raw mut id).is_err() {
                c.lost += 1;
                return;
            }
            let base = if path.is_absolute() {
                None
            } else {
                guest_dir(pid, dirfd)
            };
            decide_with_links(policy, &path, base.as_deref(), flags)
        }
        Err(_) => Decision::Deny(libc::EFAULT),
    };
    answer(listener, req.id, decision, flags, root, c);
}

/// The policy's answer, also denying when the path resolves (through
/// symlinks, in the supervisor's view) to a denied file.
fn decide_with_links(policy: &Policy, path: &Path, base: Option<&Path>, flags: i32) -> Decision {
    let d = policy.decide(&OpenRequest { path, base, flags });
    if d != Decision::Continue {
        return d;
    }
    let full = match base {
        Some(b) => b.join(path),
        None => path.to_path_buf(),
    };
    match std::fs::canonicalize(&full) {
        Ok(real) if policy.is_denied(&real) => Decision::Deny(libc::EACCES),
        _ => d,
    }
}

fn answer(
    listener: &OwnedFd,
    id: u64,
    decision: Decision,
    flags: i32,
    root: Option<&File>,
    c: &mut Counters,
) {
    let decision = match (decision, root) {
        (Decision::Project { rel, write }, Some(root)) => match open_in_root(root, &rel, flags) {
            Ok(fd) if !write => {
                let mut add = libc::seccomp_notif_addfd {
                    id,
                    flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
                    srcfd: fd.as_raw_fd() as u32,
                    newfd: 0,
                    newfd_flags: (flags & libc::O_CLOEXEC) as u32,
                };
                match ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &raw mut add) {
                    Ok(()) => c.projected += 1,
                    Err(_) => c.lost += 1,
                }
                return;
            }
            Ok(_) => Decision::Deny(libc::EROFS),
            // Absent from the projection: the host's file, if any.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Decision::Continue,
            // Present but unopenable as asked (ENOTDIR, ELOOP, EACCES…): the guest gets that errno.
            Err(e) => Decision::Deny(e.raw_os_error().unwrap_or(libc::EIO)),
        },
        (Decision::Project { .. }, None) => Decision::Continue,
        (d, _) => d,
    };
    let (error, rflags) = match decision {
        Decision::Deny(e) => (-e, 0),
        _ => (0, libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32),
    };
    let mut resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error,
        flags: rflags,
    };
    match ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &raw mut resp) {
        Ok(()) if error != 0 => c.denied += 1,
        Ok(()) => c.continued += 1,
        Err(_) => c.lost += 1,
    }
}

/// Open `rel` read-only beneath `root` with `RESOLVE_IN_ROOT`, so `..` and
/// absolute symlinks inside the projection cannot leave it.
fn open_in_root(root: &File, rel: &Path, guest_flags: i32) -> io::Result<OwnedFd> {
    let path = CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open_how is plain data; all-zero is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    let kept = guest_flags & (libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK);
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | kept) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT;
    // SAFETY: `path` is NUL-terminated and `how` is a valid open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &raw const how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The directory a relative path of the guest resolves against.
pub(crate) fn guest_dir(pid: u32, dirfd: i32) -> Option<PathBuf> {
    let link = if dirfd == libc::AT_FDCWD {
        format!("/proc/{pid}/cwd")
    } else {
        format!("/proc/{pid}/fd/{dirfd}")
    };
    std::fs::read_link(link).ok().filter(|p| p.is_absolute())
}

/// Copy a NUL-terminated string (at most PATH_MAX bytes) out of the guest.
pub(crate) fn read_cstr(pid: u32, addr: u64) -> io::Result<PathBuf> {
    const PATH_MAX: usize = 4096;
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    let mut at = addr;
    let mut buf = [0u8; PAGE as usize];
    while out.len() < PATH_MAX {
        // Up to the page boundary, so an unmapped next page does not fail
        // the read; one process_vm_readv (no /proc file to open) per page.
        let chunk = (PAGE - at % PAGE) as usize;
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: chunk,
        };
        let remote = libc::iovec {
            iov_base: at as *mut libc::c_void,
            iov_len: chunk,
        };
        // SAFETY: one local buffer of `chunk` bytes; the remote range is
        // the guest's, checked by the kernel.
        let n = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                &raw const local,
                1,
                &raw const remote,
                1,
                0,
            )
        };
        if n <= 0 {
            return Err(if n == 0 {
                io::Error::from(io::ErrorKind::UnexpectedEof)
            } else {
                io::Error::last_os_error()
            });
        }
        let n = n as usize;
        if let Some(end) = buf[..n].iter().position(|b| *b == 0) {
            out.extend_from_slice(&buf[..end]);
            return Ok(PathBuf::from(OsString::from_vec(out)));
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG))
}
