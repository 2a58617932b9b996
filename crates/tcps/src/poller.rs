//! The PPE's event source: which sockets became readable, writable or hung
//! up, edge-triggered, read without blocking while the PPE busy-polls and with
//! a bounded wait when it parks (the seed's adaptive polling: interrupts stay
//! off while polls find work, and come back on when one finds nothing).
//!
//! Two backends, chosen at start:
//!
//! * **io_uring** (the `io-uring` crate): one multishot `POLL_ADD` per socket
//!   (edge-triggered, as io_uring's multishot poll is by default); the PPE
//!   peeks the completion queue in shared memory without a system call and
//!   enters the kernel only to submit new polls, to run the polls' task
//!   work (deferred, see `TaskRun`) when the kernel flags it, or to park. SQPOLL is
//!   available (`sqpoll`) but off by default: its kernel thread spins on a
//!   core of its own, and on a two-core machine that core is the application
//!   core.
//! * **epoll** with `EPOLLET`, polled with a zero timeout, where io_uring is
//!   refused (`kernel.io_uring_disabled`, seccomp, an old kernel).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use io_uring::{IoUring, opcode, types};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// Readiness of one socket, as one event reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ready {
    pub readable: bool,
    pub writable: bool,
    /// The peer shut its side (FIN): reading will reach end of file.
    pub peer_closed: bool,
    /// A socket error (RST: POLLERR). A plain hang-up (both sides shut)
    /// counts as `peer_closed`: reading then tells EOF from a reset.
    pub error: bool,
    /// The kernel ended this multishot poll: arm it again ([`Poller::rearm`]).
    pub rearm: bool,
}

/// Which backend a PPE uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// io_uring, busy-polled from user space (SQPOLL when `sqpoll`).
    IoUring { sqpoll: bool },
    /// epoll with a zero timeout.
    Epoll,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::IoUring { sqpoll: true } => f.write_str("io_uring (SQPOLL)"),
            Backend::IoUring { sqpoll: false } => f.write_str("io_uring (busy-polled CQ)"),
            Backend::Epoll => f.write_str("epoll (busy-polled, EPOLLET)"),
        }
    }
}

/// Tokens at the top of the range are the PPE's own; connections count up from 1.
pub const TOKEN_LISTENER: u64 = u64::MAX - 1;
/// The PPE's wake-up eventfd.
pub const TOKEN_WAKE: u64 = u64::MAX - 2;
const TOKEN_IGNORE: u64 = u64::MAX - 3;

/// io_uring submission and completion queue sizes.
const SQ_ENTRIES: u32 = 1024;
const CQ_ENTRIES: u32 = 16384;

const POLL_MASK: u32 =
    (libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP | libc::POLLERR | libc::POLLHUP) as u32;

/// An event source of either backend.
pub enum Poller {
    Uring {
        ring: Box<IoUring>,
        /// Submissions queued since the last `submit`.
        queued: usize,
        sqpoll: bool,
        /// Made disabled, to be enabled by the thread that will use it (its
        /// single issuer) before it first enters the kernel.
        disabled: bool,
    },
    Epoll(Epoll),
}

/// How the kernel runs the task work that completes a multishot poll on the
/// PPE's thread. With the default (`Interrupt`), each completion a softirq
/// produces interrupts the busy-polling PPE to run it: measured, that cost
/// the PPE about half its CPU per megabyte in the stream benchmark
/// (BENCHMARKS.md, TCPServers). `Deferred` runs it only when the PPE enters
/// the kernel asking for events, all pending at once; the kernel raises
/// `IORING_SQ_TASKRUN` so a PPE that only peeks the CQ knows to enter. It
/// needs a single issuer, so the ring is made disabled and enabled by the
/// PPE's own thread at its first poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskRun {
    Deferred,
    Cooperative,
    Interrupt,
}

impl TaskRun {
    fn setup(self, b: &mut io_uring::Builder) {
        match self {
            TaskRun::Deferred => {
                b.setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_taskrun_flag()
                    .setup_r_disabled();
            }
            TaskRun::Cooperative => {
                b.setup_coop_taskrun().setup_taskrun_flag();
            }
            TaskRun::Interrupt => {}
        }
    }
}

impl std::fmt::Display for TaskRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TaskRun::Deferred => "deferred",
            TaskRun::Cooperative => "cooperative",
            TaskRun::Interrupt => "interrupting",
        })
    }
}

impl Poller {
    /// Opens the preferred backend; io_uring falls back to epoll (with the
    /// reason) when the kernel refuses it. `cpu` pins an SQPOLL thread.
    pub fn open(want: Backend, cpu: Option<usize>) -> io::Result<(Poller, Option<String>)> {
        let Backend::IoUring { sqpoll } = want else {
            let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
            return Ok((Poller::Epoll(ep), None));
        };
        // Without SQPOLL, the task work that completes a poll runs only when
        // the PPE asks (deferred, Linux 6.1), else without an interrupt
        // (cooperative, 5.19), else as the kernel likes: the first the kernel
        // takes. See `TaskRun`.
        let modes: &[TaskRun] = if sqpoll {
            &[TaskRun::Interrupt]
        } else {
            &[TaskRun::Deferred, TaskRun::Cooperative, TaskRun::Interrupt]
        };
        let mut refused = Vec::new();
        for &mode in modes {
            let mut b = IoUring::builder();
            if sqpoll {
                b.setup_sqpoll(50);
                if let Some(c) = cpu {
                    b.setup_sqpoll_cpu(c as u32);
                }
            }
            // A CQ larger than the default 2 × SQ: every connection has a
            // multishot poll that may post several completions between peeks.
            b.setup_cqsize(CQ_ENTRIES);
            mode.setup(&mut b);
            match b.build(SQ_ENTRIES) {
                Ok(ring) => {
                    let note = (!refused.is_empty()).then(|| {
                        format!("io_uring with {mode} task work ({})", refused.join("; "))
                    });
                    let poller = Poller::Uring {
                        ring: Box::new(ring),
                        queued: 0,
                        sqpoll,
                        disabled: mode == TaskRun::Deferred,
                    };
                    return Ok((poller, note));
                }
                Err(e) => refused.push(format!("{mode} refused: {e}")),
            }
        }
        let why = format!("io_uring refused ({}); using epoll", refused.join("; "));
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
        Ok((Poller::Epoll(ep), Some(why)))
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        match self {
            Poller::Uring { sqpoll, .. } => Backend::IoUring { sqpoll: *sqpoll },
            Poller::Epoll(_) => Backend::Epoll,
        }
    }

    /// Starts watching `fd` under `token`.
    pub fn add(&mut self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        match self {
            Poller::Uring { ring, queued, .. } => {
                let sqe = opcode::PollAdd::new(types::Fd(fd.as_raw_fd()), POLL_MASK)
                    .multi(true)
                    .build()
                    .user_data(token);
                push(ring, queued, &sqe)
            }
            Poller::Epoll(ep) => {
                let flags = EpollFlags::EPOLLIN
                    | EpollFlags::EPOLLOUT
                    | EpollFlags::EPOLLRDHUP
                    | EpollFlags::EPOLLET;
                ep.add(fd, EpollEvent::new(flags, token))
                    .map_err(io::Error::from)
            }
        }
    }

    /// Stops watching `fd` (registered under `token`). Call before closing it
    /// or handing it to another PPE.
    pub fn remove(&mut self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        match self {
            Poller::Uring {
                ring,
                queued,
                disabled,
                ..
            } => {
                enable(ring, disabled)?;
                let sqe = opcode::PollRemove::new(token)
                    .build()
                    .user_data(TOKEN_IGNORE);
                push(ring, queued, &sqe)?;
                // Submit now, so the poll's file reference goes before the fd
                // is closed or moves.
                flush(ring, queued)
            }
            Poller::Epoll(ep) => ep.delete(fd).map_err(io::Error::from),
        }
    }

    /// Appends the events ready now to `out`. With `park = Some(d)` it first
    /// waits up to `d` for one (the PPE parks); with `None` it never blocks.
    pub fn poll(&mut self, out: &mut Vec<(u64, Ready)>, park: Option<Duration>) -> io::Result<()> {
        match self {
            Poller::Uring {
                ring,
                queued,
                disabled,
                ..
            } => {
                enable(ring, disabled)?;
                if let Some(d) = park {
                    if ring.completion().is_empty() {
                        let ts = types::Timespec::from(d);
                        let args = types::SubmitArgs::new().timespec(&ts);
                        match ring.submitter().submit_with_args(1, &args) {
                            Ok(_) => {}
                            Err(e)
                                if e.raw_os_error() == Some(libc::ETIME)
                                    || e.raw_os_error() == Some(libc::EINTR) => {}
                            Err(e) => return Err(e),
                        }
                        *queued = 0;
                    }
                } else {
                    flush(ring, queued)?;
                }
                // Completions the kernel could not fit in the CQ wait in its
                // overflow list until someone enters with GETEVENTS, which a
                // PPE that only peeks the CQ never does: a connection whose
                // readiness sat there would never be served.
                let sq = ring.submission();
                let stuck = sq.cq_overflow() || sq.taskrun();
                drop(sq);
                if stuck {
                    ring.submit()?;
                    *queued = 0;
                }
                let mut rearm = Vec::new();
                for cqe in ring.completion() {
                    let token = cqe.user_data();
                    if token == TOKEN_IGNORE {
                        continue;
                    }
                    let res = cqe.result();
                    if res == -libc::ECANCELED {
                        continue;
                    }
                    if res < 0 {
                        // The poll itself failed (a closed fd): report it as an
                        // error on that token.
                        out.push((
                            token,
                            Ready {
                                error: true,
                                ..Ready::default()
                            },
                        ));
                        continue;
                    }
                    if !io_uring::cqueue::more(cqe.flags()) {
                        // The kernel ended the multishot poll (overflow, …):
                        // ask again.
                        rearm.push(token);
                    }
                    out.push((token, ready_from_poll(res as u32)));
                }
                // Multishot polls the kernel ended are re-armed only for live
                // tokens: the PPE calls `rearm` itself, since only it knows
                // the fds.
                for t in rearm {
                    out.push((
                        t,
                        Ready {
                            rearm: true,
                            ..Ready::default()
                        },
                    ));
                }
                Ok(())
            }
            Poller::Epoll(ep) => epoll_wait(ep, out, park),
        }
    }

    /// Arms the multishot poll of `fd` again after the kernel ended it.
    pub fn rearm(&mut self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        match self {
            Poller::Uring { .. } => self.add(fd, token),
            Poller::Epoll(_) => Ok(()),
        }
    }
}

fn ready_from_poll(mask: u32) -> Ready {
    let m = mask as i16;
    Ready {
        readable: m & libc::POLLIN != 0,
        writable: m & libc::POLLOUT != 0,
        peer_closed: m & (libc::POLLRDHUP | libc::POLLHUP) != 0,
        error: m & libc::POLLERR != 0,
        rearm: false,
    }
}

fn push(ring: &mut IoUring, queued: &mut usize, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
    // SAFETY: the entry refers to no buffer (poll add/remove take an fd and
    // a token only), so nothing must outlive the submission.
    if unsafe { ring.submission().push(sqe) }.is_err() {
        flush(ring, queued)?;
        // SAFETY: as above.
        unsafe { ring.submission().push(sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full after a submit"))?;
    }
    *queued += 1;
    Ok(())
}

/// Enables a ring made disabled, on the thread that calls (which becomes its
/// single issuer).
fn enable(ring: &IoUring, disabled: &mut bool) -> io::Result<()> {
    if std::mem::take(disabled) {
        ring.submitter().register_enable_rings()?;
    }
    Ok(())
}

fn flush(ring: &mut IoUring, queued: &mut usize) -> io::Result<()> {
    if *queued > 0 {
        ring.submit()?;
        *queued = 0;
    }
    Ok(())
}

/// The wake-up eventfd a parked PPE also waits on.
pub struct Waker {
    fd: std::os::fd::OwnedFd,
}

impl Waker {
    /// A non-blocking eventfd.
    pub fn new() -> io::Result<Waker> {
        // SAFETY: eventfd has no pointer arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waker {
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            fd: unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) },
        })
    }

    /// Wakes the PPE (from any thread).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full
        // counter (EAGAIN) means it is already signalled.
        unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Consumes pending wake-ups (on the PPE).
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN when nothing pending.
        unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    }

    /// The descriptor, for registering with a poller.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The raw descriptor.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// One `epoll_wait` into `out` (the epoll backend of [`Poller::poll`]).
fn epoll_wait(ep: &Epoll, out: &mut Vec<(u64, Ready)>, park: Option<Duration>) -> io::Result<()> {
    let mut evs = [EpollEvent::empty(); 256];
    let timeout = match park {
        None => EpollTimeout::ZERO,
        Some(d) => EpollTimeout::from(d.as_millis().clamp(1, 1000) as u16),
    };
    let n = match ep.wait(&mut evs, timeout) {
        Ok(n) => n,
        Err(nix::errno::Errno::EINTR) => 0,
        Err(e) => return Err(e.into()),
    };
    for ev in &evs[..n] {
        let f = ev.events();
        out.push((
            ev.data(),
            Ready {
                readable: f.contains(EpollFlags::EPOLLIN),
                writable: f.contains(EpollFlags::EPOLLOUT),
                peer_closed: f.intersects(EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP),
                error: f.contains(EpollFlags::EPOLLERR),
                rearm: false,
            },
        ));
    }
    Ok(())
}
