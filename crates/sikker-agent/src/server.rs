//! The agent's Unix socket (`SOCK_SEQPACKET`: one datagram per message) around
//! the sans-IO [`AgentCore`]. On accept it attests the peer from
//! `SO_PEERCRED`, its cgroup and its executable. With `SO_PASSCRED` on, the
//! kernel attaches the real sender's pid to every message, so a socket passed
//! to another process is caught at its first message; before each message the
//! agent also checks that the attested process still runs the attested
//! executable (an `exec` ends the identity). Single-threaded: one `poll` loop.
//!
//! A readable connection is drained up to [`BATCH`] messages per turn; the
//! executable is checked once per batch, after the batch was read (so an
//! `exec` anywhere before the check refuses the whole batch), and the
//! accepted requests of a batch are answered with one [`FromAgent::Oks`] per
//! run of consecutive numbers instead of one answer each. The acceptance of a
//! lazy request ([`crate::proto::Request::lazy`], what `Client::post` sends)
//! is held back up to [`ACK_DELAY`] or until [`ACK_BATCH`] are waiting, so a
//! streaming sender is not woken for each one; a refusal, an eager request in
//! the batch or a `Sync` sends them at once.
//!
//! On a dedicated core ([`Server::set_busy_poll`]) the loop never sleeps: it
//! polls with a zero timeout, so a message is picked up without a wake-up —
//! HYDRA's offload of a service onto a core that would otherwise idle.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, MultiHeaders, SockFlag, SockType,
    UnixAddr, UnixCredentials, accept4, bind, getsockopt, listen, recvmsg, sendmmsg, sendmsg,
    setsockopt, socket, sockopt,
};

use crate::attest::{read_facts, reread_facts};
use crate::core::{AgentCore, ConnId, Effect};
use crate::links::{LinkEvent, Links};
use crate::proto::{self, Denied, FromAgent, MAX_MESSAGE_BYTES, Request};

/// Why a new connection is refused (sent to it as its reason, then closed).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("cannot read the peer's credentials: {0}")]
    Credentials(nix::Error),
    #[error(transparent)]
    Facts(#[from] crate::attest::AttestError),
    #[error(transparent)]
    Attach(#[from] crate::core::AttachError),
}

/// How long one `poll` waits before the loop checks its stop flag.
const POLL_MS: u16 = 100;
/// Connections waiting to be accepted.
const BACKLOG: i32 = 128;
/// Messages read from one connection per turn, before the others get theirs.
const BATCH: usize = 64;
/// How long the acceptance of a lazy request may wait for company.
const ACK_DELAY: std::time::Duration = std::time::Duration::from_micros(500);
/// How many held-back acceptances are sent without waiting longer.
const ACK_BATCH: usize = 64;

/// The server: the core, the listening socket and the attached connections.
pub struct Server {
    core: AgentCore,
    listener: OwnedFd,
    path: PathBuf,
    proc_root: PathBuf,
    conns: HashMap<ConnId, OwnedFd>,
    next: ConnId,
    epoch: Instant,
    on_turn: Option<TurnHook>,
    links: Option<Links>,
    /// One receive buffer, reused.
    buf: Vec<u8>,
    /// Spin instead of sleeping in `poll` (a dedicated core).
    busy: bool,
    /// Acceptances held back per connection, and since when.
    acks: HashMap<ConnId, (Vec<u64>, Instant)>,
}

/// Encoded deliveries to one receiver, each with the index of the message
/// (in its batch) it carries.
type Queue = Vec<(Vec<u8>, usize)>;

/// One message's effects, and whether its sender waits for the answer.
type Handled = (Vec<Effect>, bool);

/// One message read from a connection: its bytes decoded (or why not) and
/// the pid the kernel says sent it.
type Received = (Result<Request, proto::DecodeError>, Option<i32>);

/// Called with the core once per turn.
type TurnHook = Box<dyn FnMut(&mut AgentCore) + Send>;

/// An I/O failure of the server, with what it was doing.
#[derive(Debug, thiserror::Error)]
#[error("sikker agent socket {path}: {what}: {source}")]
pub struct ServerError {
    path: String,
    what: &'static str,
    #[source]
    source: std::io::Error,
}

impl Server {
    /// Listens on `path` (a stale socket file there is replaced), open to
    /// every local user: who may do what is the policy's to say, per process.
    pub fn bind(core: AgentCore, path: &Path) -> Result<Server, ServerError> {
        let err = |what, e: nix::Error| ServerError {
            path: path.display().to_string(),
            what,
            source: std::io::Error::from(e),
        };
        let _ = std::fs::remove_file(path);
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| err("socket", e))?;
        let addr = UnixAddr::new(path).map_err(|e| err("address", e))?;
        bind(fd.as_raw_fd(), &addr).map_err(|e| err("bind", e))?;
        listen(
            &fd,
            nix::sys::socket::Backlog::new(BACKLOG).map_err(|e| err("listen", e))?,
        )
        .map_err(|e| err("listen", e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(
            |source| ServerError {
                path: path.display().to_string(),
                what: "chmod",
                source,
            },
        )?;
        let mut server = Server {
            core,
            listener: fd,
            path: path.to_path_buf(),
            proc_root: PathBuf::from("/proc"),
            conns: HashMap::new(),
            next: 1,
            epoch: Instant::now(),
            on_turn: None,
            links: None,
            buf: vec![0u8; MAX_MESSAGE_BYTES + 1],
            busy: false,
            acks: HashMap::new(),
        };
        // Re-attestation after an update judges each process where it is now.
        let root = server.proc_root.clone();
        server
            .core
            .set_facts_reader(Box::new(move |f| reread_facts(&root, f)));
        Ok(server)
    }

    /// The core, for its counters.
    pub fn core(&self) -> &AgentCore {
        &self.core
    }

    /// The core, to change it between turns.
    pub fn core_mut(&mut self) -> &mut AgentCore {
        &mut self.core
    }

    /// Calls `f` with the core once per turn (at least every `POLL_MS`), on
    /// the server's thread: how policy updates reach a running agent.
    pub fn set_on_turn(&mut self, f: impl FnMut(&mut AgentCore) + Send + 'static) {
        self.on_turn = Some(Box::new(f));
    }

    /// Busy-polls (for an agent pinned to a core of its own): `poll` never
    /// waits, so messages are taken as they arrive, at the price of the whole
    /// core.
    pub fn set_busy_poll(&mut self, on: bool) {
        self.busy = on;
    }

    /// Links this agent to the other hosts' agents through `links`.
    pub fn with_links(mut self, links: Links) -> Server {
        self.links = Some(links);
        self
    }

    /// The links, if any (for their address and counters).
    pub fn links(&self) -> Option<&Links> {
        self.links.as_ref()
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Serves until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), ServerError> {
        while !stop.load(Ordering::Acquire) {
            self.turn()?;
        }
        let _ = std::fs::remove_file(&self.path);
        Ok(())
    }

    /// One `poll` and everything it reports.
    pub fn turn(&mut self) -> Result<(), ServerError> {
        if let Some(f) = self.on_turn.as_mut() {
            f(&mut self.core);
        }
        // A new placement: the links follow its hosts and agents' addresses.
        if self.core.take_peers_changed()
            && let Some(l) = self.links.as_mut()
        {
            let known = self.core.peer_hosts().into_iter().collect();
            l.set_peers(known, self.core.agents(), Instant::now());
        }
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        // Held messages wait for tokens, links for heartbeats: wake for them.
        let wait = if self.busy {
            0
        } else if self.core.holding() || !self.acks.is_empty() {
            1
        } else if self.links.is_some() {
            20
        } else {
            POLL_MS
        };
        let mut link_ready = Vec::new();
        let ready: Vec<(Option<ConnId>, bool)> = {
            let mut fds = vec![PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
            fds.extend(
                ids.iter()
                    .map(|c| PollFd::new(self.conns[c].as_fd(), PollFlags::POLLIN)),
            );
            let n_local = fds.len();
            if let Some(l) = &self.links {
                fds.extend(l.poll_fds());
            }
            match poll(&mut fds, PollTimeout::from(wait)) {
                Ok(0) | Err(nix::Error::EINTR) => {
                    drop(fds);
                    self.after_poll(Vec::new());
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(ServerError {
                        path: self.path.display().to_string(),
                        what: "poll",
                        source: e.into(),
                    });
                }
            }
            link_ready.extend(
                fds.iter()
                    .enumerate()
                    .skip(n_local)
                    .filter(|(_, f)| f.revents().is_some_and(|r| !r.is_empty()))
                    .map(|(i, _)| i - n_local),
            );
            fds.iter()
                .take(n_local)
                .enumerate()
                .filter(|(_, f)| f.revents().is_some_and(|r| !r.is_empty()))
                .map(|(i, f)| {
                    let hup = f
                        .revents()
                        .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
                    ((i > 0).then(|| ids[i - 1]), hup)
                })
                .collect()
        };
        for (conn, hup) in ready {
            match conn {
                None => self.accept(),
                Some(c) => self.readable(c, hup),
            }
        }
        self.after_poll(link_ready);
        Ok(())
    }

    /// The links' readiness and upkeep, held messages whose tokens came, and
    /// what the core has for other agents.
    fn after_poll(&mut self, link_ready: Vec<usize>) {
        let now = Instant::now();
        let mut events = Vec::new();
        if let Some(l) = self.links.as_mut() {
            for i in link_ready {
                l.ready(i, now, &mut events);
            }
            l.maintain(now, &mut events);
        }
        for e in events {
            let now_ns = self.now_ns();
            match e {
                LinkEvent::Up(h) => {
                    eprintln!("sikker agent {}: linked to host {h}", self.core.host());
                    self.core.linked(&h, now_ns);
                }
                LinkEvent::Down(h, why) => {
                    eprintln!(
                        "sikker agent {}: link to host {h} down: {why}",
                        self.core.host()
                    );
                    let effects = self.core.unlinked(&h, now_ns);
                    self.send_all(effects);
                }
                LinkEvent::Refused(who, why) => {
                    eprintln!(
                        "sikker agent {}: refused agent {who}: {why}",
                        self.core.host()
                    );
                }
                LinkEvent::Msg(h, m) => {
                    let r = self.core.on_peer(&h, m, now_ns);
                    let delivered = self.send_all(r.effects);
                    if let Some(fid) = r.delivery_of {
                        self.core.forward_delivered(&h, fid, delivered);
                    }
                }
            }
        }
        let now_ns = self.now_ns();
        for (from, effects) in self.core.tick(now_ns) {
            self.apply(from, effects);
        }
        let out = self.core.take_outbox();
        if let Some(l) = self.links.as_mut() {
            for (h, m) in out {
                l.send(&h, &m, now);
            }
        }
        let due: Vec<ConnId> = self
            .acks
            .iter()
            .filter(|(_, (_, since))| since.elapsed() >= ACK_DELAY)
            .map(|(c, _)| *c)
            .collect();
        for c in due {
            self.flush_acks(c, &[]);
        }
    }

    /// Sends effects; whether every delivery among them went out.
    fn send_all(&mut self, effects: Vec<Effect>) -> bool {
        let mut all = true;
        for e in effects {
            let is_delivery = matches!(e.msg, FromAgent::Deliver { .. });
            let sent = self.conns.get(&e.to).is_some_and(|fd| send(fd, &e.msg));
            all &= sent || !is_delivery;
        }
        all
    }

    fn accept(&mut self) {
        let Ok(raw) = accept4(self.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) else {
            return;
        };
        // SAFETY: `accept4` returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let conn = self.next;
        self.next += 1;
        let attested = getsockopt(&fd, sockopt::PeerCredentials)
            .map_err(Refusal::Credentials)
            .and_then(|cred| {
                let _ = setsockopt(&fd, sockopt::PassCred, &true);
                Ok(read_facts(&self.proc_root, cred.pid(), cred.uid())?)
            })
            .and_then(|facts| Ok(self.core.attach(conn, &facts)?));
        match attested {
            Ok(id) => {
                send(&fd, &FromAgent::Attached(id));
                self.conns.insert(conn, fd);
            }
            // Refused: say why, then close.
            Err(why) => {
                send(&fd, &FromAgent::Refused(why.to_string()));
            }
        }
    }

    fn close(&mut self, conn: ConnId) {
        self.core.detach(conn);
        self.conns.remove(&conn);
        self.acks.remove(&conn);
    }

    /// Messages (or the close) on an attached connection: up to [`BATCH`]
    /// of them, checked and handled together.
    fn readable(&mut self, conn: ConnId, hup: bool) {
        let mut batch: Vec<Received> = Vec::new();
        let mut gone = false;
        while batch.len() < BATCH {
            let Some(fd) = self.conns.get(&conn) else {
                return;
            };
            let mut space = nix::cmsg_space!(UnixCredentials);
            let mut iov = [IoSliceMut::new(&mut self.buf)];
            let r = recvmsg::<()>(
                fd.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_DONTWAIT,
            );
            match r {
                Ok(m) if m.bytes > 0 => {
                    let sender = m.cmsgs().ok().and_then(|mut c| {
                        c.find_map(|m| match m {
                            ControlMessageOwned::ScmCredentials(u) => Some(u.pid()),
                            _ => None,
                        })
                    });
                    let len = m.bytes;
                    batch.push((proto::decode(&self.buf[..len]), sender));
                }
                Err(nix::Error::EAGAIN) => {
                    gone = hup;
                    break;
                }
                // 0 bytes, an error or a hang-up: the process is gone.
                _ => {
                    gone = true;
                    break;
                }
            }
        }
        if !batch.is_empty() {
            let per_message = self.check_and_handle(conn, batch);
            self.apply_batch(conn, per_message);
        }
        if gone {
            self.close(conn);
        }
    }

    /// The per-message identity checks, then the core: the effects of each
    /// message in turn.
    fn check_and_handle(&mut self, conn: ConnId, batch: Vec<Received>) -> Vec<Handled> {
        let Some((pid, exe)) = self.core.attested(conn).map(|(p, e)| (p, e.to_path_buf())) else {
            // Its identity ended (a policy update): each message is refused
            // as from no identity, and the connection goes.
            let now_ns = self.now_ns();
            return batch
                .into_iter()
                .filter_map(|(r, _)| r.ok())
                .map(|r| (self.core.handle(conn, r.id, r.body, now_ns), false))
                .collect();
        };
        let now = std::fs::read_link(self.proc_root.join(pid.to_string()).join("exe"));
        if now.as_deref().ok() != Some(exe.as_path()) {
            let id = batch
                .first()
                .and_then(|(r, _)| r.as_ref().ok().map(|r| r.id));
            let d = Denied::Exec {
                pid,
                attested: exe.display().to_string(),
                now: now.map_or_else(|e| e.to_string(), |p| p.display().to_string()),
            };
            let e = self.core.deny(conn, id, d);
            self.core.detach(conn);
            return vec![(vec![e], false)];
        }
        let mut out = Vec::with_capacity(batch.len());
        for (req, sender) in batch {
            let id = req.as_ref().ok().map(|r| r.id);
            let lazy = req.as_ref().is_ok_and(|r| r.lazy);
            out.push((
                if sender != Some(pid) {
                    let d = Denied::PassedSocket {
                        attached: pid,
                        sender: sender.unwrap_or(-1),
                    };
                    vec![self.core.deny(conn, id, d)]
                } else {
                    match req {
                        Ok(r) => {
                            let now_ns = self.now_ns();
                            self.core.handle(conn, r.id, r.body, now_ns)
                        }
                        Err(e) => {
                            vec![self.core.deny(conn, None, Denied::Malformed(e.to_string()))]
                        }
                    }
                },
                lazy,
            ));
        }
        out
    }

    /// Sends the effects of one message (a held one whose tokens came).
    fn apply(&mut self, from: ConnId, effects: Vec<Effect>) {
        self.apply_batch(from, vec![(effects, false)]);
    }

    /// Sends the effects of a batch of `from`'s messages, one list per
    /// message: the deliveries to each receiver together (one `sendmmsg`),
    /// then the verdicts. A delivery the receiver cannot take turns its
    /// message's `Ok` into a denial, and so does every later one to that
    /// receiver in the batch, so nothing is lost silently and nothing
    /// arrives out of order; the other `Ok`s go out as runs
    /// ([`Server::send_oks`]), at once if any request of the batch is eager,
    /// else held back with the connection's other lazy ones.
    fn apply_batch(&mut self, from: ConnId, per_message: Vec<Handled>) {
        let n = per_message.len();
        let eager = per_message.iter().any(|(_, lazy)| !lazy);
        // Encoded deliveries by receiver, each with the message it carries.
        let mut queued: Vec<(ConnId, Queue)> = Vec::new();
        let mut verdicts: Vec<Option<u64>> = vec![None; n];
        for (i, (effects, _)) in per_message.into_iter().enumerate() {
            for e in effects {
                match e.msg {
                    FromAgent::Ok(id) if e.to == from => verdicts[i] = Some(id),
                    m @ FromAgent::Deliver { .. } => {
                        let bytes = proto::encode(&m);
                        match queued.iter_mut().find(|(c, _)| *c == e.to) {
                            Some((_, q)) => q.push((bytes, i)),
                            None => queued.push((e.to, vec![(bytes, i)])),
                        }
                    }
                    m => {
                        if let Some(fd) = self.conns.get(&e.to) {
                            send(fd, &m);
                        }
                    }
                }
            }
        }
        let mut undelivered = vec![false; n];
        for (to, q) in &queued {
            let sent = self.conns.get(to).map_or(0, |fd| send_many(fd, q));
            for (_, i) in &q[sent..] {
                undelivered[*i] = true;
            }
        }
        let mut oks = Vec::with_capacity(n);
        for (i, v) in verdicts.into_iter().enumerate() {
            match v {
                Some(id) if undelivered[i] => {
                    let e = self.core.delivery_failed(from, id);
                    if let Some(fd) = self.conns.get(&from) {
                        send(fd, &e.msg);
                    }
                }
                Some(id) => oks.push(id),
                None => {}
            }
        }
        if eager {
            self.flush_acks(from, &oks);
        } else if !oks.is_empty() {
            let (held, _) = self
                .acks
                .entry(from)
                .or_insert_with(|| (Vec::new(), Instant::now()));
            held.extend(oks);
            if held.len() >= ACK_BATCH {
                self.flush_acks(from, &[]);
            }
        }
        if !self.conns.is_empty() && self.core.attested(from).is_none() {
            // The identity ended (an exec): the connection goes too.
            self.conns.remove(&from);
        }
    }

    /// Sends `conn`'s held-back acceptances, then `more`.
    fn flush_acks(&mut self, conn: ConnId, more: &[u64]) {
        match self.acks.remove(&conn) {
            Some((mut held, _)) => {
                held.extend_from_slice(more);
                self.send_oks(conn, &held);
            }
            None => self.send_oks(conn, more),
        }
    }

    /// Answers the accepted requests `ids` (in the order handled): one `Ok`
    /// for a lone number, one `Oks` per run of consecutive ones.
    fn send_oks(&self, to: ConnId, ids: &[u64]) {
        let Some(fd) = self.conns.get(&to) else {
            return;
        };
        for run in ids.chunk_by(|a, b| b.checked_sub(*a) == Some(1)) {
            let msg = match run {
                [one] => FromAgent::Ok(*one),
                [first, .., last] => FromAgent::Oks {
                    first: *first,
                    last: *last,
                },
                [] => continue,
            };
            send(fd, &msg);
        }
    }
}

/// Sends encoded messages in order without blocking, with as few
/// `sendmmsg` calls as it takes; how many went out (the rest did not: the
/// receiver's queue is full or it has gone).
fn send_many(fd: &OwnedFd, msgs: &Queue) -> usize {
    let mut sent = 0;
    for chunk in msgs.chunks(BATCH) {
        let slices: Vec<[IoSlice<'_>; 1]> = chunk.iter().map(|(b, _)| [IoSlice::new(b)]).collect();
        let addrs: Vec<Option<()>> = vec![None; chunk.len()];
        let mut headers = MultiHeaders::<()>::preallocate(chunk.len(), None);
        let cmsgs: [ControlMessage<'_>; 0] = [];
        let n = match sendmmsg(
            fd.as_raw_fd(),
            &mut headers,
            &slices,
            &addrs,
            cmsgs,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        ) {
            Ok(r) => r.count(),
            Err(_) => 0,
        };
        sent += n;
        if n < chunk.len() {
            break;
        }
    }
    sent
}

/// Sends one message without blocking; false if it could not.
pub(crate) fn send(fd: &OwnedFd, msg: &FromAgent) -> bool {
    let bytes = proto::encode(msg);
    sendmsg::<()>(
        fd.as_raw_fd(),
        &[IoSlice::new(&bytes)],
        &[],
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .is_ok()
}
