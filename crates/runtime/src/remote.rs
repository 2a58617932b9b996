//! Offcodes on peer nodes (HYDRA's remote PEs).
//!
//! The origin hands the part of a plan that the layout put on a peer to that
//! peer's daemon, over the peer's node port. The peer deploys the part in its own
//! runtime (on host executors) and runs it like any app; channels that cross
//! machines become TCP stream channels (`sidecore_channel::stream`), the receiving
//! side listening and the sending side connecting. The node connection is the
//! lease: when it closes (the origin stopped the app, or died) the peer tears its
//! part down; when the peer goes away the origin marks the part's offcodes failed.
//!
//! The exchange, one JSON line per message after the connection opens:
//!
//! ```text
//! origin → peer   {"op":"deploy","version":1,"app":..,"origin":..,"offcodes":[..],"channels":[..]}
//! peer → origin   {"reply":"listening","listening":{"channel":"ip:port",..}}   (or "error")
//!                 the origin opens a stream channel to each listening address
//!                 the peer accepts them and connects its senders to the origin
//! peer → origin   {"reply":"deployed","app":"app@origin"}                       (or "error")
//! peer → origin   {"reply":"status","status":{..}}   every STATUS_EVERY, and once at the end
//! origin → peer   {"op":"stop"}, or closing the connection
//! ```
//!
//! Not yet: channels between two different peers, and channels that fan out
//! (multicast or parallel receivers) across machines; both are refused with an
//! error naming the channel.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::net::{IpAddr, Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sidecore_channel::stream::{StreamListener, StreamReceiver, StreamSender};
use sidecore_offcode::Registry;
use sidecore_pe::node::{PART_PROTOCOL, RemoteChannel, RemoteOffcode, RemotePart};
use sidecore_types::{Order, PeKind};

use crate::deploy::{AppId, AppState, AppStatus, DeployError, Runtime};
use crate::events::{EventKind, EventLog};
use crate::executor::{OffcodeHandle, OffcodeState};
use crate::plan::{Plan, PlannedChannel, PlannedOffcode, Transport};

/// How often a peer reports its part's status.
pub const STATUS_EVERY: Duration = Duration::from_millis(100);
/// How long either side waits for the other at each step of the exchange.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest line either side reads.
pub const MAX_LINE: usize = 1 << 20;

/// What a peer answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
pub enum Reply {
    Listening { listening: BTreeMap<String, String> },
    Deployed { app: String },
    Status { status: AppStatus },
    Error { error: String },
}

/// What the origin may send once the part runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OriginOp {
    op: String,
}

/// A stream end already connected, to attach to one port of a local offcode.
pub struct Attachment {
    pub channel: String,
    /// Index of the offcode in the plan.
    pub offcode: usize,
    pub end: StreamEnd,
}

/// Which end of a stream channel an [`Attachment`] is.
pub enum StreamEnd {
    Send {
        port: usize,
        sender: StreamSender,
    },
    Recv {
        port: usize,
        receiver: StreamReceiver,
    },
}

/// The origin's side of one peer's part, once deployed.
pub(crate) struct PartLink {
    pub node: String,
    sock: TcpStream,
    /// Reads the peer's lines; it may already hold the first status report.
    reader: BufReader<TcpStream>,
    /// Plan indices of the offcodes in the part, in part order.
    pub members: Vec<usize>,
}

/// What delegating the remote parts of a plan produced.
#[derive(Default)]
pub(crate) struct Delegation {
    pub attachments: Vec<Attachment>,
    pub parts: Vec<PartLink>,
}

/// Where an offcode of a plan runs: `None` here, `Some(pe)` on that peer.
fn location(plan: &Plan, i: usize) -> Option<&str> {
    let o = &plan.offcodes[i];
    (o.pe_kind == PeKind::Node).then_some(o.pe.as_str())
}

fn origin_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    format!(
        "{}.{}",
        if host.is_empty() { "origin" } else { &host },
        std::process::id()
    )
}

/// Reads one line of at most [`MAX_LINE`] bytes; `Ok(None)` on a clean close.
fn read_line(r: &mut BufReader<TcpStream>, buf: &mut Vec<u8>) -> io::Result<Option<String>> {
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(None);
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        buf.extend_from_slice(&avail[..take]);
        r.consume(take);
        if buf.len() > MAX_LINE {
            return Err(io::Error::new(
                ErrorKind::InvalidData,
                format!("line longer than {MAX_LINE} bytes"),
            ));
        }
        if done {
            let line = String::from_utf8(std::mem::take(buf))
                .map_err(|_| io::Error::new(ErrorKind::InvalidData, "line is not UTF-8"))?;
            return Ok(Some(line));
        }
    }
}

fn send_line(w: &mut TcpStream, v: &impl Serialize) -> io::Result<()> {
    let mut s = serde_json::to_string(v).map_err(io::Error::other)?;
    s.push('\n');
    w.write_all(s.as_bytes())
}

fn read_reply(r: &mut BufReader<TcpStream>, node: &str) -> Result<Reply, String> {
    let mut buf = Vec::new();
    match read_line(r, &mut buf) {
        Ok(Some(l)) => serde_json::from_str(l.trim())
            .map_err(|e| format!("node {node} sent a malformed reply: {e}")),
        Ok(None) => Err(format!("node {node} closed the connection")),
        Err(e) => Err(format!("node {node}: {e}")),
    }
}

/// Accepts the stream channel `name` on `l` and attaches it to input
/// `(offcode, port)`.
fn accept_end(
    l: &StreamListener,
    name: &str,
    (offcode, port): (usize, usize),
) -> Result<Attachment, String> {
    let receiver = l
        .accept(STEP_TIMEOUT)
        .map_err(|e| format!("channel `{name}`: {e}"))?;
    receiver.expect_channel(name).map_err(|e| e.to_string())?;
    Ok(Attachment {
        channel: name.to_string(),
        offcode,
        end: StreamEnd::Recv { port, receiver },
    })
}

/// Opens the stream channel `name` to `addr` and attaches it to output
/// `(offcode, port)`.
fn connect_end(
    addr: &str,
    name: &str,
    delivery: sidecore_types::Delivery,
    (offcode, port): (usize, usize),
) -> Result<Attachment, String> {
    let sender = StreamSender::connect(addr, name, delivery, STEP_TIMEOUT)
        .map_err(|e| format!("channel `{name}`: {e}"))?;
    Ok(Attachment {
        channel: name.to_string(),
        offcode,
        end: StreamEnd::Send { port, sender },
    })
}

/// Hands every part of `plan` placed on a peer node to that peer, and connects
/// the stream channels between the parts and this machine. On error, the
/// connections are dropped, and with them whatever the peers had deployed.
pub(crate) fn delegate(plan: &Plan) -> Result<Delegation, DeployError> {
    let mut nodes: Vec<&str> = Vec::new();
    for i in 0..plan.offcodes.len() {
        if let Some(n) = location(plan, i)
            && !nodes.contains(&n)
        {
            nodes.push(n);
        }
    }
    let mut out = Delegation::default();
    if nodes.is_empty() {
        return Ok(out);
    }
    // Check every crossing channel before contacting anyone.
    for ch in &plan.channels {
        let from = location(plan, ch.from.0);
        let tos: Vec<Option<&str>> = ch.to.iter().map(|t| location(plan, t.0)).collect();
        if tos.iter().all(|t| *t == from) {
            continue;
        }
        let fail = |error: String| DeployError::Channel {
            channel: ch.name.clone(),
            error,
        };
        if tos.len() != 1 {
            return Err(fail(
                "its receivers are on different machines; channels that fan out \
                 (multicast, parallel) across machines are not supported yet"
                    .into(),
            ));
        }
        if let (Some(a), Some(b)) = (from, tos[0]) {
            return Err(fail(format!(
                "it joins two peer nodes ({a} and {b}); channels between peers are not supported yet"
            )));
        }
    }
    let origin = origin_name();
    for node in nodes {
        let link = delegate_one(plan, node, &origin, &mut out.attachments).map_err(|error| {
            DeployError::Node {
                node: node.to_string(),
                error,
            }
        })?;
        out.parts.push(link);
    }
    Ok(out)
}

fn delegate_one(
    plan: &Plan,
    node: &str,
    origin: &str,
    attachments: &mut Vec<Attachment>,
) -> Result<PartLink, String> {
    let addr = plan
        .nodes
        .get(node)
        .ok_or_else(|| format!("no address known for {node}"))?;
    let sa = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to nothing"))?;
    let mut sock = TcpStream::connect_timeout(&sa, STEP_TIMEOUT)
        .map_err(|e| format!("cannot reach {addr}: {e}"))?;
    sock.set_read_timeout(Some(STEP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    let here: IpAddr = sock.local_addr().map_err(|e| e.to_string())?.ip();

    let members: Vec<usize> = (0..plan.offcodes.len())
        .filter(|&i| location(plan, i) == Some(node))
        .collect();
    let idx = |i: usize| members.iter().position(|&m| m == i);
    let mut channels = Vec::new();
    // Channels from this machine into the part (connected after the peer
    // listens), and from the part to here (we listen now).
    let mut outbound: Vec<&PlannedChannel> = Vec::new();
    let mut inbound: Vec<(&PlannedChannel, StreamListener)> = Vec::new();
    for ch in &plan.channels {
        let from = idx(ch.from.0).map(|o| (o, ch.from.1));
        let to: Vec<(usize, usize)> = ch
            .to
            .iter()
            .filter_map(|t| idx(t.0).map(|o| (o, t.1)))
            .collect();
        if from.is_none() && to.is_empty() {
            continue;
        }
        let mut connect = None;
        if from.is_some() && to.is_empty() {
            let l = StreamListener::bind((here, 0))
                .map_err(|e| format!("channel `{}`: cannot listen: {e}", ch.name))?;
            connect = Some(l.local_addr().map_err(|e| e.to_string())?.to_string());
            inbound.push((ch, l));
        } else if from.is_none() {
            outbound.push(ch);
        }
        channels.push(RemoteChannel {
            name: ch.name.clone(),
            props: ch.props,
            from,
            to,
            connect,
        });
    }
    let part = RemotePart {
        op: "deploy".into(),
        version: PART_PROTOCOL,
        app: plan.app.clone(),
        origin: origin.to_string(),
        offcodes: members
            .iter()
            .map(|&i| {
                let o = &plan.offcodes[i];
                RemoteOffcode {
                    name: o.name.clone(),
                    implementation: o.implementation.name.clone(),
                    priority: o.priority,
                    watchdog_ms: o.watchdog.map(|d| d.as_millis() as u64),
                    obsolete_ms: o.obsolete.map(|d| d.as_millis() as u64),
                    params: o.params.clone(),
                    inputs: o.inputs.clone(),
                    outputs: o.outputs.clone(),
                }
            })
            .collect(),
        channels,
    };
    send_line(&mut sock, &part).map_err(|e| format!("cannot send the part: {e}"))?;
    let mut reader = BufReader::new(sock.try_clone().map_err(|e| e.to_string())?);
    let listening = match read_reply(&mut reader, node)? {
        Reply::Listening { listening } => listening,
        Reply::Error { error } => return Err(error),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    for ch in outbound {
        let a = listening
            .get(&ch.name)
            .ok_or_else(|| format!("the peer does not listen for channel `{}`", ch.name))?;
        attachments.push(connect_end(a, &ch.name, ch.props.delivery, ch.from)?);
    }
    match read_reply(&mut reader, node)? {
        Reply::Deployed { .. } => {}
        Reply::Error { error } => return Err(error),
        other => return Err(format!("unexpected reply {other:?}")),
    }
    for (ch, l) in inbound {
        attachments.push(accept_end(&l, &ch.name, ch.to[0])?);
    }
    Ok(PartLink {
        node: node.to_string(),
        sock,
        reader,
        members,
    })
}

/// Follows a deployed part: mirrors the peer's status reports into the
/// origin's handles, and marks the part failed if the peer goes away. Returns
/// the teardown for the resource tree: it asks the peer to stop and closes the
/// lease.
pub(crate) fn follow(
    link: PartLink,
    handles: Vec<Arc<OffcodeHandle>>,
    app: String,
    events: EventLog,
) -> impl FnOnce() + Send + 'static {
    let PartLink {
        node, sock, reader, ..
    } = link;
    let stopping = Arc::new(AtomicBool::new(false));
    let st = Arc::clone(&stopping);
    let _ = sock.set_read_timeout(None);
    let thread = std::thread::Builder::new()
        .name("sc-remote".into())
        .spawn(move || mirror(reader, &handles, &node, &app, &events, &st))
        .ok();
    let sock = Mutex::new(Some(sock));
    move || {
        stopping.store(true, Ordering::Release);
        if let Some(mut s) = sock.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            let _ = send_line(&mut s, &OriginOp { op: "stop".into() });
            // Let the mirror take the peer's last report (its counters at rest) until
            // the peer closes the lease, bounded in case it never answers.
            let _ = s.set_read_timeout(Some(STEP_TIMEOUT));
            let _ = s.shutdown(Shutdown::Write);
        }
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

fn mirror(
    mut r: BufReader<TcpStream>,
    handles: &[Arc<OffcodeHandle>],
    node: &str,
    app: &str,
    events: &EventLog,
    stopping: &AtomicBool,
) {
    for h in handles {
        h.set_state(OffcodeState::Running);
    }
    let mut buf = Vec::new();
    let lost = loop {
        match read_line(&mut r, &mut buf) {
            Ok(Some(line)) => match serde_json::from_str::<Reply>(line.trim()) {
                Ok(Reply::Status { status }) => {
                    for o in &status.offcodes {
                        if let Some(h) = handles.iter().find(|h| h.name == o.name) {
                            h.handled.store(o.handled, Ordering::Relaxed);
                            h.sent.store(o.sent, Ordering::Relaxed);
                            h.dropped.store(o.dropped, Ordering::Relaxed);
                            h.turns.store(o.turns, Ordering::Relaxed);
                            for (k, v) in &o.metrics {
                                h.metrics.metric(k).set(*v);
                            }
                            if let Some(why) = &o.stop_reason {
                                h.request_stop(format!("on {node}: {why}"));
                            }
                            h.set_state(o.state);
                            if o.state.is_final() && !h.exited() {
                                events.emit(
                                    app,
                                    &h.name,
                                    match o.state {
                                        OffcodeState::Done => EventKind::Done,
                                        OffcodeState::Failed => EventKind::Failed {
                                            error: format!(
                                                "on {node}: {}",
                                                o.stop_reason.as_deref().unwrap_or("failed")
                                            ),
                                        },
                                        _ => EventKind::Stopped {
                                            reason: format!(
                                                "on {node}: {}",
                                                o.stop_reason.as_deref().unwrap_or("stopped")
                                            ),
                                        },
                                    },
                                );
                                h.set_exited();
                            }
                        }
                    }
                    if status.state != AppState::Running {
                        for h in handles {
                            h.set_exited();
                        }
                    }
                }
                Ok(Reply::Error { error }) => break format!("node {node} reported: {error}"),
                Ok(_) => {}
                Err(e) => break format!("node {node} sent a malformed status: {e}"),
            },
            Ok(None) => break format!("node {node} closed the connection"),
            Err(e) => break format!("connection to node {node} lost: {e}"),
        }
    };
    if stopping.load(Ordering::Acquire) {
        return;
    }
    for h in handles {
        if !h.exited() {
            h.request_stop(lost.clone());
            h.set_state(OffcodeState::Failed);
            events.emit(
                app,
                &h.name,
                EventKind::Failed {
                    error: lost.clone(),
                },
            );
            h.set_exited();
        }
    }
}

/// The peer's side: deploys the part asked for on `conn` (whose first line,
/// `first`, is the request; anything read past it is still in the buffer) into
/// `rt`, then reports its status until the origin stops it, the lease closes, or
/// `stop` is set. Errors go back to the origin.
pub fn serve(
    rt: &Arc<Runtime>,
    registry: &Registry,
    conn: BufReader<TcpStream>,
    first: &str,
    stop: &AtomicBool,
) {
    let mut w = match conn.get_ref().try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    match serve_part(rt, registry, conn.get_ref(), first) {
        Ok(id) => lease(rt, id, conn, w, stop),
        Err(error) => {
            let _ = send_line(&mut w, &Reply::Error { error });
        }
    }
}

/// Builds the plan of a part for this node: every offcode on a host executor.
pub fn part_plan(part: &RemotePart, registry: &Registry) -> Result<Plan, String> {
    let mut offcodes = Vec::new();
    for o in &part.offcodes {
        let imp = registry
            .get(&o.implementation)
            .filter(|i| i.runs_on(PeKind::Host) || i.runs_on(PeKind::Core))
            .ok_or_else(|| {
                format!(
                    "offcode `{}`: this node's library has no implementation `{}` that runs here",
                    o.name, o.implementation
                )
            })?;
        imp.check_ports(&o.inputs, &o.outputs)
            .map_err(|e| format!("offcode `{}`: {e}", o.name))?;
        offcodes.push(PlannedOffcode {
            name: o.name.clone(),
            implementation: imp.clone(),
            pe: "host".into(),
            pe_kind: PeKind::Host,
            cpu: None,
            priority: o.priority,
            watchdog: o.watchdog_ms.map(Duration::from_millis),
            obsolete: o.obsolete_ms.map(Duration::from_millis),
            params: o.params.clone(),
            inputs: o.inputs.clone(),
            outputs: o.outputs.clone(),
            module: None,
            reason: format!("placed on this node by {}", part.origin),
            fallback: None,
            excluded: Vec::new(),
        });
    }
    let channels = part
        .channels
        .iter()
        .filter_map(|c| {
            let from = c.from?;
            (!c.to.is_empty()).then(|| PlannedChannel {
                name: c.name.clone(),
                from,
                to: c.to.clone(),
                props: c.props,
                transport: if c.props.order == Order::Parallel {
                    Transport::WorkQueue
                } else {
                    Transport::Ring
                },
            })
        })
        .collect();
    let n = offcodes.len();
    Ok(Plan {
        app: format!("{}@{}", part.app, part.origin),
        offcodes,
        channels,
        // The origin's layout related them: they start together.
        groups: vec![(0..n).collect()],
        layout: sidecore_layout::Layout {
            assignment: vec![0; n],
            offloaded_weight: 0,
            cross_bandwidth: 0.0,
            reasons: Vec::new(),
            stats: Default::default(),
        },
        nodes: BTreeMap::new(),
    })
}

fn serve_part(
    rt: &Arc<Runtime>,
    registry: &Registry,
    sock: &TcpStream,
    first: &str,
) -> Result<AppId, String> {
    let part = RemotePart::parse(first.trim())?;
    let plan = part_plan(&part, registry)?;
    let here = sock.local_addr().map_err(|e| e.to_string())?.ip();
    let mut w = sock.try_clone().map_err(|e| e.to_string())?;
    let mut listeners = Vec::new();
    let mut listening = BTreeMap::new();
    for c in part.channels.iter().filter(|c| c.from.is_none()) {
        let l = StreamListener::bind((here, 0))
            .map_err(|e| format!("channel `{}`: cannot listen: {e}", c.name))?;
        listening.insert(
            c.name.clone(),
            l.local_addr().map_err(|e| e.to_string())?.to_string(),
        );
        listeners.push((c, l));
    }
    send_line(&mut w, &Reply::Listening { listening }).map_err(|e| e.to_string())?;
    let mut attachments = Vec::new();
    for (c, l) in listeners {
        attachments.push(accept_end(&l, &c.name, c.to[0])?);
    }
    for c in &part.channels {
        if let (Some(from), Some(a)) = (c.from, &c.connect) {
            attachments.push(connect_end(a, &c.name, c.props.delivery, from)?);
        }
    }
    let id = rt
        .deploy_attached(&plan, attachments)
        .map_err(|e| e.to_string())?;
    if let Err(e) = send_line(
        &mut w,
        &Reply::Deployed {
            app: plan.app.clone(),
        },
    ) {
        rt.stop_app(id);
        return Err(e.to_string());
    }
    Ok(id)
}

/// Reports the part's status until the origin says stop or goes away.
fn lease(
    rt: &Arc<Runtime>,
    id: AppId,
    mut r: BufReader<TcpStream>,
    mut w: TcpStream,
    stop: &AtomicBool,
) {
    let _ = r.get_ref().set_read_timeout(Some(STATUS_EVERY));
    let mut buf = Vec::new();
    let mut next = Instant::now();
    loop {
        if stop.load(Ordering::Acquire) {
            break;
        }
        if Instant::now() >= next {
            next = Instant::now() + STATUS_EVERY;
            let Some(s) = rt.status_of(id) else { break };
            if send_line(&mut w, &Reply::Status { status: s }).is_err() {
                break;
            }
        }
        match read_line(&mut r, &mut buf) {
            Ok(Some(line)) => {
                if serde_json::from_str::<OriginOp>(line.trim()).is_ok_and(|o| o.op == "stop") {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    // The last report, read once the part has stopped: the origin's final status
    // then agrees with what really ran here.
    if let Some((_, s)) = rt.stop_app_with_status(id) {
        let _ = send_line(&mut w, &Reply::Status { status: s });
    }
}
