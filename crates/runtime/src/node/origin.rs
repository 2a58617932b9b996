//! The origin's side of a remote part: hands each part of a plan placed on a
//! peer node to that peer, connects the stream channels between the part and
//! this machine, then follows the part (mirrors the peer's status reports into
//! the origin's handles, marks the part failed if the peer goes away) until
//! the app stops. The peer is gone when its connection closes, when an Orion
//! monitor of this process declares its node dead (`sidecore_orion::health`),
//! or when its status reports stop for [`LEASE_DEADLINE`] (a frozen peer keeps
//! its connection open).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sidecore_channel::stream::StreamListener;
use sidecore_types::{AppState, AppStatus, OffcodeState, PeKind};
use sidecore_wire::session::OriginGrammar;
use sidecore_wire::{Link, LinkError, Message, Received, RemoteChannel, RemoteOffcode, RemotePart};

use super::{ChannelSetupError, STATUS_EVERY, STEP_TIMEOUT, accept_end, connect_end, listen};
use crate::error::DeployError;
use crate::events::{EventKind, EventLog};
use crate::handle::{OffcodeHandle, millis};
use crate::plan::{Plan, PlannedChannel};
use crate::transport::{Attachment, StreamEnd};

/// How long a peer's status reports may stop before its part is failed. Far
/// above [`STATUS_EVERY`]: a loaded machine delays reports, and the fast path
/// to a declaration is an Orion monitor's ring, not this lease.
pub const LEASE_DEADLINE: Duration = Duration::from_secs(5);

/// The origin's side of one peer's part, once deployed.
pub struct PartLink {
    /// The peer's PE id (`node:b`).
    pub node: String,
    link: Link<OriginGrammar>,
    /// Plan indices of the offcodes in the part, in part order.
    pub members: Vec<usize>,
    /// The sockets of the stream channels between the part and this machine,
    /// shut down when the part is lost: a local offcode blocked writing to a
    /// frozen peer then finds its channel lost instead of waiting for ever.
    sockets: Vec<std::net::TcpStream>,
}

/// What delegating the remote parts of a plan produced.
#[derive(Default)]
pub struct Delegation {
    pub attachments: Vec<Attachment>,
    pub parts: Vec<PartLink>,
}

/// Where an offcode of a plan runs: `None` here, `Some(pe)` on that peer.
fn location(plan: &Plan, i: usize) -> Option<&str> {
    let o = &plan.offcodes[i];
    (o.pe_kind == PeKind::Node).then_some(o.pe.as_str())
}

/// What went wrong with one peer.
enum PartError {
    Link(LinkError),
    Channel(ChannelSetupError),
    /// The peer's own reason, or a plan that names no address for it.
    Peer(String),
}

impl From<LinkError> for PartError {
    fn from(e: LinkError) -> Self {
        PartError::Link(e)
    }
}

impl From<ChannelSetupError> for PartError {
    fn from(e: ChannelSetupError) -> Self {
        PartError::Channel(e)
    }
}

/// Hands every part of `plan` placed on a peer node to that peer, and connects
/// the stream channels between the parts and this machine. On error, the
/// connections are dropped, and with them whatever the peers had deployed.
pub fn delegate(plan: &Plan) -> Result<Delegation, DeployError> {
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
    check_crossings(plan)?;
    let nodes = receivers_first(plan, nodes)?;
    let hello = sidecore_pe::node::hello();
    let fail = |node: &str| {
        let node = node.to_string();
        move |e| match e {
            PartError::Link(e) => DeployError::Link(e),
            PartError::Channel(e) => DeployError::Node {
                node: node.clone(),
                error: e.to_string(),
            },
            PartError::Peer(error) => DeployError::Node {
                node: node.clone(),
                error,
            },
        }
    };
    // Every part is asked for first, receivers of peer-to-peer channels before
    // their senders (whose parts connect to the addresses the receivers listen
    // on); then each part's deployment is awaited.
    let mut p2p: BTreeMap<String, String> = BTreeMap::new();
    let mut opened = Vec::new();
    for node in nodes {
        let before = out.attachments.len();
        let mut o =
            open_part(plan, node, &hello, &mut p2p, &mut out.attachments).map_err(fail(node))?;
        o.link.sockets = sockets(&out.attachments[before..]);
        opened.push(o);
    }
    for o in opened {
        let node = o.link.node.clone();
        let before = out.attachments.len();
        let mut part = finish_part(o, &mut out.attachments).map_err(fail(&node))?;
        part.sockets.extend(sockets(&out.attachments[before..]));
        out.parts.push(part);
    }
    Ok(out)
}

/// Second handles on the sockets of `attachments` (those that can be had).
fn sockets(attachments: &[Attachment]) -> Vec<std::net::TcpStream> {
    attachments
        .iter()
        .filter_map(|a| match &a.end {
            StreamEnd::Send { sender, .. } => sender.socket().ok(),
            StreamEnd::Recv { receiver, .. } => receiver.socket().ok(),
        })
        .collect()
}

/// The peer nodes ordered so that the receiving end of every channel between two
/// peers is asked for before the sending end; refused when channels run both ways
/// between peers (a cycle), which this order cannot serve.
fn receivers_first<'p>(plan: &'p Plan, nodes: Vec<&'p str>) -> Result<Vec<&'p str>, DeployError> {
    let edges: Vec<(&str, &str, &str)> = plan
        .channels
        .iter()
        .filter_map(|ch| {
            let from = location(plan, ch.from.0)?;
            let to = location(plan, ch.to.first()?.0)?;
            (from != to).then_some((from, to, ch.name.as_str()))
        })
        .collect();
    let mut left = nodes;
    let mut order = Vec::new();
    while !left.is_empty() {
        // A node none of whose peer-to-peer channels goes to a node still left.
        let Some(i) = left
            .iter()
            .position(|n| !edges.iter().any(|(f, t, _)| f == n && left.contains(t)))
        else {
            let (f, t, ch) = edges
                .iter()
                .find(|(f, t, _)| left.contains(f) && left.contains(t))
                .copied()
                .unwrap_or(("?", "?", "?"));
            return Err(DeployError::Channel {
                channel: ch.to_string(),
                error: format!(
                    "it joins {f} to {t}, and channels between these peers run both ways \
                     (a cycle); peer-to-peer channels must form no cycle between nodes"
                ),
            });
        };
        order.push(left.remove(i));
    }
    Ok(order)
}

/// Refuses, before contacting anyone, a channel that crosses machines in a way
/// streams cannot carry yet.
fn check_crossings(plan: &Plan) -> Result<(), DeployError> {
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
        if ch.props.zero_copy {
            return Err(fail(
                "it is zero_copy (the sender writes into the slot the receiver reads), which \
                 needs shared memory, but its ends are on different machines and a TCP \
                 stream copies; set zero_copy = false, or keep both ends on this machine"
                    .into(),
            ));
        }
        if tos.len() != 1 {
            return Err(fail(
                "its receivers are on different machines; channels that fan out \
                 (multicast, parallel) across machines are not supported yet"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// The deploy request for `node`'s part, the channels the origin connects into
/// it once the peer listens, and the listeners for channels out of it.
struct PartRequest<'p> {
    part: RemotePart,
    outbound: Vec<&'p PlannedChannel>,
    inbound: Vec<(&'p PlannedChannel, StreamListener)>,
}

fn part_request<'p>(
    plan: &'p Plan,
    members: &[usize],
    here: IpAddr,
    origin: &str,
    p2p: &BTreeMap<String, String>,
) -> Result<PartRequest<'p>, ChannelSetupError> {
    let idx = |i: usize| members.iter().position(|&m| m == i);
    let (mut channels, mut outbound, mut inbound) = (Vec::new(), Vec::new(), Vec::new());
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
        let receiver_on_peer = ch.to.first().and_then(|t| location(plan, t.0)).is_some();
        let sender_on_peer = location(plan, ch.from.0).is_some();
        if from.is_some() && to.is_empty() && receiver_on_peer {
            // Out of the part to another peer, asked for first: connect to it.
            let addr = p2p
                .get(&ch.name)
                .ok_or_else(|| ChannelSetupError::NotListening(ch.name.clone()))?;
            connect = Some(addr.clone());
        } else if from.is_some() && to.is_empty() {
            // Out of the part to here: listen now, the peer connects.
            let (l, addr) = listen(here, &ch.name)?;
            connect = Some(addr);
            inbound.push((ch, l));
        } else if from.is_none() && !sender_on_peer {
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
    let offcodes = members
        .iter()
        .map(|&i| {
            let o = &plan.offcodes[i];
            RemoteOffcode {
                name: o.name.clone(),
                implementation: o.implementation.name.clone(),
                priority: o.priority,
                watchdog_ms: o.watchdog.map(millis),
                obsolete_ms: o.obsolete.map(millis),
                params: o.params.clone(),
                inputs: o.inputs.clone(),
                outputs: o.outputs.clone(),
                calls: o.calls.clone(),
                restart: o.restart.restarts().then_some(o.restart),
            }
        })
        .collect();
    Ok(PartRequest {
        part: RemotePart {
            app: plan.app.clone(),
            origin: origin.to_string(),
            offcodes,
            channels,
        },
        outbound,
        inbound,
    })
}

/// Waits for the next step's message; the peer's own error is its reason.
fn step(link: &Link<OriginGrammar>) -> Result<Message, PartError> {
    match link.expect(STEP_TIMEOUT)? {
        Message::Error { error } => Err(PartError::Peer(error)),
        m => Ok(m),
    }
}

/// A part asked for, not yet reported deployed.
struct Opened<'p> {
    link: PartLink,
    inbound: Vec<(&'p PlannedChannel, StreamListener)>,
}

/// Connects to `node`, asks it to deploy its part and connects the origin's
/// channels into it once it listens; records where it listens for channels from
/// other peers in `p2p`.
fn open_part<'p>(
    plan: &'p Plan,
    node: &str,
    hello: &sidecore_wire::Hello,
    p2p: &mut BTreeMap<String, String>,
    attachments: &mut Vec<Attachment>,
) -> Result<Opened<'p>, PartError> {
    let addr = plan
        .nodes
        .get(node)
        .ok_or_else(|| PartError::Peer(format!("no address known for {node}")))?;
    let link = Link::connect(
        addr,
        &format!("peer {node} at {addr}"),
        hello.clone(),
        STEP_TIMEOUT,
    )?;
    step(&link)?; // the welcome: the grammar admits nothing else first
    let here = link.local_addr()?.ip();
    let members: Vec<usize> = (0..plan.offcodes.len())
        .filter(|&i| location(plan, i) == Some(node))
        .collect();
    let req = part_request(plan, &members, here, &hello.origin, p2p)?;
    link.send(&Message::Deploy(req.part))?;
    let Message::Listening {
        channels: listening,
    } = step(&link)?
    else {
        unreachable!("the origin grammar admits only `listening` after a deploy");
    };
    for ch in req.outbound {
        let a = listening
            .get(&ch.name)
            .ok_or_else(|| ChannelSetupError::NotListening(ch.name.clone()))?;
        attachments.push(connect_end(a, &ch.name, ch.props.delivery, ch.from)?);
    }
    // Channels into this part from other peers: their senders connect here.
    for ch in &plan.channels {
        let into_here = ch.to.first().is_some_and(|t| members.contains(&t.0));
        if into_here && location(plan, ch.from.0).is_some_and(|f| f != node) {
            let a = listening
                .get(&ch.name)
                .ok_or_else(|| ChannelSetupError::NotListening(ch.name.clone()))?;
            p2p.insert(ch.name.clone(), a.clone());
        }
    }
    Ok(Opened {
        link: PartLink {
            node: node.to_string(),
            link,
            members,
            sockets: Vec::new(),
        },
        inbound: req.inbound,
    })
}

/// Waits for an opened part to report itself deployed, and accepts its channels
/// to the origin.
fn finish_part(o: Opened<'_>, attachments: &mut Vec<Attachment>) -> Result<PartLink, PartError> {
    step(&o.link.link)?; // deployed
    for (ch, l) in o.inbound {
        attachments.push(accept_end(&l, &ch.name, ch.to[0])?);
    }
    Ok(o.link)
}

/// Follows a deployed part: mirrors the peer's status reports into the
/// origin's handles, and marks the part failed if the peer goes away. Returns
/// the teardown for the resource tree: it asks the peer to stop, takes its last
/// report, and closes the lease.
pub fn follow(
    part: PartLink,
    handles: Vec<Arc<OffcodeHandle>>,
    app: String,
    events: EventLog,
) -> impl FnOnce() + Send + 'static {
    let PartLink {
        node,
        link,
        sockets,
        ..
    } = part;
    let stopping = Arc::new(AtomicBool::new(false));
    let st = Arc::clone(&stopping);
    let reader = link.clone();
    let thread = std::thread::Builder::new()
        .name("sc-remote".into())
        .spawn(move || {
            let mirror = Mirror {
                handles: &handles,
                node: &node,
                app: &app,
                events: &events,
                sockets: &sockets,
            };
            mirror.run(&reader, &st);
        })
        .ok();
    move || {
        stopping.store(true, Ordering::Release);
        // Stop, then let the mirror take the peer's last report (its counters
        // at rest) until the peer closes the lease.
        let _ = link.send(&Message::Stop);
        link.shutdown_write();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// The mirror thread's view of a part.
struct Mirror<'a> {
    handles: &'a [Arc<OffcodeHandle>],
    node: &'a str,
    app: &'a str,
    events: &'a EventLog,
    sockets: &'a [std::net::TcpStream],
}

impl Mirror<'_> {
    fn run(&self, link: &Link<OriginGrammar>, stopping: &AtomicBool) {
        for h in self.handles {
            h.set_state(OffcodeState::Running);
        }
        // Polled, so that once stopping, a peer that never answers the stop
        // holds the teardown for at most STEP_TIMEOUT.
        let mut stop_seen: Option<Instant> = None;
        let mut last_status = Instant::now();
        let pe = self.node.to_string();
        let lost = loop {
            match link.recv(Some(STATUS_EVERY)) {
                Ok(Received::Message(Message::Status(s))) => {
                    last_status = Instant::now();
                    self.report(&s);
                }
                Ok(Received::Message(Message::Error { error })) => {
                    break format!("node {} reported: {error}", self.node);
                }
                Ok(Received::Message(_)) => {}
                Ok(Received::Closed) => break format!("node {} closed the connection", self.node),
                Ok(Received::TimedOut) => {}
                Err(e) => break format!("connection to node {} lost: {e}", self.node),
            }
            // A peer declared dead will not answer a stop either.
            if let Some(why) = crate::dead::declared(&pe) {
                break why;
            }
            if stopping.load(Ordering::Acquire) {
                if stop_seen.get_or_insert_with(Instant::now).elapsed() > STEP_TIMEOUT {
                    break format!("node {} did not answer the stop", self.node);
                }
                continue;
            }
            if last_status.elapsed() > LEASE_DEADLINE {
                break format!(
                    "node {} sent no status for {} ms (lease deadline)",
                    self.node,
                    last_status.elapsed().as_millis()
                );
            }
        };
        if !stopping.load(Ordering::Acquire) {
            self.fail_all(&lost);
        }
    }

    /// Mirrors one status report.
    fn report(&self, status: &AppStatus) {
        for o in &status.offcodes {
            let Some(h) = self.handles.iter().find(|h| h.name == o.name) else {
                continue;
            };
            h.mirror(o);
            if let Some(why) = &o.stop_reason {
                h.request_stop(format!("on {}: {why}", self.node));
            }
            if o.state.is_final() && !h.exited() {
                let why = |default: &str| {
                    format!(
                        "on {}: {}",
                        self.node,
                        o.stop_reason.as_deref().unwrap_or(default)
                    )
                };
                let kind = match o.state {
                    OffcodeState::Done => EventKind::Done,
                    OffcodeState::Failed => EventKind::Failed {
                        error: why("failed"),
                    },
                    _ => EventKind::Stopped {
                        reason: why("stopped"),
                    },
                };
                self.events.emit(self.app, &h.name, kind);
                h.set_exited();
            }
        }
        if status.state != AppState::Running {
            for h in self.handles {
                h.set_exited();
            }
        }
    }

    /// The peer went away while the part ran: its offcodes failed, and its
    /// channels to this machine are shut down (their local ends find them
    /// lost, and wait for a re-placement).
    fn fail_all(&self, lost: &str) {
        crate::dead::fail(self.handles, self.app, self.events, lost);
        for s in self.sockets {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
