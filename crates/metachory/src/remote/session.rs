//! The client's side of a running session ([`run`], with the pieces in
//! [`super::client`]): one event loop over every
//! server connection the session has (a *leg* each: the server that runs
//! the guest, and during a migration the target too), serving the
//! projection to each, writing the guest's stdout and stderr, and at the
//! guest's end staging its overlay and giving the verdict.
//!
//! A migration (`sidecore migrate`, through [`super::ctl`]) is led from
//! here: open the session on the target (`mx-open {resume}`, the next
//! endpoint number), and on its `resume-ready` pause stdin and ask the
//! source `migrate-out`; the target's output is held until the source's
//! `migrated` (which follows the source's last output), then everything
//! switches to the target: stdin (with what the old stream had not pushed),
//! signals, the overlay. `migrate-failed` (or a target that goes away)
//! leaves the guest where it was and lets stdin go on.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use sidecore_disco::stream::{Reader, Writer};
use sidecore_disco::{Endpoint, Engine, Msg};
use sidecore_wire::mx_msg::{MxBody, MxFrame, MxResume};
use sidecore_wire::session::OriginGrammar;
use sidecore_wire::{Link, Message, Received};

use super::client::{
    CLIENT_ENDPOINT, Cur, Raw, RemoteError, RemoteOptions, RemoteOutcome, SERVER_ENDPOINT, State,
    Verdict, ask, connect, forward_signals, open_for, send_disco_to, send_to, start_stdin,
    terminal_size,
};
use super::conn::{STDERR, STDIN, STDOUT, STREAM_WINDOW_BYTES, lock};
use super::ctl::{Asked, MigrateReply, MigrateRequest};
use super::export::Export;
use super::overlay::Staged;

/// How often a leg's reader looks whether its leg was dropped.
const LEG_POLL: Duration = Duration::from_millis(200);

/// What the loop receives.
enum Event {
    Frame(usize, Box<MxFrame>),
    /// The node sent an error (its text).
    Error(usize, String),
    /// The connection ended (cleanly, or with the error's text).
    Ended(usize, Option<String>),
    Migrate(Asked),
}

/// One server connection of the session.
struct Leg {
    link: Link<OriginGrammar>,
    server: u32,
    node: String,
    engine: Engine,
    out: Reader,
    err: Reader,
    /// Output waits (the target's, until the source's last arrived).
    held: bool,
    /// What a held leg sent that is for the guest's current server only
    /// (its end, its overlay, its residency): taken once it is current.
    early: Vec<MxBody>,
    gone: Arc<AtomicBool>,
}

/// A migration under way.
struct Mig {
    leg: usize,
    req: MigrateRequest,
    reply: mpsc::Sender<MigrateReply>,
    t0: Instant,
    asked_out: bool,
    switched: bool,
    /// Stdin window updates from the source while it captures the guest.
    deferred: Vec<u64>,
    result: MigrateReply,
}

/// Whether `body` is only for the guest's current server: a migration
/// target's such bodies wait for the switch (the target may report the
/// guest's end or its residency before the source's `migrated` arrives).
fn for_current(body: &MxBody) -> bool {
    matches!(
        body,
        MxBody::Exit { .. }
            | MxBody::Overlay { .. }
            | MxBody::OverlayEnd
            | MxBody::Resident { .. }
            | MxBody::Disco(Msg::Vnodewrite { .. })
    ) || matches!(body, MxBody::Disco(Msg::Streamstat { vnode, .. }) if *vnode == STDIN)
}

/// Runs `opts.argv` on the node; blocks until the guest ended and the
/// overlay was dealt with. `sidecore migrate` may move the guest meanwhile
/// (through [`super::ctl`]).
pub fn run(opts: &RemoteOptions) -> Result<RemoteOutcome, RemoteError> {
    let mut export = Export::new(&opts.project, Endpoint(CLIENT_ENDPOINT))?;
    let link = connect(&opts.addr, &opts.node)?;
    let tty = terminal_size();
    link.send(&Message::MxOpen(open_for(opts, SERVER_ENDPOINT, tty)))?;
    let state = Arc::new(State {
        session: opts.session,
        cur: Mutex::new(Cur {
            link: link.clone(),
            server: SERVER_ENDPOINT,
            stdin: Writer::new(STDIN, Endpoint(SERVER_ENDPOINT), STREAM_WINDOW_BYTES),
            paused: false,
        }),
        stdin_room: Condvar::new(),
        done: AtomicBool::new(false),
    });
    let _raw = Raw::enter(tty.is_some());
    let signals = forward_signals(Arc::clone(&state), tty.is_some());
    let mut session = Session::new(opts, Arc::clone(&state), &mut export, tty.is_some());
    session.add_leg(link, SERVER_ENDPOINT, &opts.node, false);
    if let Err(e) = super::ctl::serve(session.asks()) {
        tracing::info!("sidecore exec: no migration socket: {e}");
    }
    let r = session.run();
    state.done.store(true, Ordering::Release);
    state.stdin_room.notify_all();
    if let Some((h, t)) = signals {
        h.close();
        let _ = t.join();
    }
    r
}

pub(super) struct Session<'a> {
    opts: &'a RemoteOptions,
    state: Arc<State>,
    export: &'a mut Export,
    tty: bool,
    legs: Vec<Leg>,
    cur: usize,
    tx: mpsc::Sender<Event>,
    rx: mpsc::Receiver<Event>,
    staged: Option<Staged>,
    outcome: RemoteOutcome,
    exited: bool,
    stdin_started: bool,
    mig: Option<Mig>,
    next_server: u32,
}

impl<'a> Session<'a> {
    pub(super) fn new(
        opts: &'a RemoteOptions,
        state: Arc<State>,
        export: &'a mut Export,
        tty: bool,
    ) -> Self {
        let (tx, rx) = mpsc::channel();
        Session {
            opts,
            state,
            export,
            tty,
            legs: Vec::new(),
            cur: 0,
            tx,
            rx,
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
            mig: None,
            next_server: SERVER_ENDPOINT + 1,
        }
    }

    /// Where `sidecore migrate` requests go.
    pub(super) fn asks(&self) -> mpsc::Sender<Asked> {
        let (atx, arx) = mpsc::channel::<Asked>();
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for a in arx {
                if tx.send(Event::Migrate(a)).is_err() {
                    return;
                }
            }
        });
        atx
    }

    /// A server connection joins; a thread receives on it.
    pub(super) fn add_leg(
        &mut self,
        link: Link<OriginGrammar>,
        server: u32,
        node: &str,
        held: bool,
    ) -> usize {
        let i = self.legs.len();
        let gone = Arc::new(AtomicBool::new(false));
        let (tx, g, l) = (self.tx.clone(), Arc::clone(&gone), link.clone());
        std::thread::spawn(move || {
            while !g.load(Ordering::Acquire) {
                let ev = match l.recv(Some(LEG_POLL)) {
                    Ok(Received::Message(Message::Mx(f))) => Event::Frame(i, f),
                    Ok(Received::TimedOut) => continue,
                    Ok(Received::Message(Message::Error { error })) => Event::Error(i, error),
                    Ok(Received::Message(other)) => {
                        Event::Error(i, format!("sent `{}` in a session", other.kind()))
                    }
                    Ok(Received::Closed) => Event::Ended(i, None),
                    Err(e) => Event::Ended(i, Some(e.to_string())),
                };
                let last = !matches!(ev, Event::Frame(..));
                if tx.send(ev).is_err() || last {
                    return;
                }
            }
        });
        let peer = Endpoint(server);
        self.legs.push(Leg {
            link,
            server,
            node: node.to_string(),
            engine: Engine::new(Endpoint(CLIENT_ENDPOINT)),
            out: Reader::new(STDOUT, peer, STREAM_WINDOW_BYTES),
            err: Reader::new(STDERR, peer, STREAM_WINDOW_BYTES),
            held,
            early: Vec::new(),
            gone,
        });
        i
    }

    fn node_err(&self, i: usize, what: impl Into<String>) -> RemoteError {
        RemoteError::Node {
            node: self.legs[i].node.clone(),
            what: what.into(),
        }
    }

    fn leg_send(&self, i: usize, body: MxBody) -> Result<(), RemoteError> {
        let l = &self.legs[i];
        Ok(send_to(&l.link, self.state.session, l.server, body)?)
    }

    pub(super) fn run(&mut self) -> Result<RemoteOutcome, RemoteError> {
        loop {
            let Ok(ev) = self.rx.recv() else {
                return Err(self.node_err(self.cur, "the session's receivers stopped"));
            };
            match ev {
                Event::Frame(i, f) => {
                    if f.session != self.opts.session
                        || f.dst != CLIENT_ENDPOINT
                        || f.src != self.legs[i].server
                    {
                        return Err(self.node_err(
                            i,
                            format!(
                                "sent a frame for session {} from endpoint {} to {}, not to this session's client",
                                f.session, f.src, f.dst
                            ),
                        ));
                    }
                    if self.legs[i].held && for_current(&f.body) {
                        self.legs[i].early.push(f.body);
                    } else if self.on_body(i, f.body)? {
                        return Ok(self.outcome.clone());
                    }
                }
                Event::Error(i, e) if i == self.cur => return Err(self.node_err(i, e)),
                Event::Ended(i, why) if i == self.cur => return Err(self.lost(i, why)),
                Event::Error(i, e) | Event::Ended(i, Some(e)) => {
                    self.leg_lost(i, format!("{}: {e}", self.legs[i].node));
                }
                Event::Ended(i, None) => {
                    self.leg_lost(i, format!("{} closed the session", self.legs[i].node));
                }
                Event::Migrate((req, reply)) => self.start_migration(req, reply),
            }
        }
    }

    fn lost(&self, i: usize, why: Option<String>) -> RemoteError {
        match (why, self.exited) {
            (Some(e), false) => {
                self.node_err(i, format!("lost the session before the guest's end: {e}"))
            }
            (Some(e), true) => self.node_err(i, format!("lost the session: {e}")),
            (None, _) => self.node_err(i, "closed the session before the guest's end"),
        }
    }

    /// A leg other than the current one ended: the migration target's
    /// before it took the guest fails the migration; others are done.
    fn leg_lost(&mut self, i: usize, why: String) {
        if self.mig.as_ref().is_some_and(|m| m.leg == i && !m.switched) {
            self.mig_failed(format!("the target failed: {why}"));
        }
    }

    /// One body from leg `i`; true when the session is over.
    fn on_body(&mut self, i: usize, body: MxBody) -> Result<bool, RemoteError> {
        match body {
            MxBody::Lookup { req, path } => {
                let a = self.export.lookup(req, &path);
                self.leg_send(i, a)?;
            }
            MxBody::ReadDir { req, path } => {
                let a = self.export.readdir(req, &path);
                self.leg_send(i, a)?;
            }
            MxBody::ReadLink { req, path } => {
                let a = self.export.readlink(req, &path);
                self.leg_send(i, a)?;
            }
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
            MxBody::Denied { what } => eprintln!("sidecore exec: {}: {what}", self.legs[i].node),
            MxBody::Disco(m) => self.on_disco(i, m)?,
            MxBody::Exit {
                code,
                signal,
                summary,
            } if i == self.cur => {
                self.exited = true;
                self.outcome.code = code;
                self.outcome.signal = signal;
                self.outcome.summary = summary;
            }
            MxBody::Overlay { changes } if i == self.cur => {
                let staged = Staged::new(changes, &self.opts.project).map_err(|source| {
                    RemoteError::Overlay {
                        node: self.legs[i].node.clone(),
                        source,
                    }
                })?;
                self.staged = Some(staged);
            }
            MxBody::OverlayEnd if i == self.cur => {
                self.decide()?;
                return Ok(true);
            }
            MxBody::ResumeReady { pages, ticket } => self.ask_out(i, pages, ticket),
            MxBody::Migrated {
                freeze_us,
                image_bytes,
                pages_bytes,
            } if i == self.cur => {
                self.switch(freeze_us, image_bytes, pages_bytes)?;
                // What the target sent before the switch, in its order.
                let early = std::mem::take(&mut self.legs[self.cur].early);
                for b in early {
                    if self.on_body(self.cur, b)? {
                        return Ok(true);
                    }
                }
            }
            MxBody::MigrateFailed { reason } if i == self.cur => self.mig_failed(reason),
            MxBody::Resident { bytes, faults, .. } if i == self.cur => self.resident(bytes, faults),
            other => {
                return Err(self.node_err(
                    i,
                    format!("sent `{}`, which it may not send now", other.kind()),
                ));
            }
        }
        Ok(false)
    }

    /// Writes what leg `i`'s output streams hold, and acknowledges it.
    fn flush_leg(&mut self, i: usize) -> Result<(), RemoteError> {
        for vnode in [STDOUT, STDERR] {
            let l = &mut self.legs[i];
            let (r, mut sink): (&mut Reader, Box<dyn Write>) = if vnode == STDOUT {
                (&mut l.out, Box::new(io::stdout().lock()))
            } else {
                (&mut l.err, Box::new(io::stderr().lock()))
            };
            let (bytes, stat) = r.read(usize::MAX);
            if !bytes.is_empty() {
                let _ = sink.write_all(&bytes);
                let _ = sink.flush();
            }
            if let Some(s) = stat {
                send_disco_to(&l.link, self.state.session, l.server, vec![s])?;
            }
        }
        Ok(())
    }

    fn on_disco(&mut self, i: usize, m: Msg) -> Result<(), RemoteError> {
        match m {
            Msg::Streampush { vnode, data, eof } if vnode == STDOUT || vnode == STDERR => {
                let l = &mut self.legs[i];
                let r = if vnode == STDOUT {
                    &mut l.out
                } else {
                    &mut l.err
                };
                r.on_push(&data, eof)
                    .map_err(|e| self.node_err(i, e.to_string()))?;
                if !self.legs[i].held {
                    self.flush_leg(i)?;
                }
            }
            Msg::Streamstat { vnode, delta } if vnode == STDIN => {
                if i != self.cur {
                    return Ok(());
                }
                if let Some(m) = self.mig.as_mut().filter(|m| m.asked_out && !m.switched) {
                    m.deferred.push(delta);
                    return Ok(());
                }
                self.stdin_stat(delta)?;
            }
            Msg::Vnodewrite {
                vnode,
                offset,
                data,
            } if i == self.cur => {
                let node = self.legs[i].node.clone();
                let staged = self.staged.as_mut().ok_or_else(|| RemoteError::Node {
                    node: node.clone(),
                    what: "sent VNODEWRITE before the overlay's list".into(),
                })?;
                staged
                    .write(vnode.0, offset, &data)
                    .map_err(|source| RemoteError::Overlay { node, source })?;
            }
            m => self.coherence(i, m)?,
        }
        Ok(())
    }

    /// A window update for stdin: what it lets go goes out (in order,
    /// under the stream's lock).
    fn stdin_stat(&self, delta: u64) -> Result<(), RemoteError> {
        let mut c = lock(&self.state.cur);
        let out = c
            .stdin
            .on_stat(delta)
            .map_err(|e| self.node_err(self.cur, e.to_string()))?;
        send_disco_to(&c.link, self.state.session, c.server, out)?;
        drop(c);
        self.state.stdin_room.notify_all();
        Ok(())
    }

    /// DisCo for the projection's file regions (each leg has its engine).
    fn coherence(&mut self, i: usize, m: Msg) -> Result<(), RemoteError> {
        let peer = Endpoint(self.legs[i].server);
        if let m @ Msg::Request { .. } = &m
            && let Some(obj) = m.object()
            && !self.legs[i].engine.knows(obj)
        {
            let Some(data) = self.export.region(obj) else {
                return Err(
                    self.node_err(i, format!("asked for {obj}, which no projected file holds"))
                );
            };
            let me = Endpoint(CLIENT_ENDPOINT);
            self.legs[i].engine.create(obj, me, &[me, peer], data);
        }
        let l = &mut self.legs[i];
        l.engine.handle(peer, m).map_err(|e| RemoteError::Node {
            node: l.node.clone(),
            what: e.to_string(),
        })?;
        let out = l.engine.take_output();
        Ok(send_disco_to(&l.link, self.state.session, l.server, out)?)
    }

    fn start_migration(&mut self, req: MigrateRequest, reply: mpsc::Sender<MigrateReply>) {
        let fail = |what: String| {
            let _ = reply.send(MigrateReply {
                error: Some(what),
                ..MigrateReply::default()
            });
        };
        let refusal = if self.mig.is_some() {
            Some("a migration of this guest is already under way")
        } else if self.tty {
            Some("a guest on a terminal cannot migrate (not yet)")
        } else if self.opts.userns || self.opts.ptrace {
            Some("a guest under --userns or --ptrace cannot migrate (not yet)")
        } else if self.exited {
            Some("the guest has ended")
        } else {
            None
        };
        if let Some(r) = refusal {
            return fail(r.into());
        }
        let server = self.next_server;
        self.next_server += 1;
        let mut open = open_for(self.opts, server, None);
        open.route.clear();
        open.resume = Some(MxResume {
            from: self.legs[self.cur].server,
            lazy: req.lazy,
        });
        let link = match connect(&req.to, &req.node).and_then(|l| {
            l.send(&Message::MxOpen(open))
                .map(|()| l)
                .map_err(Into::into)
        }) {
            Ok(l) => l,
            Err(e) => return fail(e.to_string()),
        };
        let leg = self.add_leg(link, server, &req.node, true);
        self.mig = Some(Mig {
            leg,
            result: MigrateReply {
                node: req.node.clone(),
                lazy: req.lazy,
                ..MigrateReply::default()
            },
            req,
            reply,
            t0: Instant::now(),
            asked_out: false,
            switched: false,
            deferred: Vec::new(),
        });
    }

    /// The target is ready: stdin pauses and the source is asked to send
    /// the guest (on the current connection, after any stdin already sent).
    fn ask_out(&mut self, i: usize, pages: String, ticket: u64) {
        let (cur, exited) = (self.cur, self.exited);
        let Some(m) = self.mig.as_mut().filter(|m| m.leg == i && !m.asked_out) else {
            return;
        };
        if exited {
            return self.mig_failed("the guest has ended".into());
        }
        let target = self.legs[i].server;
        let lazy = m.req.lazy;
        let mut c = lock(&self.state.cur);
        c.paused = true;
        let body = MxBody::MigrateOut {
            to: pages,
            ticket,
            target,
            lazy,
        };
        let sent = send_to(&self.legs[cur].link, self.state.session, c.server, body);
        drop(c);
        match sent {
            Ok(()) => m.asked_out = true,
            Err(e) => self.mig_failed(format!("cannot ask the source: {e}")),
        }
    }

    /// The guest runs on the target now: everything goes there.
    fn switch(
        &mut self,
        freeze_us: u64,
        image_bytes: u64,
        pages_bytes: u64,
    ) -> Result<(), RemoteError> {
        let Some(m) = self.mig.as_mut().filter(|m| m.asked_out && !m.switched) else {
            return Err(self.node_err(self.cur, "said the guest migrated, which no one asked"));
        };
        let new = m.leg;
        m.switched = true;
        m.deferred.clear();
        m.result.freeze_us = freeze_us;
        m.result.image_bytes = image_bytes;
        m.result.pages_bytes = pages_bytes;
        {
            let mut c = lock(&self.state.cur);
            let (pending, eof) = c.stdin.take_pending();
            c.link = self.legs[new].link.clone();
            c.server = self.legs[new].server;
            c.stdin = Writer::new(STDIN, Endpoint(c.server), STREAM_WINDOW_BYTES);
            let mut out = c.stdin.write(&pending);
            if eof {
                out.extend(c.stdin.close());
            }
            c.paused = false;
            send_disco_to(&c.link, self.state.session, c.server, out)?;
        }
        self.state.stdin_room.notify_all();
        let old = self.cur;
        self.legs[old].gone.store(true, Ordering::Release);
        self.legs[old].link.shutdown_write();
        self.cur = new;
        self.legs[new].held = false;
        self.flush_leg(new)
    }

    fn mig_failed(&mut self, reason: String) {
        let Some(m) = self.mig.take() else { return };
        if !m.switched {
            self.legs[m.leg].gone.store(true, Ordering::Release);
            self.legs[m.leg].link.shutdown_write();
            lock(&self.state.cur).paused = false;
            for d in &m.deferred {
                let _ = self.stdin_stat(*d);
            }
            self.state.stdin_room.notify_all();
        }
        let _ = m.reply.send(MigrateReply {
            error: Some(reason),
            ..m.result
        });
    }

    fn resident(&mut self, bytes: u64, faults: u64) {
        let Some(m) = self.mig.take_if(|m| m.switched) else {
            return;
        };
        let mut r = m.result;
        r.resident_bytes = bytes;
        r.faults = faults;
        r.total_us = u64::try_from(m.t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        let _ = m.reply.send(r);
    }

    /// The verdict on the overlay, then the answer to the server.
    fn decide(&mut self) -> Result<(), RemoteError> {
        let node = self.legs[self.cur].node.clone();
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
        self.legs[self.cur].link.shutdown_write();
        Ok(())
    }
}
