//! A pass-through ONC RPC proxy over TCP: the first FileWall driver that touches
//! sockets. It listens on one port, reassembles each client's records, decodes each
//! as a call with [`decode_call`] (a refused call is answered with its RPC error
//! reply, an unreadable one dropped, an oversized record closes the connection),
//! and forwards the re-encoded call to one server over its own TCP connection under
//! a fresh XID from the [`PendingMap`]. Replies are matched by that XID, decoded with
//! [`decode_reply`] (a failure is counted and the server's bytes forwarded
//! unchanged but for the XID), given back the client's XID and returned to the
//! client that asked. Calls, replies and errors are counted per procedure.
//!
//! MOUNT and NFS are proxied by one [`Proxy`] each, on their own ports. Blocking
//! threads: one per client connection, one accept loop, one reader per server
//! connection.
//!
//! Every decoded call and reply passes through the policy chain of `crate::chain`
//! (configured by a [`ChainSpec`], see `crate::policy`): calls in the chain's order,
//! replies back through the policies that handled their call, in mirrored order. The
//! chain's pending-request map gives the fresh server XIDs. An empty chain is the
//! plain pass-through.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::chain::{Chain, Output};
use crate::flowstats::{PolicyCounters, lock_counters};
use crate::handles::HandleKey;
use crate::message::{
    Call, Msg, Procedure, ReplyResults, decode_call, decode_reply, decode_reply_header,
};
use crate::pending::{ClientKey, FlowId};
use crate::policy::{ChainSpec, build_policies};
use crate::record::{DEFAULT_MAX_RECORD, RecordReader, encode_record};
use crate::rpc::RpcHeader;
use crate::xdr::{Encoder, Xdr};

/// Fragment size used when writing records.
const MAX_FRAGMENT: usize = 1 << 20;

/// How the proxy is set up.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Where clients connect (port 0 picks a free one).
    pub listen: SocketAddr,
    /// The server every call is forwarded to.
    pub server: SocketAddr,
    /// How long a forwarded call waits for its reply before it is purged.
    pub timeout: Duration,
    /// Most calls outstanding at the server.
    pub capacity: usize,
    /// Largest record accepted from either side.
    pub max_record: usize,
    /// The policy chain, in order (empty: pass-through).
    pub chain: ChainSpec,
    /// The handle policy's key.
    pub key: Option<HandleKey>,
    /// Slots of each policy's input buffer.
    pub buffer_slots: usize,
}

impl ProxyConfig {
    pub fn new(listen: SocketAddr, server: SocketAddr) -> Self {
        Self {
            listen,
            server,
            timeout: Duration::from_secs(30),
            capacity: 4096,
            max_record: DEFAULT_MAX_RECORD,
            chain: ChainSpec::default(),
            key: None,
            buffer_slots: 1024,
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
    /// By procedure name, e.g. `NFSv3 Lookup`, `MOUNTv3 Mnt`.
    pub ops: BTreeMap<String, OpCounters>,
    /// Calls refused and answered with an RPC error reply.
    pub refused_calls: u64,
    /// Records dropped without an answer (no readable call header, or a reply).
    pub dropped_records: u64,
    /// Client connections closed because their stream could not be reassembled.
    pub closed_connections: u64,
    /// Client retransmissions resent under their pending server XID.
    pub retransmissions: u64,
    /// Calls dropped because the pending map was full.
    pub overflows: u64,
    /// Calls purged after the timeout.
    pub timeouts: u64,
    /// Server replies that matched no pending call (late, duplicate, unsolicited),
    /// or whose client had gone.
    pub unmatched_replies: u64,
    /// Server records that were not readable replies.
    pub bad_server_records: u64,
    /// Failures to reach the server.
    pub server_errors: u64,
    /// The most recent error of any kind, with where it happened.
    pub last_error: Option<String>,
    /// What the policies counted (statistics per flow and operation, refused
    /// handles).
    pub policies: PolicyCounters,
    /// Messages dropped because a policy's input buffer was full.
    pub policy_buffer_drops: u64,
    /// Call-to-reply latency by procedure name, for calls that got a reply.
    pub latency: BTreeMap<String, crate::latency::LatencyHistogram>,
}

impl ProxyStats {
    /// The counters of `name` (zero if never seen).
    pub fn op(&self, name: &str) -> OpCounters {
        self.ops.get(name).copied().unwrap_or_default()
    }
}

pub use crate::message::procedure_name;

struct Shared {
    config: ProxyConfig,
    stopping: AtomicBool,
    next_flow: AtomicU64,
    chain: Mutex<Chain<Msg>>,
    counters: Arc<Mutex<PolicyCounters>>,
    /// Write halves of client connections, by flow.
    clients: Mutex<HashMap<FlowId, TcpStream>>,
    /// Write half of the server connection, connected on first use.
    server: Mutex<Option<TcpStream>>,
    stats: Mutex<ProxyStats>,
    /// When each pending client call arrived, for its latency.
    arrived: Mutex<HashMap<ClientKey, Instant>>,
}

/// Locks a mutex, recovering the data if a thread panicked while holding it (the
/// counters and maps stay consistent between statements).
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
}

/// A running proxy; dropping it stops it and closes every connection.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<thread::JoinHandle<()>>,
}

impl Proxy {
    /// Binds the listening socket and starts accepting clients. The server is
    /// connected on the first call.
    pub fn start(config: ProxyConfig) -> io::Result<Proxy> {
        let listener = TcpListener::bind(config.listen).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("filewall proxy: binding {}: {e}", config.listen),
            )
        })?;
        let addr = listener.local_addr()?;
        // XIDs should differ between runs so a restarted proxy does not collide with
        // the server's duplicate-request cache.
        let first_xid = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
            .unwrap_or(1);
        let counters = Arc::new(Mutex::new(PolicyCounters::default()));
        let policies = build_policies(&config.chain, config.key.as_ref(), &counters)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let chain = Chain::new(
            policies,
            config.buffer_slots,
            first_xid,
            config.timeout,
            config.capacity,
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("filewall chain: {e}")))?;
        let shared = Arc::new(Shared {
            chain: Mutex::new(chain),
            counters,
            config,
            stopping: AtomicBool::new(false),
            next_flow: AtomicU64::new(1),
            clients: Mutex::new(HashMap::new()),
            server: Mutex::new(None),
            stats: Mutex::new(ProxyStats::default()),
            arrived: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name(format!("filewall-accept-{}", addr.port()))
            .spawn(move || accept_loop(listener, s))?;
        Ok(Proxy {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A copy of the counters.
    pub fn stats(&self) -> ProxyStats {
        let mut s = lock(&self.shared.stats).clone();
        let chain = lock(&self.shared.chain);
        let c = chain.stats();
        s.retransmissions = c.retransmissions;
        s.overflows = c.pending_full;
        s.timeouts = c.timed_out;
        s.unmatched_replies += c.unmatched_responses;
        s.policy_buffer_drops = c.overflow_drops.iter().sum();
        drop(chain);
        s.policies = lock_counters(&self.shared.counters).clone();
        s
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accept loop, then close every connection so their threads end.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for (_, c) in lock(&self.shared.clients).drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(s) = lock(&self.shared.server).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                shared.error(|_| {}, format!("accepting a client: {e}"));
                continue;
            }
        };
        let flow = shared.next_flow.fetch_add(1, Ordering::Relaxed);
        let writer = match stream.try_clone() {
            Ok(w) => w,
            Err(e) => {
                shared.error(|_| {}, format!("flow {flow}: cloning the socket: {e}"));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        lock(&shared.clients).insert(flow, writer);
        let s = shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("filewall-client-{flow}"))
            .spawn(move || {
                client_loop(flow, stream, &s);
                if let Some(c) = lock(&s.clients).remove(&flow) {
                    let _ = c.shutdown(Shutdown::Both);
                }
            });
        if let Err(e) = spawned {
            shared.error(|_| {}, format!("flow {flow}: spawning its thread: {e}"));
            if let Some(c) = lock(&shared.clients).remove(&flow) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Writes one record to a client flow; false if the client has gone.
fn send_to_client(shared: &Shared, flow: FlowId, payload: &[u8]) -> bool {
    let record = encode_record(payload, MAX_FRAGMENT);
    let mut clients = lock(&shared.clients);
    let Some(c) = clients.get_mut(&flow) else {
        return false;
    };
    if let Err(e) = c.write_all(&record) {
        drop(clients);
        shared.error(|_| {}, format!("flow {flow}: writing a reply: {e}"));
        return false;
    }
    true
}

fn client_loop(flow: FlowId, mut stream: TcpStream, shared: &Arc<Shared>) {
    let mut reader = RecordReader::new(shared.config.max_record);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        reader.push(&buf[..n]);
        loop {
            match reader.next_record() {
                Ok(Some(record)) => handle_call(flow, &record, shared),
                Ok(None) => break,
                Err(e) => {
                    shared.error(
                        |s| s.closed_connections += 1,
                        format!("flow {flow}: closing the client connection: {e}"),
                    );
                    return;
                }
            }
        }
    }
}

/// Whether two messages are equal after their first four bytes (the XID).
fn same_but_xid(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.get(4..) == b.get(4..)
}

fn handle_call(flow: FlowId, record: &[u8], shared: &Arc<Shared>) {
    let call = match decode_call(record) {
        Ok(c) => c,
        Err(e) => {
            match e.reply() {
                Some(h) => {
                    let mut enc = Encoder::new();
                    RpcHeader::Reply(h).encode(&mut enc);
                    shared.error(
                        |s| s.refused_calls += 1,
                        format!("flow {flow}: refused: {e}"),
                    );
                    send_to_client(shared, flow, &enc.into_bytes());
                }
                None => shared.error(
                    |s| s.dropped_records += 1,
                    format!("flow {flow}: dropped: {e}"),
                ),
            }
            return;
        }
    };
    let name = procedure_name(call.args.procedure());
    let mismatch = u64::from(!same_but_xid(record, &call.to_bytes()));
    shared.count(|s| {
        let op = s.ops.entry(name).or_default();
        op.calls += 1;
        op.reencode_mismatches += mismatch;
    });
    let now = Instant::now();
    let key = ClientKey {
        flow,
        xid: call.xid,
    };
    note_arrival(shared, key, now);
    let outputs = {
        let mut chain = lock(&shared.chain);
        chain.expire(now);
        chain.recv_request(key, Msg::Call { flow, call }, now);
        chain.run(now, usize::MAX)
    };
    dispatch(shared, outputs);
}

/// Arrival times kept before the oldest are forgotten: calls that never got a
/// reply (timed out, refused) must not grow the map without bound.
const MAX_ARRIVALS: usize = 65_536;

/// Notes when a client call arrived (a retransmission keeps the first time).
fn note_arrival(shared: &Shared, key: ClientKey, now: Instant) {
    let mut a = lock(&shared.arrived);
    if a.len() >= MAX_ARRIVALS {
        let horizon = shared.config.timeout;
        a.retain(|_, t| now.duration_since(*t) < horizon);
        if a.len() >= MAX_ARRIVALS {
            a.clear();
        }
    }
    a.entry(key).or_insert(now);
}

/// Sends what left the chain: calls to the server under their server XID, replies
/// to their client under the client's XID.
fn dispatch(shared: &Arc<Shared>, outputs: Vec<Output<Msg>>) {
    for o in outputs {
        match o {
            Output::ToServer {
                xid,
                request: Msg::Call { flow, call },
            } => {
                let client_xid = call.xid;
                let name = procedure_name(call.args.procedure());
                let bytes = Call { xid, ..call }.to_bytes();
                if let Err(e) = send_to_server(shared, &encode_record(&bytes, MAX_FRAGMENT)) {
                    shared.error(
                        |s| s.server_errors += 1,
                        format!(
                            "flow {flow} xid {client_xid:#x} ({name}): forwarding to {}: {e}",
                            shared.config.server
                        ),
                    );
                }
            }
            Output::ToClient { client, response } => {
                let (name, out) = match response {
                    Msg::Reply(mut r) => {
                        r.header.xid = client.xid;
                        (reply_name(r.results.as_ref()), r.to_bytes())
                    }
                    Msg::RawReply(mut raw) => {
                        if let Some(x) = raw.get_mut(..4) {
                            x.copy_from_slice(&client.xid.to_be_bytes());
                        }
                        ("(undecoded reply)".to_string(), raw)
                    }
                    Msg::Call { .. } => continue,
                };
                // Counted before it is sent, so a client that reads the
                // statistics as soon as it has its reply finds it counted; a
                // reply that cannot be delivered is moved to `unmatched`.
                let took = lock(&shared.arrived).remove(&client).map(|t| t.elapsed());
                shared.count(|s| {
                    if let Some(d) = took {
                        s.latency.entry(name.clone()).or_default().observe(d);
                    }
                    s.ops.entry(name.clone()).or_default().replies += 1;
                });
                if !send_to_client(shared, client.flow, &out) {
                    shared.count(|s| {
                        s.ops.entry(name).or_default().replies -= 1;
                        s.unmatched_replies += 1;
                    });
                }
            }
            Output::ToServer { .. } => {}
        }
    }
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

/// Writes a record to the server, connecting (and starting its reader) first if
/// there is no connection.
fn send_to_server(shared: &Arc<Shared>, record: &[u8]) -> io::Result<()> {
    let mut server = lock(&shared.server);
    if server.is_none() {
        let stream = TcpStream::connect_timeout(&shared.config.server, Duration::from_secs(5))?;
        let _ = stream.set_nodelay(true);
        let reader = stream.try_clone()?;
        let s = shared.clone();
        thread::Builder::new()
            .name("filewall-server".into())
            .spawn(move || server_loop(reader, &s))?;
        *server = Some(stream);
    }
    let result = match server.as_mut() {
        Some(s) => s.write_all(record),
        None => Ok(()),
    };
    if result.is_err()
        && let Some(s) = server.take()
    {
        let _ = s.shutdown(Shutdown::Both);
    }
    result
}

fn server_loop(mut stream: TcpStream, shared: &Arc<Shared>) {
    let mut reader = RecordReader::new(shared.config.max_record);
    let mut buf = vec![0u8; 64 * 1024];
    let end = loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break "closed by the server".to_string(),
            Err(e) => break format!("reading: {e}"),
            Ok(n) => n,
        };
        reader.push(&buf[..n]);
        let mut failed = None;
        loop {
            match reader.next_record() {
                Ok(Some(record)) => handle_reply(&record, shared),
                Ok(None) => break,
                Err(e) => {
                    failed = Some(format!("reassembling: {e}"));
                    break;
                }
            }
        }
        if let Some(f) = failed {
            break f;
        }
    };
    if !shared.stopping.load(Ordering::SeqCst) {
        shared.error(
            |s| s.server_errors += 1,
            format!("server connection to {}: {end}", shared.config.server),
        );
    }
    // Forget the connection if it is still the current one, so the next call
    // reconnects; its pending calls time out and the clients retransmit.
    let mut server = lock(&shared.server);
    let same = match (server.as_ref(), stream.local_addr()) {
        (Some(s), Ok(mine)) => s.local_addr().ok() == Some(mine),
        _ => false,
    };
    if same && let Some(s) = server.take() {
        let _ = s.shutdown(Shutdown::Both);
    }
}

fn handle_reply(record: &[u8], shared: &Arc<Shared>) {
    let server = shared.config.server;
    let header = match decode_reply_header(record) {
        Ok((h, _)) => h,
        Err(e) => {
            shared.error(
                |s| s.bad_server_records += 1,
                format!("from server {server}: not a reply: {e}"),
            );
            return;
        }
    };
    let mut chain = lock(&shared.chain);
    let Some(Msg::Call { call, .. }) = chain.request(header.xid) else {
        drop(chain);
        shared.count(|s| s.unmatched_replies += 1);
        return;
    };
    let procedure = call.args.procedure();
    let name = procedure_name(procedure);
    let msg = match decode_reply(record, procedure) {
        Ok(reply) => {
            if !same_but_xid(record, &reply.to_bytes()) {
                shared.error(
                    |s| s.ops.entry(name.clone()).or_default().reencode_mismatches += 1,
                    format!(
                        "from server {server}: reply to {name} (server xid {:#x}) re-encodes differently",
                        header.xid
                    ),
                );
            }
            Msg::Reply(reply)
        }
        Err(e) => {
            shared.error(
                |s| s.ops.entry(name.clone()).or_default().reply_decode_errors += 1,
                format!(
                    "from server {server}: reply to {name} (server xid {:#x}): {e}",
                    header.xid
                ),
            );
            Msg::RawReply(record.to_vec())
        }
    };
    chain.recv_response(header.xid, msg);
    let outputs = chain.run(Instant::now(), usize::MAX);
    drop(chain);
    dispatch(shared, outputs);
}
