//! The client's side of `sidecore exec --on NODE`: open a session on the
//! node's daemon, serve the projection of its directories, carry stdin,
//! stdout, stderr, signals and the terminal size, and at the guest's end
//! stage its write-back overlay and apply, show or discard it. These are
//! the pieces; [`super::session::run`] runs a session with them.

use std::io::{self, IsTerminal, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sidecore_disco::stream::Writer;
use sidecore_disco::{Endpoint, Msg};
use sidecore_wire::mx_msg::{MxBody, MxFrame, MxOpen};
use sidecore_wire::session::OriginGrammar;
use sidecore_wire::{Hello, Link, LinkError, Message};

use super::conn::lock;
use super::overlay::OverlayError;

/// How long connecting and the welcome may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The client's endpoint number in its sessions; the server's is next.
pub const CLIENT_ENDPOINT: u32 = 1;
pub const SERVER_ENDPOINT: u32 = 2;

/// What happens to the overlay at the guest's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write every change into the client's directories.
    Apply,
    /// Print a `diff -u` of the changes and apply nothing.
    Diff,
    /// Apply nothing.
    Discard,
    /// Ask on the terminal (discard when there is none).
    Ask,
}

/// A remote run's settings.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// `host:port` of the node (or of the first relay).
    pub addr: String,
    /// The node's name, for messages.
    pub node: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub project: Vec<PathBuf>,
    pub session: u64,
    pub userns: bool,
    pub ptrace: bool,
    /// Hops after the first node (relays forward to them).
    pub route: Vec<String>,
    pub verdict: Verdict,
    /// The server's CPU for the guest and its supervisor ([`MxOpen::cpu`]).
    pub cpu: Option<u32>,
}

/// How a remote run ended.
#[derive(Debug, Clone)]
pub struct RemoteOutcome {
    pub code: i32,
    /// The signal that killed the guest (0: it exited).
    pub signal: i32,
    /// The server's summary (supervision and counters).
    pub summary: String,
    pub supervision: String,
    pub projection: String,
    /// Changes in the overlay, and whether they were applied.
    pub changes: usize,
    pub applied: bool,
}

/// Why a remote run failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("{node}: {what}")]
    Node { node: String, what: String },
    #[error("{node} refused the overlay's changes: {source}")]
    Overlay {
        node: String,
        #[source]
        source: OverlayError,
    },
    #[error("{0}")]
    Local(#[from] io::Error),
}

/// Where the session's messages go now: the server that runs the guest
/// (another one after a migration), and the stdin stream to it.
pub(super) struct Cur {
    pub(super) link: Link<OriginGrammar>,
    pub(super) server: u32,
    pub(super) stdin: Writer,
    /// A migration is under way: stdin waits.
    pub(super) paused: bool,
}

pub(super) struct State {
    pub(super) session: u64,
    pub(super) cur: Mutex<Cur>,
    pub(super) stdin_room: Condvar,
    pub(super) done: AtomicBool,
}

impl State {
    /// Sends one body to the current server.
    pub(super) fn send(&self, body: MxBody) -> Result<(), LinkError> {
        let c = lock(&self.cur);
        send_to(&c.link, self.session, c.server, body)
    }
}

/// Sends one body from the client to endpoint `server` on `link`.
pub(super) fn send_to(
    link: &Link<OriginGrammar>,
    session: u64,
    server: u32,
    body: MxBody,
) -> Result<(), LinkError> {
    link.send(&Message::Mx(Box::new(MxFrame {
        session,
        src: CLIENT_ENDPOINT,
        dst: server,
        hops: 0,
        body,
    })))
}

/// Sends DisCo messages to endpoint `server` on `link`.
pub(super) fn send_disco_to(
    link: &Link<OriginGrammar>,
    session: u64,
    server: u32,
    out: Vec<(Endpoint, Msg)>,
) -> Result<(), LinkError> {
    for (_, m) in out {
        send_to(link, session, server, MxBody::Disco(m))?;
    }
    Ok(())
}

pub(super) fn terminal_size() -> Option<(u16, u16)> {
    if !io::stdin().is_terminal() {
        return None;
    }
    // SAFETY: winsize is plain data; TIOCGWINSZ fills it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ on stdin with a winsize buffer.
    let r = unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &raw mut ws) };
    (r == 0).then_some((ws.ws_row, ws.ws_col))
}

/// The terminal in raw mode for the run; restored on drop.
pub(super) struct Raw(Option<libc::termios>);

impl Raw {
    pub(super) fn enter(tty: bool) -> Raw {
        if !tty {
            return Raw(None);
        }
        // SAFETY: termios is plain data; tcgetattr fills it.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr/tcsetattr on stdin with a termios buffer.
        unsafe {
            if libc::tcgetattr(0, &raw mut t) != 0 {
                return Raw(None);
            }
            let saved = t;
            libc::cfmakeraw(&raw mut t);
            libc::tcsetattr(0, libc::TCSANOW, &raw const t);
            Raw(Some(saved))
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        if let Some(t) = self.0 {
            // SAFETY: restoring the saved settings on stdin.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw const t) };
        }
    }
}

/// Connects to a node's daemon (`addr`, named `node`) and awaits its welcome.
pub(super) fn connect(addr: &str, node: &str) -> Result<Link<OriginGrammar>, RemoteError> {
    let hello = Hello {
        origin: format!("mx-client.{}", std::process::id()),
        software: sidecore_wire::SOFTWARE_VERSION.to_string(),
    };
    let label = format!("node {node}");
    let link = Link::connect(addr, &label, hello, CONNECT_TIMEOUT)?;
    match link.expect(CONNECT_TIMEOUT)? {
        Message::Welcome(_) => Ok(link),
        Message::Error { error } => Err(RemoteError::Node {
            node: node.to_string(),
            what: error,
        }),
        other => Err(RemoteError::Node {
            node: node.to_string(),
            what: format!("answered the hello with `{}`", other.kind()),
        }),
    }
}

/// The session's `mx-open` for `opts` (server endpoint `server`).
pub(super) fn open_for(opts: &RemoteOptions, server: u32, tty: Option<(u16, u16)>) -> MxOpen {
    MxOpen {
        session: opts.session,
        client: CLIENT_ENDPOINT,
        server,
        argv: opts.argv.clone(),
        env: opts.env.clone(),
        cwd: opts.cwd.to_string_lossy().into_owned(),
        project: opts
            .project
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect(),
        tty,
        userns: opts.userns,
        ptrace: opts.ptrace,
        route: opts.route.clone(),
        resume: None,
        cpu: opts.cpu,
    }
}

/// Asks on the terminal whether to apply; no terminal: no.
pub(super) fn ask(lines: &[String]) -> Verdict {
    if !(io::stdin().is_terminal() && io::stderr().is_terminal()) {
        return Verdict::Ask;
    }
    eprintln!("sidecore exec: the guest changed:");
    for l in lines {
        eprintln!("  {l}");
    }
    eprint!("apply these changes? [y/N/d(iff)] ");
    let mut s = String::new();
    if io::stdin().read_line(&mut s).is_err() {
        return Verdict::Ask;
    }
    match s.trim() {
        "y" | "Y" | "yes" => Verdict::Apply,
        "d" | "diff" => Verdict::Diff,
        _ => Verdict::Ask,
    }
}

/// Reads stdin and pushes it to the guest within the stream's window (to
/// whichever server runs it: a migration pauses it, then points it at the
/// new one).
pub(super) fn start_stdin(state: Arc<State>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut stdin = io::stdin().lock();
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            let mut c = lock(&state.cur);
            while (c.paused || c.stdin.backlog() > 0) && !state.done.load(Ordering::Acquire) {
                c = state
                    .stdin_room
                    .wait_timeout(c, Duration::from_millis(200))
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
            if state.done.load(Ordering::Acquire) {
                return;
            }
            let out = if n == 0 {
                c.stdin.close()
            } else {
                c.stdin.write(&buf[..n])
            };
            if send_disco_to(&c.link, state.session, c.server, out).is_err() || n == 0 {
                return;
            }
        }
    });
}

type SignalThread = (signal_hook::iterator::Handle, std::thread::JoinHandle<()>);

/// Passes SIGINT, SIGTERM, SIGHUP and SIGQUIT on to the guest, and the
/// terminal's new size on SIGWINCH. With a terminal in raw mode, Ctrl-C is
/// a byte the guest's own terminal turns into SIGINT.
pub(super) fn forward_signals(state: Arc<State>, tty: bool) -> Option<SignalThread> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGWINCH};
    let mut s =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH]).ok()?;
    let h = s.handle();
    let t = std::thread::spawn(move || {
        for sig in s.forever() {
            let body = if sig == SIGWINCH {
                match (tty, terminal_size()) {
                    (true, Some((rows, cols))) => MxBody::Winch { rows, cols },
                    _ => continue,
                }
            } else {
                MxBody::Signal { sig }
            };
            let _ = state.send(body);
        }
    });
    Some((h, t))
}
