//! FileWall's event-driven driver: one thread of control (a `mio` poll loop) owns
//! every socket and the policy chain, so it can run as a run-to-completion turn on
//! a dedicated core ([`Engine::turn`] with a zero timeout, from an offcode's poll)
//! or on its own thread (`proxy::Proxy`).
//!
//! Clients reach it over TCP (RFC 5531 record marking) or UDP (one datagram per
//! message) on any number of listeners. Each client call is decoded with
//! [`decode_call`] (a refused one is answered with its RPC error reply, an
//! unreadable one dropped, an oversized TCP record closes the connection);
//! portmapper calls are answered here from the listeners' own ports, so an
//! unmodified client that asks port 111 finds the proxy; NFS and MOUNT calls go
//! through the chain and leave for one of the servers ([`Backend`]; index 0 unless a
//! policy routes a generated copy elsewhere) on the engine's own TCP connection to
//! it, under a fresh XID. Replies are matched by XID (and by the server they came
//! from), decoded, passed back through the chain and returned to the client under
//! its own XID.
//!
//! All sockets are non-blocking: a slow client's replies queue on its connection
//! (up to a limit, then it is closed) without stalling anyone else, and a server
//! that disappears costs a failed connect, not a blocked thread. Calls and
//! replies are counted per procedure, with their latency.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::net::{TcpListener, TcpStream, UdpSocket};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::backend::Backend;
use crate::chain::{Chain, ChainLimits, ChainStats, Output};
use crate::flowstats::{PolicyCounters, lock_counters};
use crate::handles::HandleKey;
use crate::message::{
    Call, CallArgs, Msg, Procedure, Reply, ReplyResults, decode_call, decode_reply,
    decode_reply_header, procedure_name,
};
use crate::pending::{ClientKey, FlowId};
use crate::policy::{BuildEnv, ChainSpec, build_chain};
use crate::portmap::{self, Mapping};
use crate::record::{DEFAULT_MAX_RECORD, RecordReader, encode_record_into};
use crate::rpc::RpcHeader;
use crate::temporal::Clock;
use crate::xdr::{Encoder, Xdr};

/// Fragment size used when writing records.
const MAX_FRAGMENT: usize = 1 << 20;
/// Bytes of replies queued for one client before it is cut off as too slow.
pub const MAX_CLIENT_BACKLOG_BYTES: usize = 64 << 20;
/// Bytes queued for one server before further calls to it are dropped.
pub const MAX_SERVER_BACKLOG_BYTES: usize = 256 << 20;
/// How long after a failed connection to a server the next attempt waits.
pub const RECONNECT_BACKOFF: Duration = Duration::from_millis(250);
/// UDP peers remembered as flows before the table is cleared.
pub const MAX_UDP_FLOWS: usize = 65_536;
/// Arrival times kept before the oldest are forgotten: calls that never got a
/// reply (timed out, refused) must not grow the map without bound.
const MAX_ARRIVALS: usize = 65_536;
/// The largest UDP datagram read.
const MAX_DATAGRAM: usize = 65_536;
/// Chain handler runs per batch of input, at most (one batch is one message's worth
/// of work in practice; the bound keeps a misbehaving policy from looping).
const MAX_STEPS: usize = 1 << 20;

/// How a listener is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
}

/// A socket bound by the caller (for example inside another network namespace).
#[derive(Debug)]
pub enum Bound {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

/// One listening socket.
#[derive(Debug, Clone)]
pub struct Listen {
    pub transport: Transport,
    /// Where to bind (port 0 picks a free one); ignored when `bound` is given.
    pub addr: SocketAddr,
    /// The programs the built-in portmapper names this port for (empty: every
    /// program, NFS and MOUNT).
    pub programs: Vec<u32>,
    /// A socket bound elsewhere, used instead of binding `addr`.
    pub bound: Option<Arc<Bound>>,
}

impl Listen {
    pub fn tcp(addr: SocketAddr) -> Self {
        Self {
            transport: Transport::Tcp,
            addr,
            programs: Vec::new(),
            bound: None,
        }
    }

    pub fn udp(addr: SocketAddr) -> Self {
        Self {
            transport: Transport::Udp,
            ..Self::tcp(addr)
        }
    }

    /// The same listener, named by the portmapper for `programs` only.
    #[must_use]
    pub fn serving(mut self, programs: &[u32]) -> Self {
        self.programs = programs.to_vec();
        self
    }

    /// A listener on a socket the caller bound.
    pub fn bound(socket: Bound, programs: &[u32]) -> io::Result<Self> {
        let (transport, addr) = match &socket {
            Bound::Tcp(l) => (Transport::Tcp, l.local_addr()?),
            Bound::Udp(u) => (Transport::Udp, u.local_addr()?),
        };
        Ok(Self {
            transport,
            addr,
            programs: programs.to_vec(),
            bound: Some(Arc::new(socket)),
        })
    }
}

/// How the proxy is set up.
#[derive(Clone)]
pub struct ProxyConfig {
    /// Where clients connect.
    pub listen: Vec<Listen>,
    /// The servers: index 0 is the primary, the rest replicas.
    pub servers: Vec<Backend>,
    /// How long a forwarded call waits for its reply before it is purged.
    pub timeout: Duration,
    /// Most calls outstanding at the servers.
    pub capacity: usize,
    /// Largest record accepted from either side.
    pub max_record: usize,
    /// The policy chain, in order (empty: pass-through).
    pub chain: ChainSpec,
    /// The handle policy's key.
    pub key: Option<HandleKey>,
    /// How often policies' timers run (`Policy::on_tick`) and timeouts are checked.
    pub tick: Duration,
    /// The clock time-based policies read (`None`: the system clock).
    pub clock: Option<Clock>,
    /// The proxy's thread as a dedicated core: pinned to this CPU, it polls
    /// its sockets without sleeping (no wake-up per call). `None`: it sleeps
    /// in `epoll_wait` between events, as an ordinary thread.
    pub core: Option<u32>,
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("listen", &self.listen)
            .field("servers", &self.servers)
            .field("chain", &self.chain.describe())
            .field("timeout", &self.timeout)
            .field("capacity", &self.capacity)
            .field("clock", &self.clock.is_some())
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl ProxyConfig {
    /// One TCP listener in front of one server that takes every program.
    pub fn new(listen: SocketAddr, server: SocketAddr) -> Self {
        Self::with(vec![Listen::tcp(listen)], vec![Backend::any(server)])
    }

    pub fn with(listen: Vec<Listen>, servers: Vec<Backend>) -> Self {
        Self {
            listen,
            servers,
            timeout: Duration::from_secs(30),
            capacity: 4096,
            max_record: DEFAULT_MAX_RECORD,
            chain: ChainSpec::default(),
            key: None,
            tick: Duration::from_millis(10),
            clock: None,
            core: None,
        }
    }
}

/// Counters of one procedure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounters {
    /// Calls decoded and forwarded (retransmissions included).
    pub calls: u64,
    /// Replies returned to the client.
    pub replies: u64,
    /// Replies whose results did not decode (forwarded anyway).
    pub reply_decode_errors: u64,
    /// Calls and replies that decoded but did not re-encode to the bytes received
    /// (apart from the XID): a codec that is not canonical for this peer.
    pub reencode_mismatches: u64,
}

/// Everything the proxy counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// By procedure name, e.g. `NFSv3 Lookup`, `MOUNTv3 Mnt`, `PMAPv2 Getport`.
    pub ops: BTreeMap<String, OpCounters>,
    /// Calls refused and answered with an RPC error reply.
    pub refused_calls: u64,
    /// Records dropped without an answer (no readable call header, or a reply).
    pub dropped_records: u64,
    /// Client connections closed because their stream could not be reassembled
    /// or they did not read their replies.
    pub closed_connections: u64,
    /// Client retransmissions of a call still pending (not forwarded twice).
    pub retransmissions: u64,
    /// Calls dropped because the pending map was full.
    pub overflows: u64,
    /// Calls purged after the timeout.
    pub timeouts: u64,
    /// Server replies that matched no pending call (late, duplicate, unsolicited,
    /// from the wrong server), or whose client had gone.
    pub unmatched_replies: u64,
    /// Server records that were not readable replies.
    pub bad_server_records: u64,
    /// Failures to reach a server (connect, write, lost connection).
    pub server_errors: u64,
    /// Datagrams received from UDP clients.
    pub udp_datagrams: u64,
    /// The most recent error of any kind, with where it happened.
    pub last_error: Option<String>,
    /// What the policies counted.
    pub policies: PolicyCounters,
    /// Messages dropped because a policy's input buffer was full.
    pub policy_buffer_drops: u64,
    /// Actions a policy took on requests no longer pending.
    pub stray_actions: u64,
    /// Call-to-reply latency by procedure name, for calls that got a reply.
    pub latency: BTreeMap<String, crate::latency::LatencyHistogram>,
}

impl ProxyStats {
    /// The counters of `name` (zero if never seen).
    pub fn op(&self, name: &str) -> OpCounters {
        self.ops.get(name).copied().unwrap_or_default()
    }
}

/// What the engine shares with readers of its counters and with whoever stops it.
pub(crate) struct Shared {
    stats: Mutex<ProxyStats>,
    chain: Mutex<ChainStats>,
    counters: Arc<Mutex<PolicyCounters>>,
    pub(crate) stopping: AtomicBool,
}

/// Locks a mutex, recovering the data if a thread panicked while holding it (the
/// counters stay consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn count(&self, f: impl FnOnce(&mut ProxyStats)) {
        f(&mut lock(&self.stats));
    }

    fn error(&self, f: impl FnOnce(&mut ProxyStats), msg: String) {
        let mut s = lock(&self.stats);
        f(&mut s);
        s.last_error = Some(msg);
    }

    /// A copy of every counter.
    pub(crate) fn snapshot(&self) -> ProxyStats {
        let mut s = lock(&self.stats).clone();
        let c = lock(&self.chain);
        s.retransmissions = c.retransmissions;
        s.overflows = c.pending_full;
        s.timeouts = c.timed_out;
        s.unmatched_replies += c.unmatched_responses;
        s.policy_buffer_drops = c.overflow_drops.iter().sum();
        s.stray_actions = c.stray_actions;
        drop(c);
        s.policies = lock_counters(&self.counters).clone();
        s
    }
}

/// A handle on a running engine's counters (cheap to clone, usable from any thread).
#[derive(Clone)]
pub struct StatsHandle(pub(crate) Arc<Shared>);

impl StatsHandle {
    pub fn stats(&self) -> ProxyStats {
        self.0.snapshot()
    }
}

/// A TCP connection with its reassembly and its queue of bytes to write.
struct Stream {
    sock: TcpStream,
    reader: RecordReader,
    out: Vec<u8>,
    out_at: usize,
    /// Whether WRITABLE interest is registered.
    want_write: bool,
    /// Whether it is on the engine's list of streams to write at the end of
    /// this turn.
    queued: bool,
}

impl Stream {
    fn new(sock: TcpStream, max_record: usize) -> Self {
        Self {
            sock,
            reader: RecordReader::new(max_record),
            out: Vec::new(),
            out_at: 0,
            want_write: false,
            queued: false,
        }
    }

    fn backlog(&self) -> usize {
        self.out.len() - self.out_at
    }

    /// Writes what it can; `Ok(true)` when everything queued has gone.
    fn flush(&mut self) -> io::Result<bool> {
        while self.out_at < self.out.len() {
            match self.sock.write(&self.out[self.out_at..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_at = 0;
        Ok(true)
    }

    /// Reads everything available into the reassembler. `Ok(false)` at end of stream.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        loop {
            match self.sock.read(buf) {
                Ok(0) => return Ok(false),
                Ok(n) => self.reader.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Registers or drops WRITABLE interest as the queue requires.
    fn update_interest(&mut self, registry: &mio::Registry, token: Token) -> io::Result<()> {
        let want = self.backlog() > 0;
        if want != self.want_write {
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            registry.reregister(&mut self.sock, token, interest)?;
            self.want_write = want;
        }
        Ok(())
    }
}

enum ListenSock {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

/// Where a client flow's replies go.
#[derive(Debug, Clone, Copy)]
enum Route {
    Tcp(Token),
    Udp { listener: usize, peer: SocketAddr },
}

struct ClientConn {
    stream: Stream,
    flow: FlowId,
    peer: SocketAddr,
}

struct ServerConn {
    stream: Stream,
    addr: SocketAddr,
    /// Which of the server's [`SERVER_LANES`] connections this is.
    lane: usize,
    connected: bool,
}

/// Connections the engine keeps to each server, calls spread over them by
/// client flow (a flow's calls stay on one, in order). A server such as
/// nfs-ganesha decodes each connection's requests one after another, so a
/// single connection for every client would serialise them where the
/// clients' own connections would not.
pub const SERVER_LANES: usize = 4;

const WAKER: Token = Token(usize::MAX);

/// The event loop: listeners, client and server connections, and the chain.
pub struct Engine {
    poll: Poll,
    events: Events,
    /// Streams that had bytes queued this turn: each is written once, at the
    /// turn's end, so the replies (or calls) a turn produces for one peer go
    /// out in one `write` instead of one each.
    pending: Vec<Token>,
    /// The last turn's ready tokens (token, readable, writable), reused.
    ready: Vec<(Token, bool, bool)>,
    waker: Arc<Waker>,
    shared: Arc<Shared>,
    listeners: Vec<(ListenSock, SocketAddr)>,
    mappings: Vec<Mapping>,
    clients: HashMap<Token, ClientConn>,
    routes: HashMap<FlowId, Route>,
    udp_flows: HashMap<(usize, SocketAddr), FlowId>,
    servers: HashMap<Token, ServerConn>,
    server_tokens: HashMap<(SocketAddr, usize), Token>,
    /// When each server address last failed.
    server_down: HashMap<SocketAddr, Instant>,
    backends: Vec<Backend>,
    chain: Chain<Msg>,
    arrived: HashMap<ClientKey, Instant>,
    next_token: usize,
    next_flow: FlowId,
    max_record: usize,
    timeout: Duration,
    tick: Duration,
    last_tick: Instant,
    buf: Vec<u8>,
    /// Reused to encode a message again for the codec check, and a datagram.
    scratch: Encoder,
}

/// XIDs should differ between runs so a restarted proxy does not collide with the
/// server's duplicate-request cache.
fn first_xid() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
        .unwrap_or(1)
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

fn open_listener(l: &Listen) -> io::Result<(ListenSock, SocketAddr)> {
    let context = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("filewall: binding {:?} {}: {e}", l.transport, l.addr),
        )
    };
    match (&l.bound, l.transport) {
        (Some(b), _) => match &**b {
            Bound::Tcp(t) => {
                let t = t.try_clone()?;
                t.set_nonblocking(true)?;
                let addr = t.local_addr()?;
                Ok((ListenSock::Tcp(TcpListener::from_std(t)), addr))
            }
            Bound::Udp(u) => {
                let u = u.try_clone()?;
                u.set_nonblocking(true)?;
                let addr = u.local_addr()?;
                Ok((ListenSock::Udp(UdpSocket::from_std(u)), addr))
            }
        },
        (None, Transport::Tcp) => {
            let t = TcpListener::bind(l.addr).map_err(context)?;
            let addr = t.local_addr()?;
            Ok((ListenSock::Tcp(t), addr))
        }
        (None, Transport::Udp) => {
            let u = UdpSocket::bind(l.addr).map_err(context)?;
            let addr = u.local_addr()?;
            Ok((ListenSock::Udp(u), addr))
        }
    }
}

/// What the built-in portmapper answers: every listener's port for each program it
/// serves (NFS v3 and MOUNT v3 when it names none), by transport.
fn mappings(listen: &[Listen], addrs: &[SocketAddr]) -> Vec<Mapping> {
    let mut out = Vec::new();
    for (l, a) in listen.iter().zip(addrs) {
        let prot = match l.transport {
            Transport::Tcp => portmap::IPPROTO_TCP,
            Transport::Udp => portmap::IPPROTO_UDP,
        };
        let programs = if l.programs.is_empty() {
            vec![crate::nfs3::PROGRAM, crate::mount::PROGRAM]
        } else {
            l.programs.clone()
        };
        for prog in programs {
            let vers = match prog {
                crate::nfs3::PROGRAM => crate::nfs3::VERSION,
                crate::mount::PROGRAM => crate::mount::VERSION,
                _ => portmap::VERSION,
            };
            let m = Mapping {
                prog,
                vers,
                prot,
                port: u32::from(a.port()),
            };
            // The first listener named for a program and transport wins.
            if !out
                .iter()
                .any(|o: &Mapping| o.prog == m.prog && o.prot == m.prot)
            {
                out.push(m);
            }
        }
    }
    out
}

impl Engine {
    /// Binds every listener and builds the chain; nothing runs until [`Engine::turn`].
    pub fn new(config: ProxyConfig) -> io::Result<Engine> {
        if config.servers.is_empty() {
            return Err(invalid("filewall: no server to forward to"));
        }
        if config.listen.is_empty() {
            return Err(invalid("filewall: nothing to listen on"));
        }
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let counters = Arc::new(Mutex::new(PolicyCounters::default()));
        let env = BuildEnv {
            key: config.key.as_ref(),
            counters: &counters,
            servers: &config.servers,
            clock: config.clock.clone(),
        };
        let (policies, scheduler, buffer_slots) =
            build_chain(&config.chain, &env).map_err(invalid)?;
        let limits = ChainLimits {
            buffer_slots,
            first_xid: first_xid(),
            timeout: config.timeout,
            max_pending: config.capacity,
        };
        let chain = Chain::with_scheduler(policies, scheduler, limits)
            .map_err(|e| invalid(format!("filewall chain: {e}")))?;
        let mut listeners = Vec::new();
        for (i, l) in config.listen.iter().enumerate() {
            let (mut sock, addr) = open_listener(l)?;
            match &mut sock {
                ListenSock::Tcp(t) => poll.registry().register(t, Token(i), Interest::READABLE)?,
                ListenSock::Udp(u) => poll.registry().register(u, Token(i), Interest::READABLE)?,
            }
            listeners.push((sock, addr));
        }
        let addrs: Vec<SocketAddr> = listeners.iter().map(|(_, a)| *a).collect();
        let shared = Arc::new(Shared {
            stats: Mutex::new(ProxyStats::default()),
            chain: Mutex::new(chain.stats().clone()),
            counters,
            stopping: AtomicBool::new(false),
        });
        Ok(Engine {
            poll,
            events: Events::with_capacity(1024),
            ready: Vec::with_capacity(1024),
            pending: Vec::new(),
            waker,
            shared,
            mappings: mappings(&config.listen, &addrs),
            next_token: listeners.len(),
            listeners,
            clients: HashMap::new(),
            routes: HashMap::new(),
            udp_flows: HashMap::new(),
            servers: HashMap::new(),
            server_tokens: HashMap::new(),
            server_down: HashMap::new(),
            backends: config.servers,
            chain,
            arrived: HashMap::new(),
            next_flow: 1,
            max_record: config.max_record,
            timeout: config.timeout,
            tick: config.tick,
            last_tick: Instant::now(),
            buf: vec![0u8; MAX_DATAGRAM.max(64 * 1024)],
            scratch: Encoder::new(),
        })
    }

    /// Where the listeners are, in configuration order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().map(|(_, a)| *a).collect()
    }

    /// What the built-in portmapper answers.
    pub fn port_mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// The counters, readable from other threads.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(Arc::clone(&self.shared))
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Wakes a `turn` that is waiting (from another thread).
    pub fn waker(&self) -> Arc<Waker> {
        Arc::clone(&self.waker)
    }

    /// The name of the chain's scheduler.
    pub fn scheduler_name(&self) -> &'static str {
        self.chain.scheduler_name()
    }

    /// One turn: waits up to `timeout` for socket events (zero: just looks),
    /// handles all of them, and runs the policies' timers when a tick is due.
    /// Returns whether anything happened.
    pub fn turn(&mut self, timeout: Duration) -> io::Result<bool> {
        let wait = timeout.min(self.tick.saturating_sub(self.last_tick.elapsed()));
        match self.poll.poll(&mut self.events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        // Copied out so `event` may borrow the engine; the buffer is kept
        // between turns (a busy-polling core turns millions of times a second).
        let mut tokens = std::mem::take(&mut self.ready);
        tokens.clear();
        tokens.extend(self.events.iter().map(|e| {
            (
                e.token(),
                e.is_readable() || e.is_read_closed() || e.is_error(),
                e.is_writable(),
            )
        }));
        let busy = !tokens.is_empty();
        for &(token, readable, writable) in &tokens {
            self.event(token, readable, writable);
        }
        self.ready = tokens;
        let now = Instant::now();
        if now.duration_since(self.last_tick) >= self.tick {
            self.last_tick = now;
            self.chain.expire(now);
            let out = self.chain.tick(now, MAX_STEPS);
            self.publish_chain_stats();
            self.dispatch(out);
        }
        self.flush_pending();
        Ok(busy)
    }

    /// Writes every stream that had bytes queued this turn (see `pending`).
    fn flush_pending(&mut self) {
        let mut pending = std::mem::take(&mut self.pending);
        for &token in &pending {
            if let Some(c) = self.clients.get_mut(&token) {
                c.stream.queued = false;
                self.flush_client(token);
                self.cut_off_unread(token);
            } else if let Some(s) = self.servers.get_mut(&token) {
                s.stream.queued = false;
                if s.connected {
                    self.server_writable(token);
                }
            }
        }
        pending.clear();
        self.pending = pending;
    }

    /// Runs turns until `stopping` is set (by `proxy::Proxy` on drop).
    pub fn run(&mut self) {
        self.run_waiting(Duration::from_millis(100));
    }

    /// Turns until the proxy stops without ever sleeping: the loop of a
    /// dedicated core (`ProxyConfig::core`), which takes no wake-up per call.
    pub fn run_busy(&mut self) {
        self.run_waiting(Duration::ZERO);
    }

    fn run_waiting(&mut self, wait: Duration) {
        while !self.shared.stopping.load(Ordering::Acquire) {
            if let Err(e) = self.turn(wait) {
                self.shared
                    .error(|_| {}, format!("filewall: waiting for events: {e}"));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn event(&mut self, token: Token, readable: bool, writable: bool) {
        if token == WAKER {
            return;
        }
        if token.0 < self.listeners.len() {
            match &self.listeners[token.0].0 {
                ListenSock::Tcp(_) => self.accept(token.0),
                ListenSock::Udp(_) => self.receive_datagrams(token.0),
            }
        } else if self.clients.contains_key(&token) {
            if writable {
                self.flush_client(token);
            }
            if readable {
                self.read_client(token);
            }
        } else if self.servers.contains_key(&token) {
            if writable {
                self.server_writable(token);
            }
            if readable {
                self.read_server(token);
            }
        }
    }

    fn next_token(&mut self) -> Token {
        // Tokens below the listeners' count and the waker's are never handed out.
        self.next_token = self.next_token.wrapping_add(1).max(self.listeners.len());
        if self.next_token == WAKER.0 {
            self.next_token = self.listeners.len();
        }
        Token(self.next_token)
    }

    fn new_flow(&mut self, route: Route) -> FlowId {
        let flow = self.next_flow;
        self.next_flow += 1;
        self.routes.insert(flow, route);
        flow
    }

    fn accept(&mut self, listener: usize) {
        loop {
            let ListenSock::Tcp(l) = &self.listeners[listener].0 else {
                return;
            };
            let (mut sock, peer) = match l.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.shared
                        .error(|_| {}, format!("accepting a client: {e}"));
                    return;
                }
            };
            let _ = sock.set_nodelay(true);
            let token = self.next_token();
            if let Err(e) = self
                .poll
                .registry()
                .register(&mut sock, token, Interest::READABLE)
            {
                self.shared
                    .error(|_| {}, format!("client {peer}: registering: {e}"));
                continue;
            }
            let flow = self.new_flow(Route::Tcp(token));
            self.clients.insert(
                token,
                ClientConn {
                    stream: Stream::new(sock, self.max_record),
                    flow,
                    peer,
                },
            );
        }
    }

    fn close_client(&mut self, token: Token) {
        if let Some(mut c) = self.clients.remove(&token) {
            // What this turn answered still goes, as far as the socket takes it.
            let _ = c.stream.flush();
            let _ = self.poll.registry().deregister(&mut c.stream.sock);
            self.routes.remove(&c.flow);
        }
    }

    fn read_client(&mut self, token: Token) {
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        let open = c.stream.fill(&mut self.buf);
        let (flow, peer) = (c.flow, c.peer);
        let mut records = Vec::new();
        let mut broken = None;
        loop {
            match c.stream.reader.next_record() {
                Ok(Some(r)) => records.push(r),
                Ok(None) => break,
                Err(e) => {
                    broken = Some(e);
                    break;
                }
            }
        }
        for r in records {
            self.handle_call(flow, peer, &r);
        }
        if let Some(e) = broken {
            self.shared.error(
                |s| s.closed_connections += 1,
                format!("flow {flow} ({peer}): closing the client connection: {e}"),
            );
            self.close_client(token);
        } else if !matches!(open, Ok(true)) {
            self.close_client(token);
        }
    }

    /// Closes client `token` if more than [`MAX_CLIENT_BACKLOG_BYTES`] of
    /// its replies wait unread; true if it did.
    fn cut_off_unread(&mut self, token: Token) -> bool {
        let Some(c) = self.clients.get(&token) else {
            return false;
        };
        let (flow, backlog) = (c.flow, c.stream.backlog());
        if backlog <= MAX_CLIENT_BACKLOG_BYTES {
            return false;
        }
        self.shared.error(
            |s| s.closed_connections += 1,
            format!("flow {flow}: {backlog} bytes of replies unread, closing"),
        );
        self.close_client(token);
        true
    }

    fn flush_client(&mut self, token: Token) {
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        let ok = c
            .stream
            .flush()
            .and_then(|_| c.stream.update_interest(self.poll.registry(), token));
        if ok.is_err() {
            self.close_client(token);
        }
    }

    fn receive_datagrams(&mut self, listener: usize) {
        loop {
            let ListenSock::Udp(u) = &self.listeners[listener].0 else {
                return;
            };
            let (n, peer) = match u.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.shared
                        .error(|_| {}, format!("receiving a datagram: {e}"));
                    return;
                }
            };
            let datagram = self.buf[..n].to_vec();
            self.shared.count(|s| s.udp_datagrams += 1);
            if self.udp_flows.len() >= MAX_UDP_FLOWS {
                for (_, f) in self.udp_flows.drain() {
                    self.routes.remove(&f);
                }
            }
            let flow = match self.udp_flows.get(&(listener, peer)) {
                Some(&f) => f,
                None => {
                    let f = self.new_flow(Route::Udp { listener, peer });
                    self.udp_flows.insert((listener, peer), f);
                    f
                }
            };
            self.handle_call(flow, peer, &datagram);
        }
    }

    /// Sends one message to a client flow (a record over TCP, a datagram over UDP);
    /// false if the client has gone.
    fn send_to_client(&mut self, flow: FlowId, payload: &[u8]) -> bool {
        self.send_to_client_with(flow, |e| e.buf.extend_from_slice(payload))
    }

    /// [`Engine::send_to_client`] for a message `write` encodes: over TCP straight
    /// into the connection's buffer.
    fn send_to_client_with(&mut self, flow: FlowId, write: impl FnOnce(&mut Encoder)) -> bool {
        match self.routes.get(&flow).copied() {
            None => false,
            Some(Route::Udp { listener, peer }) => {
                let ListenSock::Udp(u) = &self.listeners[listener].0 else {
                    return false;
                };
                self.scratch.buf.clear();
                write(&mut self.scratch);
                let payload = &self.scratch.buf;
                match u.send_to(payload, peer) {
                    Ok(_) => true,
                    Err(e) => {
                        self.shared.error(
                            |_| {},
                            format!(
                                "flow {flow} ({peer}): sending a {} byte datagram: {e}",
                                payload.len()
                            ),
                        );
                        false
                    }
                }
            }
            Some(Route::Tcp(token)) => {
                let Some(c) = self.clients.get_mut(&token) else {
                    return false;
                };
                encode_record_into(&mut c.stream.out, MAX_FRAGMENT, write);
                if !c.stream.queued {
                    c.stream.queued = true;
                    self.pending.push(token);
                }
                !self.cut_off_unread(token)
            }
        }
    }

    fn handle_call(&mut self, flow: FlowId, peer: SocketAddr, record: &[u8]) {
        let call = match decode_call(record) {
            Ok(c) => c,
            Err(e) => {
                match e.reply() {
                    Some(h) => {
                        let mut enc = Encoder::new();
                        RpcHeader::Reply(h).encode(&mut enc);
                        self.shared.error(
                            |s| s.refused_calls += 1,
                            format!("flow {flow} ({peer}): refused: {e}"),
                        );
                        self.send_to_client(flow, &enc.into_bytes());
                    }
                    None => self.shared.error(
                        |s| s.dropped_records += 1,
                        format!("flow {flow} ({peer}): dropped: {e}"),
                    ),
                }
                return;
            }
        };
        let name = procedure_name(call.args.procedure());
        let mismatch = u64::from(!self.encodes_as(record, |e| call.encode_into(e)));
        self.shared.count(|s| {
            let op = s.ops.entry(name.clone()).or_default();
            op.calls += 1;
            op.reencode_mismatches += mismatch;
        });
        if let CallArgs::Portmap2(p) = &call.args {
            let reply = crate::handles::accepted(ReplyResults::Portmap2(portmap::answer(
                p,
                &self.mappings,
            )));
            let bytes = Reply {
                header: crate::rpc::ReplyHeader {
                    xid: call.xid,
                    ..reply.header
                },
                ..reply
            }
            .to_bytes();
            self.shared
                .count(|s| s.ops.entry(name).or_default().replies += 1);
            self.send_to_client(flow, &bytes);
            return;
        }
        let now = Instant::now();
        let key = ClientKey {
            flow,
            xid: call.xid,
        };
        self.note_arrival(key, now);
        self.chain.recv_request(
            key,
            Msg::Call {
                flow,
                peer: peer.ip(),
                call,
            },
            now,
        );
        let out = self.chain.run(now, MAX_STEPS);
        self.publish_chain_stats();
        self.dispatch(out);
    }

    /// Notes when a client call arrived (a retransmission keeps the first time).
    fn note_arrival(&mut self, key: ClientKey, now: Instant) {
        if self.arrived.len() >= MAX_ARRIVALS {
            let horizon = self.timeout;
            self.arrived.retain(|_, t| now.duration_since(*t) < horizon);
            if self.arrived.len() >= MAX_ARRIVALS {
                self.arrived.clear();
            }
        }
        self.arrived.entry(key).or_insert(now);
    }

    fn publish_chain_stats(&self) {
        lock(&self.shared.chain).clone_from(self.chain.stats());
    }

    /// Sends what left the chain: calls to their server under their server XID,
    /// replies to their client under the client's XID.
    fn dispatch(&mut self, outputs: Vec<Output<Msg>>) {
        for o in outputs {
            match o {
                Output::ToServer {
                    xid,
                    server,
                    request: Msg::Call { flow, call, .. },
                } => self.forward(xid, server, flow, call),
                Output::ToClient { client, response } => self.reply(client, response),
                Output::ToServer { .. } => {}
            }
        }
    }

    fn forward(&mut self, xid: u32, server: usize, flow: FlowId, call: Call) {
        let (prog, _, _) = call.args.numbers();
        let name = procedure_name(call.args.procedure());
        let client_xid = call.xid;
        let Some(addr) = self.backends.get(server).and_then(|b| b.addr_for(prog)) else {
            self.shared.error(
                |s| s.server_errors += 1,
                format!("flow {flow} xid {client_xid:#x} ({name}): server {server} has no address for program {prog}"),
            );
            return;
        };
        let call = Call { xid, ..call };
        let lane = usize::try_from(flow).unwrap_or(0) % SERVER_LANES;
        if let Err(e) = self.send_to_server(addr, lane, |e| call.encode_into(e)) {
            self.shared.error(
                |s| s.server_errors += 1,
                format!("flow {flow} xid {client_xid:#x} ({name}): forwarding to server {server} at {addr}: {e}"),
            );
        }
    }

    fn reply(&mut self, client: ClientKey, response: Msg) {
        let (name, out) = match response {
            Msg::Reply(mut r) => {
                r.header.xid = client.xid;
                (reply_name(r.results.as_ref()), Msg::Reply(r))
            }
            Msg::RawReply(mut raw) => {
                if let Some(x) = raw.get_mut(..4) {
                    x.copy_from_slice(&client.xid.to_be_bytes());
                }
                ("(undecoded reply)".to_string(), Msg::RawReply(raw))
            }
            Msg::Call { .. } => return,
        };
        // Counted before it is sent, so a client that reads the statistics as soon
        // as it has its reply finds it counted; a reply that cannot be delivered is
        // moved to `unmatched`.
        let took = self.arrived.remove(&client).map(|t| t.elapsed());
        self.shared.count(|s| {
            if let Some(d) = took {
                s.latency.entry(name.clone()).or_default().observe(d);
            }
            s.ops.entry(name.clone()).or_default().replies += 1;
        });
        let sent = self.send_to_client_with(client.flow, |e| match &out {
            Msg::Reply(r) => r.encode_into(e),
            Msg::RawReply(raw) => e.buf.extend_from_slice(raw),
            Msg::Call { .. } => {}
        });
        if !sent {
            self.shared.count(|s| {
                s.ops.entry(name).or_default().replies -= 1;
                s.unmatched_replies += 1;
            });
        }
    }

    /// Queues a record for a server, encoded by `write` straight into its
    /// connection's buffer, connecting first if there is no connection (not
    /// within `RECONNECT_BACKOFF` of a failure).
    fn send_to_server(
        &mut self,
        addr: SocketAddr,
        lane: usize,
        write: impl FnOnce(&mut Encoder),
    ) -> io::Result<()> {
        let token = match self.server_tokens.get(&(addr, lane)) {
            Some(&t) => t,
            None => self.connect(addr, lane)?,
        };
        let Some(s) = self.servers.get_mut(&token) else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        if s.stream.backlog() > MAX_SERVER_BACKLOG_BYTES {
            return Err(io::Error::other("too much queued for this server"));
        }
        encode_record_into(&mut s.stream.out, MAX_FRAGMENT, write);
        // Written at the end of the turn (or, not yet connected, once it is).
        if s.connected && !s.stream.queued {
            s.stream.queued = true;
            self.pending.push(token);
        }
        Ok(())
    }

    fn connect(&mut self, addr: SocketAddr, lane: usize) -> io::Result<Token> {
        if self
            .server_down
            .get(&addr)
            .is_some_and(|t| t.elapsed() < RECONNECT_BACKOFF)
        {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "failed moments ago; not retrying yet",
            ));
        }
        let mut sock = TcpStream::connect(addr)?;
        let token = self.next_token();
        self.poll
            .registry()
            .register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)?;
        let mut stream = Stream::new(sock, self.max_record);
        stream.want_write = true;
        self.servers.insert(
            token,
            ServerConn {
                stream,
                addr,
                lane,
                connected: false,
            },
        );
        self.server_tokens.insert((addr, lane), token);
        Ok(token)
    }

    fn server_failed(&mut self, token: Token, why: &str) {
        if let Some(mut s) = self.servers.remove(&token) {
            let _ = self.poll.registry().deregister(&mut s.stream.sock);
            self.server_tokens.remove(&(s.addr, s.lane));
            self.server_down.insert(s.addr, Instant::now());
            if !self.shared.stopping.load(Ordering::Acquire) {
                self.shared.error(
                    |st| st.server_errors += 1,
                    format!("server connection to {}: {why}", s.addr),
                );
            }
        }
    }

    fn server_writable(&mut self, token: Token) {
        let Some(s) = self.servers.get_mut(&token) else {
            return;
        };
        if !s.connected {
            match s.stream.sock.take_error() {
                Ok(Some(e)) | Err(e) => {
                    self.server_failed(token, &format!("connecting: {e}"));
                    return;
                }
                Ok(None) => {}
            }
            match s.stream.sock.peer_addr() {
                Ok(_) => {
                    s.connected = true;
                    let _ = s.stream.sock.set_nodelay(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => {
                    self.server_failed(token, &format!("connecting: {e}"));
                    return;
                }
            }
        }
        let r = s
            .stream
            .flush()
            .and_then(|_| s.stream.update_interest(self.poll.registry(), token));
        if let Err(e) = r {
            self.server_failed(token, &format!("writing: {e}"));
        }
    }

    fn read_server(&mut self, token: Token) {
        let Some(s) = self.servers.get_mut(&token) else {
            return;
        };
        let addr = s.addr;
        let open = s.stream.fill(&mut self.buf);
        let mut records = Vec::new();
        let mut broken = None;
        loop {
            match s.stream.reader.next_record() {
                Ok(Some(r)) => records.push(r),
                Ok(None) => break,
                Err(e) => {
                    broken = Some(format!("reassembling: {e}"));
                    break;
                }
            }
        }
        for r in records {
            self.handle_reply(addr, &r);
        }
        match (broken, open) {
            (Some(why), _) => self.server_failed(token, &why),
            (None, Ok(false)) => self.server_failed(token, "closed by the server"),
            (None, Err(e)) => self.server_failed(token, &format!("reading: {e}")),
            (None, Ok(true)) => {}
        }
    }

    fn handle_reply(&mut self, from: SocketAddr, record: &[u8]) {
        let header = match decode_reply_header(record) {
            Ok((h, _)) => h,
            Err(e) => {
                self.shared.error(
                    |s| s.bad_server_records += 1,
                    format!("from server {from}: not a reply: {e}"),
                );
                return;
            }
        };
        let xid = header.xid;
        let sent_to = self
            .chain
            .server_of(xid)
            .and_then(|i| self.backends.get(i))
            .zip(self.chain.request(xid));
        let Some((backend, Msg::Call { call, .. })) = sent_to else {
            self.shared.count(|s| s.unmatched_replies += 1);
            return;
        };
        let procedure = call.args.procedure();
        if backend.addr_for(call.args.numbers().0) != Some(from) {
            self.shared.error(
                |s| s.unmatched_replies += 1,
                format!(
                    "from server {from}: a reply to server xid {xid:#x}, which was sent elsewhere"
                ),
            );
            return;
        }
        let msg = self.decode_server_reply(from, record, procedure, xid);
        self.chain.recv_response(xid, msg);
        let out = self.chain.run(Instant::now(), MAX_STEPS);
        self.publish_chain_stats();
        self.dispatch(out);
    }

    fn decode_server_reply(
        &mut self,
        from: SocketAddr,
        record: &[u8],
        procedure: Procedure,
        xid: u32,
    ) -> Msg {
        let name = procedure_name(procedure);
        match decode_reply(record, procedure) {
            Ok(reply) => {
                if !self.encodes_as(record, |e| reply.encode_into(e)) {
                    self.shared.error(
                        |s| s.ops.entry(name.clone()).or_default().reencode_mismatches += 1,
                        format!("from server {from}: reply to {name} (server xid {xid:#x}) re-encodes differently"),
                    );
                }
                Msg::Reply(reply)
            }
            Err(e) => {
                self.shared.error(
                    |s| s.ops.entry(name.clone()).or_default().reply_decode_errors += 1,
                    format!("from server {from}: reply to {name} (server xid {xid:#x}): {e}"),
                );
                Msg::RawReply(record.to_vec())
            }
        }
    }
}

impl Engine {
    /// Whether `write` encodes the same message as `record` (the XID aside):
    /// the codec's check on every message, in a buffer kept for it.
    fn encodes_as(&mut self, record: &[u8], write: impl FnOnce(&mut Encoder)) -> bool {
        self.scratch.buf.clear();
        write(&mut self.scratch);
        same_but_xid(record, &self.scratch.buf)
    }
}

/// Whether two messages are equal after their first four bytes (the XID).
fn same_but_xid(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.get(4..) == b.get(4..)
}

/// The counter name of a reply, from its results.
fn reply_name(results: Option<&ReplyResults>) -> String {
    match results {
        Some(ReplyResults::Nfs3(r)) => procedure_name(Procedure::Nfs3(r.procedure())),
        Some(ReplyResults::Mount3(r)) => procedure_name(Procedure::Mount3(r.procedure())),
        Some(ReplyResults::Portmap2(r)) => procedure_name(Procedure::Portmap2(r.procedure())),
        None => "(RPC error reply)".to_string(),
    }
}
