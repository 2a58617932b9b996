//! The client's side of `sidecore exec --on NODE`: open a session on the
//! node's daemon, serve the projection of its directories, carry stdin,
//! stdout, stderr, signals and the terminal size, and at the guest's end
//! stage its write-back overlay and apply, show or discard it.

use std::io::{self, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sidecore_disco::stream::{Reader, Writer};
use sidecore_disco::{Endpoint, Engine, Msg};
use sidecore_wire::mx_msg::{MxBody, MxFrame, MxOpen};
use sidecore_wire::session::OriginGrammar;
use sidecore_wire::{Hello, Link, LinkError, Message, Received};

use super::conn::{STDERR, STDIN, STDOUT, STREAM_WINDOW_BYTES, lock};
use super::export::Export;
use super::overlay::{OverlayError, Staged};

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

struct State {
    link: Link<OriginGrammar>,
    session: u64,
    stdin: Mutex<Writer>,
    stdin_room: Condvar,
    done: AtomicBool,
}

impl State {
    fn send(&self, body: MxBody) -> Result<(), LinkError> {
        self.link.send(&Message::Mx(Box::new(MxFrame {
            session: self.session,
            src: CLIENT_ENDPOINT,
            dst: SERVER_ENDPOINT,
            hops: 0,
            body,
        })))
    }

    fn send_disco(&self, out: Vec<(Endpoint, Msg)>) -> Result<(), LinkError> {
        for (_, m) in out {
            self.send(MxBody::Disco(m))?;
        }
        Ok(())
    }
}

fn terminal_size() -> Option<(u16, u16)> {
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
struct Raw(Option<libc::termios>);

impl Raw {
    fn enter(tty: bool) -> Raw {
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

/// Runs `opts.argv` on the node; blocks until the guest ended and the
/// overlay was dealt with.
pub fn run(opts: &RemoteOptions) -> Result<RemoteOutcome, RemoteError> {
    let mut export = Export::new(&opts.project, Endpoint(CLIENT_ENDPOINT))?;
    let hello = Hello {
        origin: format!("mx-client.{}", std::process::id()),
        software: sidecore_wire::SOFTWARE_VERSION.to_string(),
    };
    let label = format!("node {}", opts.node);
    let link = Link::connect(&opts.addr, &label, hello, CONNECT_TIMEOUT)?;
    match link.expect(CONNECT_TIMEOUT)? {
        Message::Welcome(_) => {}
        Message::Error { error } => {
            return Err(RemoteError::Node {
                node: opts.node.clone(),
                what: error,
            });
        }
        other => {
            return Err(RemoteError::Node {
                node: opts.node.clone(),
                what: format!("answered the hello with `{}`", other.kind()),
            });
        }
    }
    let tty = terminal_size();
    let open = MxOpen {
        session: opts.session,
        client: CLIENT_ENDPOINT,
        server: SERVER_ENDPOINT,
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
    };
    link.send(&Message::MxOpen(open))?;
    let state = Arc::new(State {
        link,
        session: opts.session,
        stdin: Mutex::new(Writer::new(
            STDIN,
            Endpoint(SERVER_ENDPOINT),
            STREAM_WINDOW_BYTES,
        )),
        stdin_room: Condvar::new(),
        done: AtomicBool::new(false),
    });
    let _raw = Raw::enter(tty.is_some());
    let signals = forward_signals(Arc::clone(&state), tty.is_some());
    let mut session = Session::new(opts, Arc::clone(&state), &mut export);
    let r = session.run();
    state.done.store(true, Ordering::Release);
    state.stdin_room.notify_all();
    if let Some((h, t)) = signals {
        h.close();
        let _ = t.join();
    }
    r
}

/// The receiving side of a session.
struct Session<'a> {
    opts: &'a RemoteOptions,
    state: Arc<State>,
    export: &'a mut Export,
    engine: Engine,
    out: Reader,
    err: Reader,
    staged: Option<Staged>,
    outcome: RemoteOutcome,
    exited: bool,
    stdin_started: bool,
}

impl<'a> Session<'a> {
    fn new(opts: &'a RemoteOptions, state: Arc<State>, export: &'a mut Export) -> Self {
        let server = Endpoint(SERVER_ENDPOINT);
        Session {
            opts,
            state,
            export,
            engine: Engine::new(Endpoint(CLIENT_ENDPOINT)),
            out: Reader::new(STDOUT, server, STREAM_WINDOW_BYTES),
            err: Reader::new(STDERR, server, STREAM_WINDOW_BYTES),
            staged: None,
            outcome: RemoteOutcome {
                code: 0,
                signal: 0,
                summary: String::new(),
                supervision: String::new(),
                projection: String::new(),
                changes: 0,
                applied: false,
            },
            exited: false,
            stdin_started: false,
        }
    }

    fn node_err(&self, what: impl Into<String>) -> RemoteError {
        RemoteError::Node {
            node: self.opts.node.clone(),
            what: what.into(),
        }
    }

    fn run(&mut self) -> Result<RemoteOutcome, RemoteError> {
        loop {
            let got = self.state.link.recv(None).map_err(|e| {
                if self.exited {
                    RemoteError::Link(e)
                } else {
                    self.node_err(format!("lost the session before the guest's end: {e}"))
                }
            })?;
            let f = match got {
                Received::Message(Message::Mx(f)) => f,
                Received::Message(Message::Error { error }) => return Err(self.node_err(error)),
                Received::Message(other) => {
                    return Err(self.node_err(format!("sent `{}` in a session", other.kind())));
                }
                Received::Closed => {
                    return Err(self.node_err("closed the session before the guest's end"));
                }
                Received::TimedOut => continue,
            };
            if f.session != self.opts.session || f.dst != CLIENT_ENDPOINT {
                return Err(self.node_err(format!(
                    "sent a frame for session {} endpoint {}, not this session's client",
                    f.session, f.dst
                )));
            }
            if self.on_body(f.body)? {
                return Ok(self.outcome.clone());
            }
        }
    }

    /// One body; true when the session is over.
    fn on_body(&mut self, body: MxBody) -> Result<bool, RemoteError> {
        let st = Arc::clone(&self.state);
        match body {
            MxBody::Lookup { req, path } => st.send(self.export.lookup(req, &path))?,
            MxBody::ReadDir { req, path } => st.send(self.export.readdir(req, &path))?,
            MxBody::ReadLink { req, path } => st.send(self.export.readlink(req, &path))?,
            MxBody::Started {
                supervision,
                projection,
                ..
            } => {
                self.outcome.supervision = supervision;
                self.outcome.projection = projection;
                if !self.stdin_started {
                    self.stdin_started = true;
                    start_stdin(Arc::clone(&self.state));
                }
            }
            MxBody::Denied { what } => eprintln!("sidecore exec: {}: {what}", self.opts.node),
            MxBody::Disco(m) => self.on_disco(m)?,
            MxBody::Exit {
                code,
                signal,
                summary,
            } => {
                self.exited = true;
                self.outcome.code = code;
                self.outcome.signal = signal;
                self.outcome.summary = summary;
            }
            MxBody::Overlay { changes } => {
                let staged = Staged::new(changes, &self.opts.project).map_err(|source| {
                    RemoteError::Overlay {
                        node: self.opts.node.clone(),
                        source,
                    }
                })?;
                self.staged = Some(staged);
            }
            MxBody::OverlayEnd => {
                self.decide()?;
                return Ok(true);
            }
            other => {
                return Err(self.node_err(format!(
                    "sent `{}`, which only a client sends",
                    other.kind()
                )));
            }
        }
        Ok(false)
    }

    fn on_disco(&mut self, m: Msg) -> Result<(), RemoteError> {
        let st = Arc::clone(&self.state);
        match m {
            Msg::Streampush { vnode, data, eof } if vnode == STDOUT || vnode == STDERR => {
                let (r, mut sink): (&mut Reader, Box<dyn Write>) = if vnode == STDOUT {
                    (&mut self.out, Box::new(io::stdout().lock()))
                } else {
                    (&mut self.err, Box::new(io::stderr().lock()))
                };
                r.on_push(&data, eof).map_err(|e| RemoteError::Node {
                    node: self.opts.node.clone(),
                    what: e.to_string(),
                })?;
                let (bytes, stat) = r.read(usize::MAX);
                let _ = sink.write_all(&bytes);
                let _ = sink.flush();
                if let Some(s) = stat {
                    st.send_disco(vec![s])?;
                }
            }
            Msg::Streamstat { vnode, delta } if vnode == STDIN => {
                // Sent under the writer's lock, so pushes keep their order.
                let mut w = lock(&st.stdin);
                let out = w.on_stat(delta).map_err(|e| self.node_err(e.to_string()))?;
                st.send_disco(out)?;
                drop(w);
                st.stdin_room.notify_all();
            }
            Msg::Vnodewrite {
                vnode,
                offset,
                data,
            } => {
                let node = self.opts.node.clone();
                let staged = self.staged.as_mut().ok_or_else(|| RemoteError::Node {
                    node: node.clone(),
                    what: "sent VNODEWRITE before the overlay's list".into(),
                })?;
                staged
                    .write(vnode.0, offset, &data)
                    .map_err(|source| RemoteError::Overlay { node, source })?;
            }
            m @ Msg::Request { .. } => {
                let Some(obj) = m.object() else { return Ok(()) };
                if !self.engine.knows(obj) {
                    let Some(data) = self.export.region(obj) else {
                        return Err(self
                            .node_err(format!("asked for {obj}, which no projected file holds")));
                    };
                    let me = Endpoint(CLIENT_ENDPOINT);
                    self.engine
                        .create(obj, me, &[me, Endpoint(SERVER_ENDPOINT)], data);
                }
                self.engine
                    .handle(Endpoint(SERVER_ENDPOINT), m)
                    .map_err(|e| self.node_err(e.to_string()))?;
                let out = self.engine.take_output();
                st.send_disco(out)?;
            }
            m => {
                self.engine
                    .handle(Endpoint(SERVER_ENDPOINT), m)
                    .map_err(|e| self.node_err(e.to_string()))?;
                let out = self.engine.take_output();
                st.send_disco(out)?;
            }
        }
        Ok(())
    }

    /// The verdict on the overlay, then the answer to the server.
    fn decide(&mut self) -> Result<(), RemoteError> {
        let node = self.opts.node.clone();
        let staged = self.staged.take().unwrap_or_default();
        staged.complete().map_err(|source| RemoteError::Overlay {
            node: node.clone(),
            source,
        })?;
        let lines = staged.summary();
        self.outcome.changes = lines.len();
        let verdict = match self.opts.verdict {
            Verdict::Ask if lines.is_empty() => Verdict::Discard,
            Verdict::Ask => ask(&lines),
            v => v,
        };
        match verdict {
            Verdict::Apply => {
                staged
                    .apply()
                    .map_err(|source| RemoteError::Overlay { node, source })?;
                self.outcome.applied = true;
            }
            Verdict::Diff => {
                staged.diff(&mut io::stdout().lock())?;
            }
            Verdict::Discard | Verdict::Ask => {
                if !lines.is_empty() && self.opts.verdict == Verdict::Ask {
                    eprintln!(
                        "sidecore exec: {} change(s) in the overlay were discarded (--apply writes them, --diff shows them):",
                        lines.len()
                    );
                    for l in &lines {
                        eprintln!("  {l}");
                    }
                }
            }
        }
        self.state.send(MxBody::Verdict {
            applied: self.outcome.applied,
        })?;
        self.state.link.shutdown_write();
        Ok(())
    }
}

/// Asks on the terminal whether to apply; no terminal: no.
fn ask(lines: &[String]) -> Verdict {
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

/// Reads stdin and pushes it to the guest within the stream's window.
fn start_stdin(state: Arc<State>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut stdin = io::stdin().lock();
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            let mut w = lock(&state.stdin);
            let out = if n == 0 {
                w.close()
            } else {
                w.write(&buf[..n])
            };
            if state.send_disco(out).is_err() {
                return;
            }
            while w.backlog() > 0 && !state.done.load(Ordering::Acquire) {
                w = state
                    .stdin_room
                    .wait_timeout(w, Duration::from_millis(200))
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
            if n == 0 || state.done.load(Ordering::Acquire) {
                return;
            }
        }
    });
}

type SignalThread = (signal_hook::iterator::Handle, std::thread::JoinHandle<()>);

/// Passes SIGINT, SIGTERM, SIGHUP and SIGQUIT on to the guest, and the
/// terminal's new size on SIGWINCH. With a terminal in raw mode, Ctrl-C is
/// a byte the guest's own terminal turns into SIGINT.
fn forward_signals(state: Arc<State>, tty: bool) -> Option<SignalThread> {
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
