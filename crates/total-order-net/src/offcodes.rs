//! The total order as offcodes (HYDRA §8.2.1, Figure 8.6):
//!
//! | offcode | what it does | ports |
//! |---|---|---|
//! | `reliable-broadcast` (β) | owns the UDP socket: broadcasts what α stamped, NACKs holes, hands every payload to the TO service at once and (sender, seq, stamp) to α | in `send`; out `up`, `payload` |
//! | `lamport-orderer` (α) | stamps what the TO service submits, orders what β delivers, and sends the order back through a call of `IToService.order` | in `submit`, `up`; out `send` |
//! | `to-service` | the TO service library in an offcode with a load: broadcasts `messages` messages under flow control, serves `IToService.order`, counts what it delivers and hashes their order (`order_hash`) | in `payload`; out `submit` |
//!
//! The layout decides where α runs: "to-service Link α, α Pull β" puts α
//! beside β; swapping the two constraints puts it beside the TO service.
//! Messages on the channels (little-endian): `send` is `0 | stamp u64 |
//! payload` or `1 | clock u64`; `up` is `0 | sender u16 | seq u64 | stamp u64`
//! or `1 | sender u16 | clock u64`; `payload` is `sender u16 | seq u64 |
//! payload`. A malformed message is counted (`malformed`) and dropped.

use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use sidecore_channel::SendOutcome;
use sidecore_offcode::{
    CallError, CallFault, Implementation, IncomingCall, InitCx, InputId, InterfaceSig, Interfaces,
    Invocation, MethodSig, Metric, Offcode, OffcodeError, OutputId, PendingCall, Progress,
    Registry, RunCx, parse_params,
};
use sidecore_total_order::{
    Dest, LamportOrderer, MsgId, RbConfig, RbEvent, ReliableBroadcast, ToService,
};
use sidecore_types::{PeKind, ValueType};

use crate::drive::{payload, sent_at};

/// The interface α calls on the TO service.
pub const INTERFACE: &str = "IToService";
/// `IToService`: `order(sender, seq)`, the next message in the total order.
pub const METHODS: &[MethodSig] = &[MethodSig {
    name: "order",
    params: &[ValueType::U16, ValueType::U64],
    returns: None,
}];
/// The default UDP port of β.
pub const DEFAULT_PORT: u16 = 7400;
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;
/// Messages β moves per turn.
const BURST: usize = 64;

fn interface() -> InterfaceSig {
    InterfaceSig {
        name: INTERFACE,
        methods: METHODS,
    }
}

/// Where a node is in its group.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    me: usize,
    nodes: usize,
}

fn params_err(e: impl std::fmt::Display) -> OffcodeError {
    OffcodeError::Params(e.to_string())
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)?.try_into().ok().map(u64::from_le_bytes)
}
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2)?.try_into().ok().map(u16::from_le_bytes)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BetaParams {
    me: usize,
    nodes: usize,
    /// Every node's `ip:port`, this one's included (ignored).
    #[serde(default)]
    peers: Vec<String>,
    #[serde(default = "default_port")]
    port: u16,
    /// The network namespace to open the socket in.
    #[serde(default)]
    netns: Option<String>,
}

fn default_port() -> u16 {
    DEFAULT_PORT
}

/// β as an offcode.
pub struct Beta {
    rb: ReliableBroadcast,
    peers: Vec<SocketAddr>,
    port: u16,
    netns: Option<String>,
    sock: Option<UdpSocket>,
    epoch: Instant,
    ports: Option<(InputId, OutputId, OutputId)>,
    /// Messages for `up` and `payload` the channels had no room for.
    backlog: VecDeque<(bool, Vec<u8>)>,
    malformed: Metric,
    delivered: Metric,
    retransmitted: Metric,
    nacks_sent: Metric,
}

impl Beta {
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let p: BetaParams = parse_params(params)?;
        let rb = ReliableBroadcast::new(p.me, p.nodes, RbConfig::default()).map_err(params_err)?;
        if p.nodes > 1 && p.peers.len() != p.nodes {
            return Err(params_err(format!(
                "`peers` lists {} addresses for a group of {} nodes",
                p.peers.len(),
                p.nodes
            )));
        }
        let peers = p
            .peers
            .iter()
            .enumerate()
            .map(|(i, a)| {
                a.parse()
                    .map_err(|e| params_err(format!("`peers[{i}]` = {a:?}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Beta {
            rb,
            peers,
            port: p.port,
            netns: p.netns,
            sock: None,
            epoch: Instant::now(),
            ports: None,
            backlog: VecDeque::new(),
            malformed: Metric::default(),
            delivered: Metric::default(),
            retransmitted: Metric::default(),
            nacks_sent: Metric::default(),
        })
    }

    fn out(&mut self, cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        let Some((_, up, pay)) = self.ports else {
            return Ok(());
        };
        while let Some((to_up, m)) = self.backlog.front() {
            let port = if *to_up { up } else { pay };
            if cx.send_bytes(port, m)? == SendOutcome::Full {
                break;
            }
            self.backlog.pop_front();
        }
        Ok(())
    }
}

impl Offcode for Beta {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.ports = Some((cx.input("send")?, cx.output("up")?, cx.output("payload")?));
        self.malformed = cx.metric("malformed");
        self.delivered = cx.metric("delivered");
        self.retransmitted = cx.metric("retransmitted");
        self.nacks_sent = cx.metric("nacks_sent");
        let port = self.port;
        let sock =
            sidecore_testbed::within(self.netns.as_deref(), || UdpSocket::bind(("0.0.0.0", port)))
                .map_err(|e| OffcodeError::failed(e.to_string()))?
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
                .map_err(|e| OffcodeError::failed(format!("UDP port {port}: {e}")))?;
        self.sock = Some(sock);
        Ok(())
    }

    fn handle(
        &mut self,
        _cx: &mut RunCx<'_>,
        _input: InputId,
        msg: &[u8],
    ) -> Result<(), OffcodeError> {
        match (msg.first(), u64_at(msg, 1)) {
            (Some(0), Some(stamp)) => {
                if self.rb.broadcast(stamp, msg[9..].to_vec()).is_err() {
                    self.malformed.add(1);
                }
            }
            (Some(1), Some(clock)) => self.rb.set_clock(clock),
            _ => self.malformed.add(1),
        }
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut busy = false;
        let mut buf = [0u8; 2048];
        if let Some(s) = &self.sock {
            for _ in 0..BURST {
                let Ok(len) = s.recv(&mut buf) else { break };
                self.rb.on_datagram(&buf[..len], now);
                busy = true;
            }
        }
        self.rb.tick(now);
        while let Some(e) = self.rb.poll_event() {
            busy = true;
            match e {
                RbEvent::Delivered {
                    sender,
                    seq,
                    stamp,
                    payload,
                } => {
                    self.delivered.add(1);
                    let mut up = vec![0u8];
                    up.extend_from_slice(&sender.to_le_bytes());
                    up.extend_from_slice(&seq.to_le_bytes());
                    up.extend_from_slice(&stamp.to_le_bytes());
                    let mut p = sender.to_le_bytes().to_vec();
                    p.extend_from_slice(&seq.to_le_bytes());
                    p.extend_from_slice(&payload);
                    self.backlog.push_back((false, p));
                    self.backlog.push_back((true, up));
                }
                RbEvent::Stable { sender, clock } => {
                    let mut up = vec![1u8];
                    up.extend_from_slice(&sender.to_le_bytes());
                    up.extend_from_slice(&clock.to_le_bytes());
                    self.backlog.push_back((true, up));
                }
            }
        }
        self.out(cx)?;
        self.rb.flush(now);
        if let Some(s) = &self.sock {
            let me = usize::from(self.rb.me());
            while let Some(t) = self.rb.poll_transmit() {
                match t.dest {
                    Dest::All => {
                        for (j, a) in self.peers.iter().enumerate() {
                            if j != me {
                                let _ = s.send_to(&t.bytes, a);
                            }
                        }
                    }
                    Dest::To(j) => {
                        if let Some(a) = self.peers.get(usize::from(j)) {
                            let _ = s.send_to(&t.bytes, a);
                        }
                    }
                }
            }
        }
        let st = self.rb.stats();
        self.malformed.set(self.malformed.get().max(st.malformed));
        self.retransmitted.set(st.retransmitted);
        self.nacks_sent.set(st.nacks_sent);
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }
}

/// α as an offcode.
pub struct Alpha {
    alpha: LamportOrderer,
    next_seq: u64,
    told: u64,
    ports: Option<(InputId, InputId, OutputId)>,
    order: VecDeque<MsgId>,
    calls: VecDeque<PendingCall>,
    malformed: Metric,
    ordered: Metric,
}

impl Alpha {
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let g: Group = parse_params(params)?;
        Ok(Alpha {
            alpha: LamportOrderer::new(g.me, g.nodes).map_err(params_err)?,
            next_seq: 0,
            told: 0,
            ports: None,
            order: VecDeque::new(),
            calls: VecDeque::new(),
            malformed: Metric::default(),
            ordered: Metric::default(),
        })
    }
}

impl Offcode for Alpha {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.ports = Some((cx.input("submit")?, cx.input("up")?, cx.output("send")?));
        self.malformed = cx.metric("malformed");
        self.ordered = cx.metric("ordered");
        Ok(())
    }

    fn handle(
        &mut self,
        cx: &mut RunCx<'_>,
        input: InputId,
        msg: &[u8],
    ) -> Result<(), OffcodeError> {
        let Some((submit, _, send)) = self.ports else {
            return Ok(());
        };
        if input == submit {
            let stamp = self.alpha.stamp(self.next_seq);
            self.next_seq += 1;
            let mut m = vec![0u8];
            m.extend_from_slice(&stamp.to_le_bytes());
            m.extend_from_slice(msg);
            // A reliable channel: a full ring here would lose the stamp; the
            // TO service's window keeps it from filling.
            if cx.send_bytes(send, &m)? != SendOutcome::Sent {
                return Err(OffcodeError::failed("the channel to β is full"));
            }
            return Ok(());
        }
        match (msg.first(), u16_at(msg, 1), u64_at(msg, 3), u64_at(msg, 11)) {
            (Some(0), Some(s), Some(seq), Some(stamp)) => self.alpha.on_delivered(s, seq, stamp),
            (Some(1), Some(s), Some(clock), _) => self.alpha.on_stable(s, clock),
            _ => self.malformed.add(1),
        }
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        while let Some(id) = self.alpha.poll_order() {
            self.order.push_back(id);
        }
        let busy = !self.order.is_empty() || !self.calls.is_empty();
        // The order goes back through calls, in order, each awaited in turn.
        while let Some(id) = self.order.front() {
            match cx.call(INTERFACE, "order", &(id.sender, id.seq), Invocation::Simple) {
                Ok(p) => {
                    self.calls.push_back(p);
                    self.order.pop_front();
                    self.ordered.add(1);
                }
                Err(CallError::ChannelFull | CallError::TableFull(_)) => break,
                Err(e) => return Err(e.into()),
            }
        }
        while let Some(c) = self.calls.front() {
            match cx.call_result::<()>(INTERFACE, c)? {
                Some(()) => {
                    self.calls.pop_front();
                }
                None => break,
            }
        }
        if let Some((_, _, send)) = self.ports
            && self.alpha.clock() > self.told
        {
            let mut m = vec![1u8];
            m.extend_from_slice(&self.alpha.clock().to_le_bytes());
            if cx.send_bytes(send, &m)? == SendOutcome::Sent {
                self.told = self.alpha.clock();
            }
        }
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppParams {
    me: usize,
    nodes: usize,
    /// Messages this node broadcasts.
    #[serde(default = "default_messages")]
    messages: u64,
    #[serde(default = "default_window")]
    window: usize,
    #[serde(default = "default_payload")]
    payload_bytes: usize,
    /// Once every node's messages are delivered, write what this node saw
    /// here as JSON ([`Record`]): the order, each broadcast-to-deliver
    /// latency, and when its first broadcast and its last delivery were.
    #[serde(default)]
    record: Option<std::path::PathBuf>,
}

/// What `to-service` writes to its `record` file once it has delivered every
/// node's messages. Times are CLOCK_MONOTONIC nanoseconds, one clock for
/// every process of the machine, so the nodes' records can be pooled.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct Record {
    /// (sender, seq) of each delivery, in order.
    pub order: Vec<(u16, u64)>,
    pub latencies_ns: Vec<u64>,
    pub first_broadcast_ns: u64,
    pub done_ns: u64,
}

/// CLOCK_MONOTONIC now, ns: the payloads' send times, comparable between
/// processes on one machine (namespaces share it).
#[must_use]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

fn default_messages() -> u64 {
    1000
}
fn default_window() -> usize {
    32
}
fn default_payload() -> usize {
    64
}

/// The TO service with a load, as an offcode.
pub struct ToApp {
    svc: ToService,
    messages: u64,
    sent: u64,
    payload_bytes: usize,
    submit: Option<OutputId>,
    /// Messages the whole group broadcasts (`nodes` × `messages`).
    total: u64,
    /// Where to write the [`Record`], and what it holds so far (`None`
    /// once written, or without `record`).
    record: Option<(std::path::PathBuf, Record)>,
    /// FNV-1a over the (sender, seq) of every delivery, in order: nodes that
    /// delivered the same sequence show the same `order_hash`.
    hash: u64,
    m: [Metric; 5],
}

impl ToApp {
    pub fn new(params: &toml::Table) -> Result<Self, OffcodeError> {
        let p: AppParams = parse_params(params)?;
        if !(8..=1024).contains(&p.payload_bytes) {
            return Err(params_err(format!(
                "`payload_bytes` = {} (between 8 and 1024)",
                p.payload_bytes
            )));
        }
        Ok(ToApp {
            svc: ToService::new(p.me, p.nodes, p.window).map_err(params_err)?,
            messages: p.messages,
            sent: 0,
            payload_bytes: p.payload_bytes,
            submit: None,
            total: p.messages.saturating_mul(p.nodes as u64),
            record: p.record.map(|path| {
                (
                    path,
                    Record {
                        order: Vec::new(),
                        latencies_ns: Vec::new(),
                        first_broadcast_ns: 0,
                        done_ns: 0,
                    },
                )
            }),
            hash: FNV_OFFSET,
            m: Default::default(),
        })
    }
}

impl Offcode for ToApp {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.submit = Some(cx.output("submit")?);
        self.m = [
            cx.metric("broadcast"),
            cx.metric("delivered"),
            cx.metric("malformed"),
            cx.metric("latency_us_last"),
            cx.metric("order_hash"),
        ];
        Ok(())
    }

    fn handle(
        &mut self,
        _cx: &mut RunCx<'_>,
        _input: InputId,
        msg: &[u8],
    ) -> Result<(), OffcodeError> {
        match (u16_at(msg, 0), u64_at(msg, 2)) {
            (Some(sender), Some(seq)) => self
                .svc
                .on_payload(MsgId { sender, seq }, msg[10..].to_vec()),
            _ => self.m[2].add(1),
        }
        Ok(())
    }

    fn serve(
        &mut self,
        _cx: &mut RunCx<'_>,
        call: &IncomingCall<'_>,
    ) -> Result<Vec<u8>, CallFault> {
        if call.method != "order" {
            return Err(CallFault::NOT_SERVED);
        }
        let (sender, seq): (u16, u64) = call.decode()?;
        self.svc.on_order(MsgId { sender, seq });
        Ok(Vec::new())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let Some(submit) = self.submit else {
            return Ok(Progress::Idle);
        };
        let now = mono_ns();
        let mut busy = false;
        if let Some((_, r)) = &mut self.record
            && r.first_broadcast_ns == 0
        {
            r.first_broadcast_ns = now;
        }
        while self.sent < self.messages && self.svc.can_broadcast() {
            if self
                .svc
                .to_broadcast(payload(now, self.payload_bytes))
                .is_err()
            {
                break;
            }
            self.sent += 1;
            self.m[0].add(1);
        }
        while let Some(p) = self.svc.take_outgoing() {
            busy = true;
            if cx.send_bytes(submit, &p)? != SendOutcome::Sent {
                return Err(OffcodeError::failed("the channel to α is full"));
            }
        }
        while let Some(d) = self.svc.to_receive() {
            busy = true;
            self.m[1].add(1);
            let lat = now.saturating_sub(sent_at(&d.payload));
            self.m[3].set(lat / 1000);
            if let Some((_, r)) = &mut self.record {
                r.order.push((d.id.sender, d.id.seq));
                r.latencies_ns.push(lat);
            }
            for b in
                d.id.sender
                    .to_le_bytes()
                    .into_iter()
                    .chain(d.id.seq.to_le_bytes())
            {
                self.hash = (self.hash ^ u64::from(b)).wrapping_mul(FNV_PRIME);
            }
            self.m[4].set(self.hash);
        }
        if self.m[1].get() >= self.total
            && let Some((path, mut r)) = self.record.take()
        {
            r.done_ns = now;
            write_record(&path, &r)?;
        }
        Ok(if busy { Progress::Busy } else { Progress::Idle })
    }
}

/// Writes `r` to `path` whole (a temporary file renamed over it), so a reader
/// never sees half a record.
fn write_record(path: &std::path::Path, r: &Record) -> Result<(), OffcodeError> {
    let fail =
        |e: &dyn std::fmt::Display| OffcodeError::failed(format!("record {}: {e}", path.display()));
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_vec(r).map_err(|e| fail(&e))?;
    std::fs::write(&tmp, text).map_err(|e| fail(&e))?;
    std::fs::rename(&tmp, path).map_err(|e| fail(&e))
}

/// Adds `reliable-broadcast`, `lamport-orderer` and `to-service` to `reg`.
pub fn register(reg: &mut Registry) {
    let kinds = vec![PeKind::Core, PeKind::Host];
    reg.register(Implementation {
        name: "reliable-broadcast".into(),
        description:
            "β: UDP broadcast to the group with per-sender sequence numbers and NACKs on holes"
                .into(),
        kinds: kinds.clone(),
        inputs: Some(vec!["send".into()]),
        outputs: Some(vec!["up".into(), "payload".into()]),
        factory: Arc::new(|s| Ok(Box::new(Beta::new(s.params)?))),
        validate: Some(Arc::new(|p| Beta::new(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: "lamport-orderer".into(),
        description:
            "α: Lamport timestamps; the order goes back to the TO service through IToService.order"
                .into(),
        kinds: kinds.clone(),
        inputs: Some(vec!["submit".into(), "up".into()]),
        outputs: Some(vec!["send".into()]),
        factory: Arc::new(|s| Ok(Box::new(Alpha::new(s.params)?))),
        validate: Some(Arc::new(|p| Alpha::new(p).map(drop))),
        interfaces: Interfaces {
            provides: vec![],
            requires: vec![interface()],
        },
    });
    reg.register(Implementation {
        name: "to-service".into(),
        description: "the TO service (to_broadcast, to_receive, flow control) with a load of `messages` broadcasts".into(),
        kinds,
        inputs: Some(vec!["payload".into()]),
        outputs: Some(vec!["submit".into()]),
        factory: Arc::new(|s| Ok(Box::new(ToApp::new(s.params)?))),
        validate: Some(Arc::new(|p| ToApp::new(p).map(drop))),
        interfaces: Interfaces {
            provides: vec![interface()],
            requires: vec![],
        },
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(s: &str) -> toml::Table {
        s.parse().unwrap()
    }

    fn err(r: Result<impl Sized, OffcodeError>) -> String {
        match r {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_parameters_name_the_field() {
        assert!(
            err(Beta::new(&table(
                "me = 0\nnodes = 3\npeers = [\"10.0.0.1:1\"]"
            )))
            .contains("`peers` lists 1 addresses for a group of 3")
        );
        assert!(
            err(Beta::new(&table(
                "me = 0\nnodes = 2\npeers = [\"a\", \"b\"]"
            )))
            .contains("`peers[0]` = \"a\"")
        );
        assert!(
            err(Beta::new(&table("me = 5\nnodes = 2"))).contains("node 5 is not in a group of 2")
        );
        assert!(err(Alpha::new(&table("me = 0\nnodes = 0"))).contains("a group of 0 nodes"));
        assert!(err(Alpha::new(&table("me = 0\nnodes = 2\nextra = 1"))).contains("extra"));
        assert!(
            err(ToApp::new(&table("me = 0\nnodes = 2\npayload_bytes = 4")))
                .contains("`payload_bytes` = 4")
        );
        assert!(
            err(ToApp::new(&table("me = 0\nnodes = 2\nwindow = 0")))
                .contains("`window` must be at least 1")
        );
        assert!(
            Beta::new(&table(
                "me = 1\nnodes = 2\npeers = [\"10.0.0.1:7400\", \"10.0.0.2:7400\"]"
            ))
            .is_ok()
        );
    }
}
