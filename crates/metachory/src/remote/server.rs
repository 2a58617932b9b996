//! The server's side of `sidecore exec --on`: for one `mx-open` on the
//! daemon's node port, start the guest's container (`sidecore __mx-init`),
//! serve its FUSE projection from the client, supervise it, carry its stdio,
//! signals and terminal size, and at its end send its exit and its
//! write-back overlay, then wait for the client's verdict.
//!
//! If the client goes away the guest is killed (its init, and with it the
//! whole PID namespace) and the overlay is dropped: nothing was approved.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sidecore_disco::Msg;
use sidecore_wire::mx_msg::{MxBody, MxOpen};
use sidecore_wire::session::PeerGrammar;
use sidecore_wire::{Link, LinkError, Message, Received};

use super::conn::{Conn, OutStream, STDERR, STDIN, STDOUT, lock};
use super::freeze::Freeze;
use super::guard::Guard;
use super::hosted::{Init, Shared, started};
use super::migration;
use super::overlay;
use super::projection::Projection;
use super::shim::{CTL_FD, ShimSpec};
use crate::fdpass;

/// How long the client may take to give its verdict on the overlay.
const VERDICT_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the receiving loop looks at the daemon's stop flag.
const POLL: Duration = Duration::from_millis(200);
/// The unprivileged mode maps the guest's root to this user (nobody).
const NOBODY: u32 = 65534;
/// Signals a client may send to its guest.
const ALLOWED_SIGNALS: &[i32] = &[
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGCONT,
    libc::SIGTSTP,
    libc::SIGWINCH,
    libc::SIGKILL,
];

/// Where the server keeps sessions' work directories, and its own binary.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub state_dir: PathBuf,
    pub exe: PathBuf,
}

/// Why a session could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot set up the guest: {0}")]
    Io(#[from] std::io::Error),
    #[error("the guest's container failed: {0}")]
    Container(String),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("--cpu {cpu}: this node's daemon may not run on CPU {cpu} (it may use CPUs {usable})")]
    Cpu { cpu: u32, usable: String },
}

/// Serves one session; errors go back to the client.
pub fn serve(link: &Link<PeerGrammar>, open: &MxOpen, opts: &ServerOptions, stop: &AtomicBool) {
    if let Err(e) = run(link, open, opts, stop) {
        tracing::info!("mx session {}: {e}", open.session);
        let _ = link.send(&Message::Error {
            error: e.to_string(),
        });
    }
}

/// The guest's standard descriptors and the server's ends of them.
struct Stdio3 {
    guest: [OwnedFd; 3],
    /// Where stdin bytes go.
    input: OwnedFd,
    /// Where output comes from: stdout (and stderr, without a terminal).
    outputs: Vec<(OwnedFd, bool)>,
    /// The terminal's master side, for window sizes.
    master: Option<RawFd>,
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: new descriptors, ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn stdio(tty: Option<(u16, u16)>) -> std::io::Result<Stdio3> {
    if let Some((rows, cols)) = tty {
        let (mut m, mut s) = (0, 0);
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty fills two descriptors; the name buffer is unused.
        let r = unsafe {
            libc::openpty(
                &raw mut m,
                &raw mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                &raw const ws,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: new descriptors, ours.
        let (m, s) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
        let master = m.as_raw_fd();
        return Ok(Stdio3 {
            guest: [s.try_clone()?, s.try_clone()?, s],
            input: m.try_clone()?,
            outputs: vec![(m, false)],
            master: Some(master),
        });
    }
    let (i_r, i_w) = pipe()?;
    let (o_r, o_w) = pipe()?;
    let (e_r, e_w) = pipe()?;
    Ok(Stdio3 {
        guest: [i_r, o_w, e_w],
        input: i_w,
        outputs: vec![(o_r, false), (e_r, true)],
        master: None,
    })
}

/// Refuses a `--cpu` outside the CPUs this daemon may run on.
fn usable_cpu(cpu: u32) -> Result<(), ServerError> {
    sidecore_pe::cores::usable_cpu(cpu).map_err(|usable| ServerError::Cpu {
        cpu,
        usable: usable
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

fn spawn_shim(
    open: &MxOpen,
    opts: &ServerOptions,
    work: &std::path::Path,
    guest: [OwnedFd; 3],
    ctl: OwnedFd,
) -> std::io::Result<std::process::Child> {
    let spec = ShimSpec {
        work: work.to_path_buf(),
        project: open.project.clone(),
        cwd: open.cwd.clone(),
        argv: open.argv.clone(),
        env: open.env.clone(),
        tty: open.tty.is_some(),
        userns: open.userns,
        map_uid: NOBODY,
        map_gid: NOBODY,
        ptrace: open.ptrace,
        restore: open.resume.map(|r| r.lazy),
    };
    let json = serde_json::to_string(&spec).map_err(std::io::Error::other)?;
    let [i, o, e] = guest;
    let ctl_raw = ctl.as_raw_fd();
    let cpu = open.cpu;
    let mut cmd = Command::new(&opts.exe);
    cmd.arg("__mx-init")
        .arg(json)
        .stdin(Stdio::from(i))
        .stdout(Stdio::from(o))
        .stderr(Stdio::from(e))
        .env_clear();
    if open.resume.is_some() {
        // The restorer's glibc registers no rseq area of its own: the
        // migrated guest's is registered in its place.
        cmd.env("GLIBC_TUNABLES", "glibc.pthread.rseq=0");
    }
    // SAFETY: only dup2, fcntl, prctl and close_range between fork and exec
    // (async-signal-safe system calls).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(ctl_raw, CTL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing else the daemon holds reaches the guest (a descriptor
            // inherited without close-on-exec, such as a build tool's
            // jobserver pipe, would also stop its migration).
            libc::syscall(
                libc::SYS_close_range,
                CTL_FD + 1,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            // The container dies with the server (its init dies with it).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // `--cpu`: the container (and so the guest) on that CPU alone
            // (checked against the daemon's CPUs when the session opened).
            if let Some(c) = cpu {
                sidecore_pe::cores::pin_current_thread(c)?;
            }
            libc::fcntl(CTL_FD, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(ctl);
    Ok(child)
}

/// Inodes of the guest's stdio pipes (0 for a terminal).
fn inodes(guest: &[OwnedFd; 3], tty: bool) -> [u64; 3] {
    use std::os::unix::fs::MetadataExt;
    if tty {
        return [0; 3];
    }
    guest.each_ref().map(|fd| {
        fd.try_clone()
            .map(File::from)
            .and_then(|f| f.metadata())
            .map_or(0, |m| m.ino())
    })
}

fn run(
    link: &Link<PeerGrammar>,
    open: &MxOpen,
    opts: &ServerOptions,
    stop: &AtomicBool,
) -> Result<(), ServerError> {
    if let Some(cpu) = open.cpu {
        usable_cpu(cpu)?;
    }
    std::fs::create_dir_all(&opts.state_dir)?;
    let work = tempfile::Builder::new()
        .prefix(&format!("mx-{}-", open.session))
        .tempdir_in(&opts.state_dir)?;
    if open.userns {
        // The container's processes run as nobody: they build in here.
        std::os::unix::fs::chown(work.path(), Some(NOBODY), Some(NOBODY))?;
    }
    let io = stdio(open.tty)?;
    let (ours, theirs) = fdpass::seqpacket_pair()?;
    fdpass::pass_credentials(ours.as_raw_fd())?;
    let conn = Arc::new(Conn::new(
        link.clone(),
        open.session,
        open.server,
        open.client,
    ));
    let incoming = match open.resume {
        Some(_) => Some(migration::listen(link, open.session).map_err(container)?),
        None => None,
    };
    let shared = Arc::new(Shared {
        conn: Arc::clone(&conn),
        init: Init::default(),
        verdict: Mutex::new(None),
        stdin_ready: std::sync::Condvar::new(),
        master: io.master,
        failed: Mutex::new(None),
        guest: AtomicI32::new(0),
        stdio_inodes: inodes(&io.guest, open.tty.is_some()),
        freeze: Freeze::new()?,
        moved: AtomicBool::new(false),
        migrating: AtomicBool::new(false),
        prefill: Mutex::new(None),
        uffd: Mutex::new(None),
        installed: Mutex::new(None),
    });
    let mut shim = spawn_shim(open, opts, work.path(), io.guest, theirs)?;
    let stdin_t = stdin_writer(Arc::clone(&shared), io.input);
    let pumps: Vec<JoinHandle<()>> = io
        .outputs
        .into_iter()
        .map(|(fd, err)| pump(Arc::clone(&shared), fd, err))
        .collect();
    std::thread::scope(|scope| {
        let s = Arc::clone(&shared);
        scope.spawn(move || receive(&s, stop));
        let status = match control(&shared, &ours, open, incoming) {
            Ok(s) => s,
            Err(e) => {
                shared.init.signal(libc::SIGKILL);
                let _ = shim.kill();
                let _ = shim.wait();
                conn.close();
                shared.freeze.release(false);
                return Err(e);
            }
        };
        for p in pumps {
            let _ = p.join();
        }
        let _ = shim.wait();
        conn.close_stdin();
        shared.stdin_ready.notify_all();
        let _ = stdin_t.join();
        if shared.moved.load(Ordering::Acquire) {
            // The guest runs on another server now: its end here is not
            // the session's, and its overlay is not this server's to send.
            conn.close();
            return Ok(());
        }
        let result = finish(&shared, open, work.path(), status);
        conn.close();
        result
    })
}

/// The control socket's state: FUSE device, init, supervision, exit.
struct Ctl<'a> {
    shared: &'a Arc<Shared>,
    open: &'a MxOpen,
    ctl: RawFd,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<Mutex<String>>,
    supervision: &'static str,
    incoming: Option<crate::migrate::target::Incoming>,
}

fn control(
    shared: &Arc<Shared>,
    ctl: &OwnedFd,
    open: &MxOpen,
    incoming: Option<crate::migrate::target::Incoming>,
) -> Result<(i32, i32, String), ServerError> {
    let mut c = Ctl {
        shared,
        open,
        ctl: ctl.as_raw_fd(),
        threads: Vec::new(),
        counters: Arc::new(Mutex::new(String::new())),
        supervision: if open.ptrace {
            "ptrace-sysemu"
        } else {
            crate::SUPERVISION
        },
        incoming,
    };
    loop {
        let moved = shared.moved.load(Ordering::Acquire);
        if shared.conn.closed.load(Ordering::Acquire) && !moved {
            return Err(ServerError::Container("the client went away".into()));
        }
        let Some(m) = fdpass::recv(ctl.as_raw_fd())? else {
            if shared.moved.load(Ordering::Acquire) {
                return Ok((0, 0, String::new()));
            }
            let why = lock(&shared.failed)
                .take()
                .unwrap_or_else(|| "the container ended without reporting the guest's end".into());
            return Err(ServerError::Container(why));
        };
        if let Some(done) = c.on_message(m)? {
            for t in c.threads.drain(..) {
                let _ = t.join();
            }
            let summary = format!("supervision={} {}", c.supervision, lock(&c.counters));
            return Ok((done.0, done.1, summary));
        }
    }
}

impl Ctl<'_> {
    fn report(&self) -> impl Fn(String) + Send + Sync + 'static {
        let conn = Arc::clone(&self.shared.conn);
        move |what: String| {
            let _ = conn.send(MxBody::Denied { what });
        }
    }

    /// One message; the guest's (code, signal) when it ended.
    fn on_message(&mut self, m: fdpass::Received) -> Result<Option<(i32, i32)>, ServerError> {
        let text = String::from_utf8_lossy(&m.msg).into_owned();
        let (word, rest) = text.split_once(' ').unwrap_or((text.as_str(), ""));
        let conn = &self.shared.conn;
        match (word, m.fd) {
            ("fuse", Some(fd)) => {
                let fs = Projection::new(Arc::clone(conn), self.open.project.len());
                self.threads.push(std::thread::spawn(move || {
                    let mut s = fuser::Session::from_fd(fs, fd, fuser::SessionACL::All);
                    let _ = s.run();
                }));
            }
            ("init", _) => {
                if let Ok(pid) = rest.parse() {
                    self.shared.init.set(pid);
                }
            }
            ("uffd", Some(fd)) => *lock(&self.shared.uffd) = Some(fd),
            ("seccomp", Some(fd)) => self.seccomp(fd, m.pid)?,
            ("installed", _) => {
                if let Some(tx) = lock(&self.shared.installed).as_ref() {
                    let _ = tx.send(text.clone());
                }
            }
            ("ptrace", _) => {
                let Some(pid) = m.pid else {
                    return Err(ServerError::Container(
                        "the guest asked to be traced without credentials".into(),
                    ));
                };
                let (c, report, ctl) = (Arc::clone(&self.counters), self.report(), self.ctl);
                self.threads.push(std::thread::spawn(move || {
                    *lock(&c) = crate::ptrace::trace(pid, ctl, &report);
                }));
                started(conn, self.open, self.supervision).map_err(container)?;
            }
            ("exit", _) => {
                let mut it = rest.split(' ').filter_map(|x| x.parse::<i32>().ok());
                return Ok(Some((it.next().unwrap_or(1), it.next().unwrap_or(0))));
            }
            ("error", _) => return Err(ServerError::Container(rest.to_string())),
            _ => {
                return Err(ServerError::Container(format!(
                    "unexpected control message {text:?}"
                )));
            }
        }
        Ok(None)
    }

    /// The guest's seccomp listener: its supervisor starts; a new guest
    /// runs now, a migrating one is restored first.
    fn seccomp(&mut self, fd: OwnedFd, pid: Option<i32>) -> Result<(), ServerError> {
        if let Some(pid) = pid {
            self.shared.guest.store(pid, Ordering::Release);
        }
        let (c, userns, report) = (Arc::clone(&self.counters), self.open.userns, self.report());
        let cpu = self.open.cpu;
        self.threads.push(std::thread::spawn(move || {
            // `--cpu`: the supervisor beside its guest.
            if let Some(cpu) = cpu {
                let _ = sidecore_pe::cores::pin_current_thread(cpu);
            }
            let got = Guard::new(userns).serve(&fd, &report);
            *lock(&c) = got.to_string();
        }));
        let Some(incoming) = self.incoming.take() else {
            return started(&self.shared.conn, self.open, self.supervision).map_err(container);
        };
        let Some(pid) = pid else {
            return Err(ServerError::Container(
                "the restorer reported without credentials".into(),
            ));
        };
        let (shared, open, ctl, sup) = (
            Arc::clone(self.shared),
            self.open.clone(),
            self.ctl,
            self.supervision,
        );
        self.threads.push(std::thread::spawn(move || {
            migration::resume_in(&shared, &open, incoming, ctl, pid, sup);
        }));
        Ok(())
    }
}

/// A failure of the guest's container, for the client.
fn container(e: impl std::fmt::Display) -> ServerError {
    ServerError::Container(e.to_string())
}

/// Exit, overlay, verdict.
fn finish(
    shared: &Shared,
    open: &MxOpen,
    work: &std::path::Path,
    (code, signal, summary): (i32, i32, String),
) -> Result<(), ServerError> {
    let conn = &shared.conn;
    let c = |e: super::conn::ConnError| ServerError::Container(e.to_string());
    conn.send(MxBody::Exit {
        code,
        signal,
        summary,
    })
    .map_err(c)?;
    let uppers: Vec<(PathBuf, String)> = open
        .project
        .iter()
        .enumerate()
        .map(|(i, d)| (work.join("upper").join(i.to_string()), d.clone()))
        .collect();
    let (changes, files) = overlay::collect(&uppers, open.userns)?;
    conn.send(MxBody::Overlay { changes }).map_err(c)?;
    for (vnode, f) in files.iter().enumerate() {
        overlay::chunks(f, |offset, data| {
            conn.send(MxBody::Disco(Msg::Vnodewrite {
                vnode: sidecore_disco::VnodeId(vnode as u64),
                offset,
                data,
            }))
            .map_err(std::io::Error::other)
        })?;
    }
    conn.send(MxBody::OverlayEnd).map_err(c)?;
    let deadline = std::time::Instant::now() + VERDICT_TIMEOUT;
    while lock(&shared.verdict).is_none() && !conn.closed.load(Ordering::Acquire) {
        if std::time::Instant::now() > deadline {
            return Err(ServerError::Container(
                "no verdict on the overlay: dropped".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Waits up to `ms` for `fd` to be ready for `events` (or hung up), or for
/// `wake` to be readable (a migration asks the stdio threads to park).
fn ready(fd: RawFd, events: libc::c_short, wake: RawFd, ms: i32) -> std::io::Result<bool> {
    let mut p = [
        libc::pollfd {
            fd,
            events,
            revents: 0,
        },
        libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(p[0].revents != 0)
}

/// Reads the guest's output and pushes it to the client. For a migration
/// it pushes what is left in the pipe of the frozen guest and parks; if the
/// guest moved it ends without pushing the end of the stream.
fn pump(shared: Arc<Shared>, fd: OwnedFd, stderr: bool) -> JoinHandle<()> {
    let entered = shared.freeze.enter();
    std::thread::spawn(move || {
        let _member = shared.freeze.member(entered);
        let conn = &shared.conn;
        let s: &OutStream = if stderr { &conn.stderr } else { &conn.stdout };
        let mut f = File::from(fd);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let freezing = shared.freeze.requested();
            let ms = if freezing { 0 } else { POLL_MS };
            match ready(f.as_raw_fd(), libc::POLLIN, shared.freeze.waker(), ms) {
                Ok(true) => {}
                Ok(false) if freezing => {
                    if shared.freeze.park(Vec::new()) {
                        return;
                    }
                    continue;
                }
                Ok(false) => continue,
                Err(_) => break,
            }
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if conn.push(s, &buf[..n], false).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // EIO: the terminal's last user closed it.
                Err(_) => break,
            }
        }
        let _ = conn.push(s, &[], true);
    })
}

/// How often the stdio threads look at the session's flags, in ms.
const POLL_MS: i32 = 200;

/// Writes what the client sends for stdin (after any bytes a migrated
/// guest had not read), acknowledging as it goes; never blocks in a write,
/// so that a migration can park it with the bytes it holds.
fn stdin_writer(shared: Arc<Shared>, fd: OwnedFd) -> JoinHandle<()> {
    let entered = shared.freeze.enter();
    std::thread::spawn(move || {
        let _member = shared.freeze.member(entered);
        let conn = &shared.conn;
        // SAFETY: fcntl on our own end of the pipe (or terminal master).
        unsafe {
            let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let mut f = Some(File::from(fd));
        let mut pending: Vec<u8> = Vec::new();
        let mut ended = false;
        loop {
            if conn.closed.load(Ordering::Acquire) || conn.stdin_closed() {
                return;
            }
            if shared.freeze.requested() {
                if shared.freeze.park(std::mem::take(&mut pending)) {
                    return;
                }
                continue;
            }
            if let Some((pre, eof)) = lock(&shared.prefill).take() {
                pending.splice(0..0, pre);
                ended |= eof;
            }
            if !pending.is_empty() && f.is_some() {
                write_some(&mut f, &mut pending, shared.freeze.waker());
                continue;
            }
            pending.clear();
            if ended {
                // Our end closes (a pipe's reader sees the end; a terminal's
                // master stays open through the output pump's copy).
                return;
            }
            let (bytes, eof) = wait_stdin(&shared);
            pending = bytes;
            ended = eof;
        }
    })
}

/// Writes what the pipe takes now (waiting a little for room, unless a
/// migration asks the thread to park).
fn write_some(f: &mut Option<File>, pending: &mut Vec<u8>, wake: RawFd) {
    let Some(file) = f.as_mut() else { return };
    if !ready(file.as_raw_fd(), libc::POLLOUT, wake, POLL_MS).unwrap_or(false) {
        return;
    }
    match file.write(pending) {
        Ok(n) => {
            pending.drain(..n);
        }
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::Interrupted => {}
        Err(_) => {
            // The guest closed its stdin: drop what comes.
            *f = None;
            pending.clear();
        }
    }
}

/// The client's next stdin bytes (acknowledged), and whether they end it.
fn wait_stdin(shared: &Shared) -> (Vec<u8>, bool) {
    let conn = &shared.conn;
    let mut r = lock(&conn.stdin);
    while !conn.stdin_closed()
        && !conn.closed.load(Ordering::Acquire)
        && !r.at_eof()
        && r.buffered() == 0
        && !shared.freeze.requested()
        && lock(&shared.prefill).is_none()
    {
        r = shared
            .stdin_ready
            .wait_timeout(r, POLL)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
    let (bytes, stat) = r.read(usize::MAX);
    let eof = r.at_eof();
    drop(r);
    if let Some(s) = stat {
        let _ = conn.send_disco(vec![s]);
    }
    (bytes, eof)
}

/// Receives the client's messages for the whole session.
fn receive(shared: &Arc<Shared>, stop: &AtomicBool) {
    let conn = &shared.conn;
    loop {
        if stop.load(Ordering::Acquire) {
            shared.init.signal(libc::SIGKILL);
            conn.close();
            return;
        }
        if conn.closed.load(Ordering::Acquire) {
            return; // the session ended (or failed) on the server's side
        }
        let m = match conn.link().recv(Some(POLL)) {
            Ok(Received::Message(Message::Mx(f))) => f,
            Ok(Received::TimedOut) => continue,
            Ok(Received::Message(Message::Error { error })) => {
                *lock(&shared.failed) = Some(error);
                break;
            }
            Ok(_) => break,
            Err(e) => {
                *lock(&shared.failed) = Some(e.to_string());
                let _ = conn.link().send(&Message::Error {
                    error: e.to_string(),
                });
                break;
            }
        };
        if let Err(e) = dispatch(shared, m.body) {
            let _ = conn.link().send(&Message::Error { error: e });
            break;
        }
        if lock(&shared.verdict).is_some() {
            return;
        }
    }
    if shared.moved.load(Ordering::Acquire) {
        // The guest moved: the migration ends what is left here.
        return;
    }
    // The client is gone (or broke the protocol): the guest goes too.
    shared.init.signal(libc::SIGKILL);
    conn.close();
}

fn dispatch(shared: &Arc<Shared>, body: MxBody) -> Result<(), String> {
    let conn = &shared.conn;
    match body {
        MxBody::Attr { req, .. } | MxBody::Entries { req, .. } | MxBody::Target { req, .. } => {
            conn.answer(req, body);
        }
        MxBody::Disco(Msg::Streampush { vnode, data, eof }) if vnode == STDIN => {
            lock(&conn.stdin)
                .on_push(&data, eof)
                .map_err(|e| e.to_string())?;
            shared.stdin_ready.notify_all();
        }
        MxBody::Disco(Msg::Streamstat { vnode, delta }) if vnode == STDOUT || vnode == STDERR => {
            conn.on_stat(vnode, delta).map_err(|e| e.to_string())?;
        }
        MxBody::Disco(m) => conn.on_disco(m).map_err(|e| e.to_string())?,
        MxBody::Signal { sig } if ALLOWED_SIGNALS.contains(&sig) => shared.init.signal(sig),
        MxBody::Signal { sig } => return Err(format!("signal {sig} may not be sent to a guest")),
        MxBody::Winch { rows, cols } => {
            if let Some(m) = shared.master {
                let ws = libc::winsize {
                    ws_row: rows,
                    ws_col: cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                // SAFETY: TIOCSWINSZ on the terminal's master with a winsize.
                unsafe { libc::ioctl(m, libc::TIOCSWINSZ, &raw const ws) };
            }
        }
        MxBody::Verdict { applied } => *lock(&shared.verdict) = Some(applied),
        MxBody::MigrateOut {
            to,
            ticket,
            target,
            lazy,
        } => migration::start_out(shared, to, ticket, target, lazy),
        other => return Err(format!("a client may not send `{}`", other.kind())),
    }
    Ok(())
}
