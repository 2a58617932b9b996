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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sidecore_disco::Msg;
use sidecore_wire::mx_msg::{MxBody, MxOpen};
use sidecore_wire::session::PeerGrammar;
use sidecore_wire::{Link, LinkError, Message, Received};

use super::conn::{Conn, OutStream, STDERR, STDIN, STDOUT, lock};
use super::guard::Guard;
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
    };
    let json = serde_json::to_string(&spec).map_err(std::io::Error::other)?;
    let [i, o, e] = guest;
    let ctl_raw = ctl.as_raw_fd();
    let mut cmd = Command::new(&opts.exe);
    cmd.arg("__mx-init")
        .arg(json)
        .stdin(Stdio::from(i))
        .stdout(Stdio::from(o))
        .stderr(Stdio::from(e))
        .env_clear();
    // SAFETY: only dup2 and fcntl between fork and exec (async-signal-safe).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(ctl_raw, CTL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The container dies with the server (its init dies with it).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::fcntl(CTL_FD, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(ctl);
    Ok(child)
}

/// The guest's init, as a pidfd (signals reach it after it is reaped never).
#[derive(Default)]
struct Init(Mutex<Option<OwnedFd>>);

impl Init {
    fn set(&self, pid: i32) {
        // SAFETY: pidfd_open with a PID and no flags.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            // SAFETY: a new descriptor, ours.
            *lock(&self.0) = Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
    }

    fn signal(&self, sig: i32) {
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
struct Shared {
    conn: Arc<Conn>,
    init: Init,
    verdict: Mutex<Option<bool>>,
    stdin_ready: std::sync::Condvar,
    master: Option<RawFd>,
    failed: Mutex<Option<String>>,
}

fn run(
    link: &Link<PeerGrammar>,
    open: &MxOpen,
    opts: &ServerOptions,
    stop: &AtomicBool,
) -> Result<(), ServerError> {
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
    let shared = Arc::new(Shared {
        conn: Arc::clone(&conn),
        init: Init::default(),
        verdict: Mutex::new(None),
        stdin_ready: std::sync::Condvar::new(),
        master: io.master,
        failed: Mutex::new(None),
    });
    let mut shim = spawn_shim(open, opts, work.path(), io.guest, theirs)?;
    let stdin_t = stdin_writer(Arc::clone(&shared), io.input);
    let pumps: Vec<JoinHandle<()>> = io
        .outputs
        .into_iter()
        .map(|(fd, err)| pump(Arc::clone(&conn), fd, err))
        .collect();
    std::thread::scope(|scope| {
        let s = Arc::clone(&shared);
        scope.spawn(move || receive(&s, stop));
        let status = match control(&shared, &ours, open) {
            Ok(s) => s,
            Err(e) => {
                shared.init.signal(libc::SIGKILL);
                let _ = shim.kill();
                let _ = shim.wait();
                conn.close();
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
        let result = finish(&shared, open, work.path(), status);
        conn.close();
        result
    })
}

/// The control socket: FUSE device, init, supervision, exit.
fn control(
    shared: &Arc<Shared>,
    ctl: &OwnedFd,
    open: &MxOpen,
) -> Result<(i32, i32, String), ServerError> {
    let conn = &shared.conn;
    let mut threads = Vec::new();
    let counters = Arc::new(Mutex::new(String::new()));
    let supervision = if open.ptrace {
        "ptrace-sysemu"
    } else {
        crate::SUPERVISION
    };
    loop {
        if conn.closed.load(Ordering::Acquire) {
            return Err(ServerError::Container("the client went away".into()));
        }
        let Some(m) = fdpass::recv(ctl.as_raw_fd())? else {
            return Err(ServerError::Container(
                "the container ended without reporting the guest's end".into(),
            ));
        };
        let text = String::from_utf8_lossy(&m.msg).into_owned();
        let (word, rest) = text.split_once(' ').unwrap_or((text.as_str(), ""));
        match (word, m.fd) {
            ("fuse", Some(fd)) => {
                let fs = Projection::new(Arc::clone(conn), open.project.len());
                threads.push(std::thread::spawn(move || {
                    let mut s = fuser::Session::from_fd(fs, fd, fuser::SessionACL::All);
                    let _ = s.run();
                }));
            }
            ("init", _) => {
                if let Ok(pid) = rest.parse() {
                    shared.init.set(pid);
                }
            }
            ("seccomp", Some(fd)) => {
                let (c, userns, report_conn) =
                    (Arc::clone(&counters), open.userns, Arc::clone(conn));
                threads.push(std::thread::spawn(move || {
                    let report = move |what: String| {
                        let _ = report_conn.send(MxBody::Denied { what });
                    };
                    let got = Guard::new(userns).serve(&fd, &report);
                    *lock(&c) = got.to_string();
                }));
                started(conn, open, supervision)?;
            }
            ("ptrace", _) => {
                let Some(pid) = m.pid else {
                    return Err(ServerError::Container(
                        "the guest asked to be traced without credentials".into(),
                    ));
                };
                let (c, report_conn) = (Arc::clone(&counters), Arc::clone(conn));
                let ctl_raw = ctl.as_raw_fd();
                threads.push(std::thread::spawn(move || {
                    let report = move |what: String| {
                        let _ = report_conn.send(MxBody::Denied { what });
                    };
                    *lock(&c) = crate::ptrace::trace(pid, ctl_raw, &report);
                }));
                started(conn, open, supervision)?;
            }
            ("exit", _) => {
                let mut it = rest.split(' ').filter_map(|x| x.parse::<i32>().ok());
                let (code, sig) = (it.next().unwrap_or(1), it.next().unwrap_or(0));
                for t in threads {
                    let _ = t.join();
                }
                let summary = format!("supervision={supervision} {}", lock(&counters));
                return Ok((code, sig, summary));
            }
            ("error", _) => return Err(ServerError::Container(rest.to_string())),
            _ => {
                return Err(ServerError::Container(format!(
                    "unexpected control message {text:?}"
                )));
            }
        }
    }
}

fn started(conn: &Conn, open: &MxOpen, supervision: &str) -> Result<(), ServerError> {
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
    .map_err(|e| ServerError::Container(e.to_string()))
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

/// Reads the guest's output and pushes it to the client.
fn pump(conn: Arc<Conn>, fd: OwnedFd, stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let s: &OutStream = if stderr { &conn.stderr } else { &conn.stdout };
        let mut f = File::from(fd);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
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

/// Writes what the client sends for stdin, acknowledging as it goes.
fn stdin_writer(shared: Arc<Shared>, fd: OwnedFd) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let conn = &shared.conn;
        let mut f = Some(File::from(fd));
        loop {
            let mut r = lock(&conn.stdin);
            while !conn.stdin_closed()
                && !conn.closed.load(Ordering::Acquire)
                && !r.at_eof()
                && r.buffered() == 0
            {
                r = shared
                    .stdin_ready
                    .wait_timeout(r, POLL)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
            if conn.closed.load(Ordering::Acquire) || conn.stdin_closed() {
                return;
            }
            let (bytes, stat) = r.read(usize::MAX);
            let eof = r.at_eof();
            drop(r);
            if let Some(file) = f.as_mut()
                && !bytes.is_empty()
                && file.write_all(&bytes).is_err()
            {
                f = None; // the guest closed its stdin: drop what comes
            }
            if let Some(s) = stat {
                let _ = conn.send_disco(vec![s]);
            }
            if eof {
                if shared.master.is_none() {
                    f = None;
                }
                if bytes.is_empty() {
                    return;
                }
            }
        }
    })
}

/// Receives the client's messages for the whole session.
fn receive(shared: &Shared, stop: &AtomicBool) {
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
    // The client is gone (or broke the protocol): the guest goes too.
    shared.init.signal(libc::SIGKILL);
    conn.close();
}

fn dispatch(shared: &Shared, body: MxBody) -> Result<(), String> {
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
        other => return Err(format!("a client may not send `{}`", other.kind())),
    }
    Ok(())
}
