//! The server's part in `sidecore migrate` ([`crate::migrate`] does the
//! work). The client orchestrates: it opens the session on the target with
//! `mx-open {resume}`; the target builds the same container as for a new
//! guest, starts the restorer and answers `resume-ready {pages, ticket}`;
//! the client asks the source `migrate-out {to, ticket}`.
//!
//! **Source** ([`start_out`]): freeze the guest; let the output pumps push
//! what is left in their pipes and park, and the stdin writer hand back
//! what it had not written (with what the frozen guest had not read from
//! its pipe, and what the client sent that was not written yet: they travel
//! in the image); send it all; on the target's `restored`, tell the client
//! `migrated` — after the last of this server's stdout — and end the
//! container (lazily, once the target has every page). On any failure the
//! guest is thawed and goes on here, and the client hears `migrate-failed`.
//!
//! **Target** ([`resume_in`]): the image arrives on the page-stream
//! listener, the restorer becomes the guest, `started` goes to the client,
//! and `resident` once every page is here.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sidecore_disco::Msg;
use sidecore_wire::Link;
use sidecore_wire::mx_image::MxFdKind;
use sidecore_wire::mx_msg::{MxBody, MxOpen};
use sidecore_wire::session::PeerGrammar;

use super::conn::lock;
use super::hosted::{Shared, started};
use crate::migrate::checkpoint::{self, CaptureOptions, Frozen};
use crate::migrate::target::{self, Incoming, RestorerLink};
use crate::migrate::{Error, source};

/// Set to `image` in a daemon's environment, the daemon kills itself
/// (SIGKILL) when a migrating guest's image reaches it: the end-to-end
/// tests' target that dies mid-migration.
pub const TEST_DIE: &str = "SIDECORE_MX_TEST_DIE";
/// How long the stdio threads may take to park.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the restorer may take to install the descriptors.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The target's page-stream listener, on the address the client reached.
pub(super) fn listen(link: &Link<PeerGrammar>, session: u64) -> Result<Incoming, Error> {
    let ip = link
        .local_addr()
        .map_err(|e| Error::Refused(format!("the session's address: {e}")))?
        .ip();
    Incoming::listen(ip, session)
}

/// Source: a `migrate-out` arrived; the migration runs on its own thread
/// (the receiving loop must go on taking the client's window updates).
pub(super) fn start_out(shared: &Arc<Shared>, to: String, ticket: u64, target: u32, lazy: bool) {
    let conn = &shared.conn;
    if shared.migrating.swap(true, Ordering::AcqRel) {
        let _ = conn.send(MxBody::MigrateFailed {
            reason: "a migration of this guest is already under way".into(),
        });
        return;
    }
    let s = Arc::clone(shared);
    std::thread::spawn(move || {
        if let Err((reason, stat)) = migrate_out(&s, &to, ticket, lazy) {
            tracing::info!(
                "mx session {}: migration to endpoint {target} failed: {reason}",
                s.conn.session
            );
            let _ = s.conn.send(MxBody::MigrateFailed { reason });
            // Acknowledged only now: the client defers stdin window
            // updates while its guest moves.
            if let Some(m) = stat {
                let _ = s.conn.send(MxBody::Disco(*m));
            }
        }
        s.migrating.store(false, Ordering::Release);
    });
}

/// Why a migration out failed, and the stdin window update owed.
type OutError = (String, Option<Box<Msg>>);

fn migrate_out(shared: &Arc<Shared>, to: &str, ticket: u64, lazy: bool) -> Result<(), OutError> {
    let conn = &shared.conn;
    let pid = shared.guest.load(Ordering::Acquire);
    if pid == 0 {
        return Err(("the guest is not running yet".into(), None));
    }
    if shared.stdio_inodes == [0; 3] {
        return Err((
            "a guest on a terminal cannot migrate (not yet)".into(),
            None,
        ));
    }
    let opts = CaptureOptions {
        session: conn.session,
        lazy,
        stdio_inodes: shared.stdio_inodes,
    };
    let t0 = Instant::now();
    let mut frozen = checkpoint::freeze(pid, &opts).map_err(|e| (e.to_string(), None))?;
    shared.freeze.request();
    shared.stdin_ready.notify_all();
    if !shared.freeze.wait_parked(QUIESCE_TIMEOUT) {
        shared.freeze.release(false);
        let _ = frozen.thaw();
        return Err(("the session's stdio did not quiesce".into(), None));
    }
    let stat = stdin_state(shared, &mut frozen);
    match source::send(frozen, to, ticket, t0) {
        Ok((sent, lazy_serve)) => {
            shared.moved.store(true, Ordering::Release);
            shared.freeze.release(true);
            let _ = conn.send(MxBody::Migrated {
                freeze_us: u64::try_from(sent.freeze.as_micros()).unwrap_or(u64::MAX),
                image_bytes: sent.image_bytes,
                pages_bytes: sent.pages_bytes,
            });
            if let Some(l) = lazy_serve
                && let Err(e) = l.run()
            {
                tracing::warn!("mx session {}: serving pages lazily: {e}", conn.session);
            }
            // This server's part is over: the container goes.
            shared.init.signal(libc::SIGKILL);
            Ok(())
        }
        Err((frozen, e)) => {
            *lock(&shared.prefill) = Some((frozen.image.stdin_pending.clone(), false));
            let _ = frozen.thaw();
            shared.freeze.release(false);
            Err((e.to_string(), stat.map(Box::new)))
        }
    }
}

/// The guest's unread stdin, in order: what its pipe holds, what the
/// writer had not written, what the client sent that was not read yet; and
/// whether the client's stdin had ended. Returns the window update owed to
/// the client for the bytes taken (sent only if the guest stays).
fn stdin_state(shared: &Shared, f: &mut Frozen) -> Option<Msg> {
    let mut bytes = Vec::new();
    let fd = f.image.fds.iter().find_map(|d| match d.what {
        MxFdKind::Stdio { stream: 0 } => Some(d.fd),
        _ => None,
    });
    if let Some(n) = fd
        && let Ok(p) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(format!("/proc/{}/fd/{n}", f.pid()))
    {
        drain(p.as_raw_fd(), &mut bytes);
    }
    bytes.extend(shared.freeze.take_stdin());
    let mut r = lock(&shared.conn.stdin);
    let (rest, stat) = r.read(usize::MAX);
    bytes.extend(rest);
    f.image.stdin_eof = r.at_eof();
    f.image.stdin_pending = bytes;
    stat.map(|(_, m)| m)
}

/// Reads what a non-blocking descriptor holds now.
fn drain(fd: RawFd, out: &mut Vec<u8>) {
    let mut buf = [0u8; 64 * 1024];
    loop {
        // SAFETY: reading into a local buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
}

/// Target: brings the image in and lets the guest run (on failure, the
/// container is ended and the reason is the session's error).
pub(super) fn resume_in(
    shared: &Arc<Shared>,
    open: &MxOpen,
    incoming: Incoming,
    ctl: RawFd,
    pid: i32,
    supervision: &str,
) {
    let mut running = false;
    if let Err(e) = resume(shared, open, &incoming, ctl, pid, supervision, &mut running) {
        tracing::info!("mx session {}: migration in failed: {e}", open.session);
        if running {
            let _ = shared.conn.send(MxBody::Denied {
                what: format!("the guest lost its memory's source and was killed: {e}"),
            });
        }
        *lock(&shared.failed) = Some(format!("the guest could not migrate here: {e}"));
        shared.init.signal(libc::SIGKILL);
    }
}

#[allow(clippy::too_many_arguments)]
fn resume(
    shared: &Arc<Shared>,
    open: &MxOpen,
    incoming: &Incoming,
    ctl: RawFd,
    pid: i32,
    supervision: &str,
    running: &mut bool,
) -> Result<(), Error> {
    let conn = &shared.conn;
    let (tx, rx) = std::sync::mpsc::channel();
    *lock(&shared.installed) = Some(tx);
    let link_err = |e: super::conn::ConnError| Error::Refused(e.to_string());
    conn.send(MxBody::ResumeReady {
        pages: incoming.addr(),
        ticket: incoming.ticket,
    })
    .map_err(link_err)?;
    let arrived = incoming.accept(&|| conn.closed.load(Ordering::Acquire))?;
    if std::env::var_os(TEST_DIE).is_some_and(|v| v == "image") {
        // Fault injection for the tests: this server dies mid-migration.
        // SAFETY: kill with our own PID and a signal.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let t0 = Instant::now();
    *lock(&shared.prefill) = Some((arrived.image.stdin_pending.clone(), arrived.image.stdin_eof));
    shared.stdin_ready.notify_all();
    let installed = move || {
        rx.recv_timeout(INSTALL_TIMEOUT)
            .map_err(|_| Error::Refused("the restorer did not install the descriptors".into()))
    };
    let uffd = lock(&shared.uffd).take();
    let restored = target::restore(
        arrived,
        RestorerLink {
            pid,
            ctl,
            installed: &installed,
            uffd,
        },
    )?;
    *running = true;
    started(conn, open, supervision).map_err(|e| Error::Refused(e.to_string()))?;
    let (mut bytes, mut faults) = (restored.bytes, 0);
    if let Some(l) = restored.lazy.clone() {
        bytes += target::finish_lazy(&l, restored.arrived, pid)?;
        faults = l.stats.faults.load(Ordering::Relaxed);
    }
    conn.send(MxBody::Resident {
        bytes,
        faults,
        elapsed_us: u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX),
    })
    .map_err(link_err)
}
