//! The policy chain (§4.3.1–4.3.2): policies in configured order, each with a
//! fixed-size input buffer (overflow drops the message, which the protocol sees as
//! network loss); a forwarder that moves requests RECV→SEND and responses back
//! SEND→RECV; a pluggable [`Scheduler`] (round-robin, as in the seed, or
//! longest-queue-first) that picks whose handler runs next, to completion; and the
//! pending-request map whose per-request bitmap gives exactly-once handling: a
//! response visits only the policies that handled its request, so a policy that
//! generates a request alone sees its response, and a policy that answers a request
//! itself keeps its successors from seeing either.
//!
//! Flow coordination (§4.2.3) needs two more things, which replication and RBAC
//! use: a policy may *hold* a request (return no action for it) and later
//! [`Action::Resume`] it or [`Action::Complete`] it with a response, from another
//! handler or from [`Policy::on_tick`]; and a generated request may be routed to one
//! of several servers ([`Action::GenerateTo`]). Sans-IO: the driver feeds decoded
//! messages in, calls [`Chain::tick`] now and then, and sends the outputs.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::pending::{ClientKey, MAX_POLICIES, PendingError, PendingMap};

/// The server a request goes to when no policy routes it: the first (primary).
pub const PRIMARY: usize = 0;

/// What a handler asks the forwarder to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<M> {
    /// Pass the message on in its direction.
    Forward(M),
    /// Answer the request here; the response goes back through the predecessors that
    /// handled the request (in a response handler this is the same as `Forward`).
    Respond(M),
    /// Send a new request from this policy to the primary server; only this policy
    /// (and its successors) will see its response.
    Generate(M),
    /// As `Generate`, to server `server` (an index into the driver's servers).
    GenerateTo { server: usize, msg: M },
    /// Pass on a request this policy held earlier (returned no action for).
    Resume { xid: u32, request: M },
    /// Answer a request this policy held earlier; the response goes back through the
    /// predecessors that handled it.
    Complete { xid: u32, response: M },
}

/// A policy: handlers invoked on messages. Doing nothing with a message drops it
/// (for a request, it stays pending until the policy resumes or completes it, or
/// until the timeout).
pub trait Policy<M>: Send {
    fn name(&self) -> &str;
    /// A request travelling towards the server; `xid` is its server XID.
    fn on_request(&mut self, xid: u32, request: M, out: &mut Vec<Action<M>>);
    /// A response travelling towards the client, with the request it answers.
    fn on_response(&mut self, xid: u32, request: &M, response: M, out: &mut Vec<Action<M>>);
    /// Time passes: a policy with its own deadlines acts here (only `Generate*`,
    /// `Resume` and `Complete` make sense without a message in hand).
    fn on_tick(&mut self, _now: Instant, _out: &mut Vec<Action<M>>) {}
}

/// Picks which policy's handler runs next (§4.3.1: "the scheduler is replaceable").
pub trait Scheduler: Send {
    fn name(&self) -> &'static str;
    /// Given each policy's buffer occupancy, the index of the one to run next, or
    /// `None` when every buffer is empty. Must return a non-empty buffer.
    fn pick(&mut self, occupancy: &[usize]) -> Option<usize>;
}

/// The seed's scheduler: policies in turn from RECV to SEND, each that has work
/// runs one handler, then the next.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Scheduler for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }
    fn pick(&mut self, occupancy: &[usize]) -> Option<usize> {
        let n = occupancy.len();
        let i = (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&i| occupancy[i] > 0)?;
        self.next = (i + 1) % n;
        Some(i)
    }
}

/// The policy with the fullest buffer runs next (ties to the one nearest the
/// client): drains the policy closest to overflowing first, so bursts are dropped
/// later than under round-robin when one policy is slower than the rest.
#[derive(Debug, Default)]
pub struct LongestQueue;

impl Scheduler for LongestQueue {
    fn name(&self) -> &'static str {
        "longest-queue"
    }
    fn pick(&mut self, occupancy: &[usize]) -> Option<usize> {
        let (i, &len) = occupancy
            .iter()
            .enumerate()
            .max_by(|(i, a), (j, b)| a.cmp(b).then(j.cmp(i)))?;
        (len > 0).then_some(i)
    }
}

/// The schedulers by name, for configuration.
pub const SCHEDULERS: [&str; 2] = ["round-robin", "longest-queue"];

/// A scheduler by its configured name.
pub fn scheduler(name: &str) -> Option<Box<dyn Scheduler>> {
    match name {
        "round-robin" => Some(Box::new(RoundRobin::default())),
        "longest-queue" => Some(Box::new(LongestQueue)),
        _ => None,
    }
}

/// What leaves the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output<M> {
    ToServer { xid: u32, server: usize, request: M },
    ToClient { client: ClientKey, response: M },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("a chain holds at most {MAX_POLICIES} policies, {0} given")]
    TooManyPolicies(usize),
    #[error("policy buffers need at least one slot")]
    ZeroBuffer,
}

/// Counters a statistics policy or `filewall stats` can read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainStats {
    /// Messages dropped because a policy's buffer was full, per policy.
    pub overflow_drops: Vec<u64>,
    /// Responses with no pending request (late, duplicate or unsolicited).
    pub unmatched_responses: u64,
    /// Requests dropped because the pending map was full.
    pub pending_full: u64,
    /// Client retransmissions of a request still pending.
    pub retransmissions: u64,
    /// Requests purged by the timeout.
    pub timed_out: u64,
    /// `Resume`/`Complete` for requests no longer pending, and `Forward`/`Respond`
    /// from a tick (which has no message to pass on).
    pub stray_actions: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Response,
}

#[derive(Debug)]
struct Item<M> {
    xid: u32,
    dir: Direction,
    msg: M,
}

#[derive(Debug)]
struct Entry<M> {
    request: M,
    answered: bool,
    /// The server the request goes to.
    server: usize,
}

/// How a chain is dimensioned.
#[derive(Debug, Clone, Copy)]
pub struct ChainLimits {
    /// Slots in each policy's input buffer.
    pub buffer_slots: usize,
    /// The first server XID (should differ between runs).
    pub first_xid: u32,
    /// How long a request may stay pending.
    pub timeout: Duration,
    /// Most requests pending at once.
    pub max_pending: usize,
}

/// Policies, their buffers, the scheduler and the pending-request map.
pub struct Chain<M> {
    policies: Vec<Box<dyn Policy<M>>>,
    buffers: Vec<VecDeque<Item<M>>>,
    buffer_slots: usize,
    scheduler: Box<dyn Scheduler>,
    occupancy: Vec<usize>,
    pending: PendingMap<Entry<M>>,
    outputs: Vec<Output<M>>,
    stats: ChainStats,
    /// The time of the current `run`, for generated requests' deadlines.
    now: Option<Instant>,
}

impl<M: Clone> Chain<M> {
    /// A chain with the round-robin scheduler.
    pub fn new(
        policies: Vec<Box<dyn Policy<M>>>,
        buffer_slots: usize,
        first_xid: u32,
        timeout: Duration,
        max_pending: usize,
    ) -> Result<Self, ChainError> {
        let limits = ChainLimits {
            buffer_slots,
            first_xid,
            timeout,
            max_pending,
        };
        Self::with_scheduler(policies, Box::new(RoundRobin::default()), limits)
    }

    pub fn with_scheduler(
        policies: Vec<Box<dyn Policy<M>>>,
        scheduler: Box<dyn Scheduler>,
        limits: ChainLimits,
    ) -> Result<Self, ChainError> {
        if policies.len() > MAX_POLICIES {
            return Err(ChainError::TooManyPolicies(policies.len()));
        }
        if limits.buffer_slots == 0 {
            return Err(ChainError::ZeroBuffer);
        }
        let n = policies.len();
        Ok(Self {
            policies,
            buffers: (0..n)
                .map(|_| VecDeque::with_capacity(limits.buffer_slots.min(1024)))
                .collect(),
            buffer_slots: limits.buffer_slots,
            scheduler,
            occupancy: vec![0; n],
            pending: PendingMap::new(limits.first_xid, limits.timeout, limits.max_pending),
            outputs: Vec::new(),
            stats: ChainStats {
                overflow_drops: vec![0; n],
                ..ChainStats::default()
            },
            now: None,
        })
    }

    pub fn stats(&self) -> &ChainStats {
        &self.stats
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The name of the scheduler.
    pub fn scheduler_name(&self) -> &'static str {
        self.scheduler.name()
    }

    /// The request still pending under server XID `xid` (to decode its reply).
    pub fn request(&self, xid: u32) -> Option<&M> {
        self.pending.get(xid).map(|p| &p.payload.request)
    }

    /// The server the request pending under `xid` was sent to.
    pub fn server_of(&self, xid: u32) -> Option<usize> {
        self.pending.get(xid).map(|p| p.payload.server)
    }

    /// The forwarder: places `item` in policy `at`'s buffer, dropping it if full.
    /// `at == len` means SEND (towards the server for requests).
    /// Returns false if the message was dropped.
    fn enqueue(&mut self, at: usize, item: Item<M>) -> bool {
        if at == self.policies.len() {
            let server = self.server_of(item.xid).unwrap_or(PRIMARY);
            self.outputs.push(Output::ToServer {
                xid: item.xid,
                server,
                request: item.msg,
            });
            return true;
        }
        if self.buffers[at].len() >= self.buffer_slots {
            self.stats.overflow_drops[at] += 1;
            return false;
        }
        self.buffers[at].push_back(item);
        self.occupancy[at] += 1;
        true
    }

    /// Sends a response on from below policy `below` (exclusive): to the nearest
    /// predecessor that handled the request, or out to the client (or nowhere, for a
    /// generated request) when none is left.
    fn respond_down(&mut self, below: usize, xid: u32, msg: M) {
        let Some(p) = self.pending.get(xid) else {
            self.stats.unmatched_responses += 1;
            return;
        };
        match (0..below).rev().find(|&i| p.handled.contains(i)) {
            Some(i) => {
                self.enqueue(
                    i,
                    Item {
                        xid,
                        dir: Direction::Response,
                        msg,
                    },
                );
            }
            None => {
                if let Some(done) = self.pending.complete(xid)
                    && let Some(client) = done.client
                {
                    self.outputs.push(Output::ToClient {
                        client,
                        response: msg,
                    });
                }
            }
        }
    }

    /// RECV for a client's request.
    pub fn recv_request(&mut self, client: ClientKey, request: M, now: Instant) {
        let entry = Entry {
            request: request.clone(),
            answered: false,
            server: PRIMARY,
        };
        match self.pending.insert(Some(client), None, entry, now) {
            Ok(xid) => {
                if !self.enqueue(
                    0,
                    Item {
                        xid,
                        dir: Direction::Request,
                        msg: request,
                    },
                ) {
                    // Dropped at the door: forget it so the client's retransmission is new.
                    self.pending.complete(xid);
                }
            }
            Err(PendingError::Retransmission { .. }) => self.stats.retransmissions += 1,
            Err(PendingError::Full { .. }) => self.stats.pending_full += 1,
        }
    }

    /// RECV for a server's response to the request sent as `xid`.
    pub fn recv_response(&mut self, xid: u32, response: M) {
        match self.pending.get_mut(xid) {
            Some(p) if !p.payload.answered => p.payload.answered = true,
            _ => {
                self.stats.unmatched_responses += 1;
                return;
            }
        }
        self.respond_down(self.policies.len(), xid, response);
    }

    /// Purges requests past their deadline; their responses will be discarded.
    pub fn expire(&mut self, now: Instant) {
        self.stats.timed_out += self.pending.expire(now).len() as u64;
    }

    /// Lets every policy act on the passage of time, then runs the chain.
    pub fn tick(&mut self, now: Instant, max_steps: usize) -> Vec<Output<M>> {
        self.now = Some(now);
        let mut out = Vec::new();
        for i in 0..self.policies.len() {
            self.policies[i].on_tick(now, &mut out);
            for action in out.drain(..) {
                match action {
                    Action::Forward(_) | Action::Respond(_) => self.stats.stray_actions += 1,
                    other => {
                        self.apply_detached(i, other);
                    }
                }
            }
        }
        self.run(now, max_steps)
    }

    /// The scheduler's loop: handlers run to completion, in the order the scheduler
    /// picks, until every buffer is empty or `max_steps` handlers have run. Returns
    /// what leaves.
    pub fn run(&mut self, now: Instant, max_steps: usize) -> Vec<Output<M>> {
        self.now = Some(now);
        let mut scratch = Vec::new();
        for _ in 0..max_steps {
            let Some(i) = self.scheduler.pick(&self.occupancy) else {
                break;
            };
            let Some(item) = self.buffers[i].pop_front() else {
                debug_assert!(false, "the scheduler picked an empty buffer");
                break;
            };
            self.occupancy[i] -= 1;
            self.handle(i, item, &mut scratch);
        }
        std::mem::take(&mut self.outputs)
    }

    fn handle(&mut self, i: usize, item: Item<M>, out: &mut Vec<Action<M>>) {
        out.clear();
        let xid = item.xid;
        match item.dir {
            Direction::Request => {
                if !self.pending.mark(xid, i) {
                    return; // purged meanwhile
                }
                self.policies[i].on_request(xid, item.msg, out);
            }
            Direction::Response => {
                let Some(p) = self.pending.get(xid) else {
                    self.stats.unmatched_responses += 1;
                    return;
                };
                self.policies[i].on_response(xid, &p.payload.request, item.msg, out);
                let passed_on = out
                    .iter()
                    .any(|a| matches!(a, Action::Forward(_) | Action::Respond(_)));
                if !passed_on {
                    self.pending.complete(xid); // consumed here
                }
            }
        }
        for action in out.drain(..) {
            match (action, item.dir) {
                (Action::Forward(m), Direction::Request) => {
                    self.enqueue(
                        i + 1,
                        Item {
                            xid,
                            dir: Direction::Request,
                            msg: m,
                        },
                    );
                }
                (Action::Forward(m) | Action::Respond(m), Direction::Response) => {
                    self.respond_down(i, xid, m);
                }
                (Action::Respond(m), Direction::Request) => {
                    self.complete(i, xid, m);
                }
                (other, _) => self.apply_detached(i, other),
            }
        }
    }

    /// Actions that do not act on the message in hand.
    fn apply_detached(&mut self, i: usize, action: Action<M>) {
        match action {
            Action::Generate(m) => self.generate(i, PRIMARY, m),
            Action::GenerateTo { server, msg } => self.generate(i, server, msg),
            Action::Resume { xid, request } => {
                if self.pending.get(xid).is_some() {
                    self.enqueue(
                        i + 1,
                        Item {
                            xid,
                            dir: Direction::Request,
                            msg: request,
                        },
                    );
                } else {
                    self.stats.stray_actions += 1;
                }
            }
            Action::Complete { xid, response } => self.complete(i, xid, response),
            Action::Forward(_) | Action::Respond(_) => self.stats.stray_actions += 1,
        }
    }

    /// Policy `i` answers request `xid`.
    fn complete(&mut self, i: usize, xid: u32, response: M) {
        match self.pending.get_mut(xid) {
            Some(p) => p.payload.answered = true,
            None => {
                self.stats.stray_actions += 1;
                return;
            }
        }
        self.respond_down(i, xid, response);
    }

    fn generate(&mut self, i: usize, server: usize, request: M) {
        let entry = Entry {
            request: request.clone(),
            answered: false,
            server,
        };
        // Generated requests time out like any other, from the time `run` was given.
        let Some(now) = self.now else { return };
        match self.pending.insert(None, Some(i), entry, now) {
            Ok(xid) => {
                self.enqueue(
                    i + 1,
                    Item {
                        xid,
                        dir: Direction::Request,
                        msg: request,
                    },
                );
            }
            Err(_) => self.stats.pending_full += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    type Log = Arc<Mutex<Vec<String>>>;

    /// Forwards everything, logging; `respond_to`/`generate_on` change its behaviour
    /// for requests whose text matches.
    struct Probe {
        name: String,
        log: Log,
        respond_to: Option<&'static str>,
        generate_on: Option<&'static str>,
    }

    impl Policy<String> for Probe {
        fn name(&self) -> &str {
            &self.name
        }
        fn on_request(&mut self, _xid: u32, request: String, out: &mut Vec<Action<String>>) {
            self.log
                .lock()
                .unwrap()
                .push(format!("{} req {request}", self.name));
            if self.respond_to == Some(request.as_str()) {
                out.push(Action::Respond(format!("{}-answer", self.name)));
                return;
            }
            if self.generate_on == Some(request.as_str()) {
                out.push(Action::Generate(format!("{}-extra", self.name)));
            }
            out.push(Action::Forward(request));
        }
        fn on_response(
            &mut self,
            _xid: u32,
            request: &String,
            response: String,
            out: &mut Vec<Action<String>>,
        ) {
            self.log
                .lock()
                .unwrap()
                .push(format!("{} resp {response} to {request}", self.name));
            if !request.ends_with("-extra") || !request.starts_with(&self.name) {
                out.push(Action::Forward(response));
            }
        }
    }

    fn chain(n: usize, slots: usize, tweak: impl Fn(usize, &mut Probe)) -> (Chain<String>, Log) {
        let log: Log = Arc::default();
        let policies = (0..n)
            .map(|i| {
                let mut p = Probe {
                    name: format!("p{i}"),
                    log: log.clone(),
                    respond_to: None,
                    generate_on: None,
                };
                tweak(i, &mut p);
                Box::new(p) as Box<dyn Policy<String>>
            })
            .collect();
        (
            Chain::new(policies, slots, 1000, Duration::from_secs(1), 100).unwrap(),
            log,
        )
    }

    const C: ClientKey = ClientKey { flow: 5, xid: 42 };

    fn server_xids(out: &[Output<String>]) -> Vec<u32> {
        out.iter()
            .filter_map(|o| match o {
                Output::ToServer { xid, .. } => Some(*xid),
                Output::ToClient { .. } => None,
            })
            .collect()
    }

    #[test]
    fn request_and_response_traverse_mirrored_orders_once() {
        let now = Instant::now();
        let (mut c, log) = chain(3, 4, |_, _| {});
        c.recv_request(C, "getattr".into(), now);
        let out = c.run(now, 100);
        assert_eq!(
            out,
            vec![Output::ToServer {
                xid: 1000,
                server: PRIMARY,
                request: "getattr".into()
            }]
        );
        c.recv_response(1000, "ok".into());
        let out = c.run(now, 100);
        assert_eq!(
            out,
            vec![Output::ToClient {
                client: C,
                response: "ok".into()
            }]
        );
        assert_eq!(
            *log.lock().unwrap(),
            [
                "p0 req getattr",
                "p1 req getattr",
                "p2 req getattr",
                "p2 resp ok to getattr",
                "p1 resp ok to getattr",
                "p0 resp ok to getattr"
            ]
        );
        assert_eq!(c.pending(), 0);
        c.recv_response(1000, "dup".into());
        assert!(c.run(now, 100).is_empty());
        assert_eq!(c.stats().unmatched_responses, 1);
    }

    #[test]
    fn a_generated_requests_response_is_seen_only_by_its_generator_and_successors() {
        let now = Instant::now();
        let (mut c, log) = chain(3, 4, |i, p| {
            if i == 1 {
                p.generate_on = Some("write");
            }
        });
        c.recv_request(C, "write".into(), now);
        let out = c.run(now, 100);
        let xids = server_xids(&out);
        assert_eq!(xids.len(), 2);
        log.lock().unwrap().clear();
        for xid in xids {
            c.recv_response(xid, format!("r{xid}"));
        }
        let out = c.run(now, 100);
        assert_eq!(
            out,
            vec![Output::ToClient {
                client: C,
                response: "r1000".into()
            }]
        );
        let log = log.lock().unwrap();
        assert!(
            !log.iter()
                .any(|l| l.starts_with("p0") && l.contains("p1-extra")),
            "{log:?}"
        );
        assert!(
            log.iter().any(|l| l == "p2 resp r1001 to p1-extra"),
            "{log:?}"
        );
        assert!(
            log.iter().any(|l| l == "p1 resp r1001 to p1-extra"),
            "{log:?}"
        );
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn a_generated_response_skips_successors() {
        let now = Instant::now();
        let (mut c, log) = chain(3, 4, |i, p| {
            if i == 1 {
                p.respond_to = Some("remove");
            }
        });
        c.recv_request(C, "remove".into(), now);
        let out = c.run(now, 100);
        assert_eq!(
            out,
            vec![Output::ToClient {
                client: C,
                response: "p1-answer".into()
            }]
        );
        assert_eq!(
            *log.lock().unwrap(),
            [
                "p0 req remove",
                "p1 req remove",
                "p0 resp p1-answer to remove"
            ]
        );
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn a_full_buffer_drops_like_the_network() {
        let now = Instant::now();
        let (mut c, _) = chain(2, 1, |_, _| {});
        for xid in 0..3 {
            c.recv_request(ClientKey { flow: 1, xid }, format!("r{xid}"), now);
        }
        assert_eq!(c.stats().overflow_drops, vec![2, 0]);
        assert_eq!(c.pending(), 1, "dropped requests are forgotten");
        assert_eq!(server_xids(&c.run(now, 100)).len(), 1);
        // The client's retransmission of a dropped request is accepted afresh.
        c.recv_request(ClientKey { flow: 1, xid: 2 }, "r2".into(), now);
        assert_eq!(c.run(now, 100).len(), 1);
        // A retransmission of a still-pending one is not forwarded twice.
        c.recv_request(ClientKey { flow: 1, xid: 2 }, "r2".into(), now);
        assert!(c.run(now, 100).is_empty());
        assert_eq!(c.stats().retransmissions, 1);
    }

    #[test]
    fn timed_out_requests_discard_their_responses() {
        let now = Instant::now();
        let (mut c, _) = chain(1, 4, |_, _| {});
        c.recv_request(C, "read".into(), now);
        let xid = server_xids(&c.run(now, 100))[0];
        c.expire(now + Duration::from_secs(2));
        assert_eq!(c.stats().timed_out, 1);
        c.recv_response(xid, "late".into());
        assert!(c.run(now, 100).is_empty());
        assert_eq!(c.stats().unmatched_responses, 1);
    }

    /// Holds requests; on a tick resumes "resume" and completes the others;
    /// fans "fan" out to servers 1 and 2 and completes the original from the
    /// first copy's response.
    struct Holder {
        held: Vec<(u32, String)>,
        fanned: Option<u32>,
    }

    impl Policy<String> for Holder {
        fn name(&self) -> &str {
            "holder"
        }
        fn on_request(&mut self, xid: u32, request: String, out: &mut Vec<Action<String>>) {
            if request == "fan" {
                self.fanned = Some(xid);
                for server in [1, 2] {
                    out.push(Action::GenerateTo {
                        server,
                        msg: format!("copy{server}"),
                    });
                }
            } else {
                self.held.push((xid, request));
            }
        }
        fn on_response(
            &mut self,
            _xid: u32,
            request: &String,
            response: String,
            out: &mut Vec<Action<String>>,
        ) {
            if request.starts_with("copy") {
                if let Some(xid) = self.fanned.take() {
                    out.push(Action::Complete { xid, response });
                }
                return; // a copy's response is consumed here
            }
            out.push(Action::Forward(response));
        }
        fn on_tick(&mut self, _now: Instant, out: &mut Vec<Action<String>>) {
            for (xid, r) in self.held.drain(..) {
                if r == "resume" {
                    out.push(Action::Resume { xid, request: r });
                } else {
                    out.push(Action::Complete {
                        xid,
                        response: format!("{r}-done"),
                    });
                }
            }
            out.push(Action::Forward("stray".into()));
        }
    }

    fn holder_chain() -> Chain<String> {
        let policies: Vec<Box<dyn Policy<String>>> = vec![Box::new(Holder {
            held: Vec::new(),
            fanned: None,
        })];
        Chain::new(policies, 8, 1, Duration::from_secs(1), 100).unwrap()
    }

    #[test]
    fn held_requests_are_resumed_or_completed_on_a_tick() {
        let now = Instant::now();
        let mut c = holder_chain();
        c.recv_request(ClientKey { flow: 1, xid: 1 }, "resume".into(), now);
        c.recv_request(ClientKey { flow: 1, xid: 2 }, "answer".into(), now);
        assert!(c.run(now, 100).is_empty(), "held");
        assert_eq!(c.pending(), 2);
        let out = c.tick(now, 100);
        assert_eq!(
            out,
            vec![
                Output::ToServer {
                    xid: 1,
                    server: PRIMARY,
                    request: "resume".into()
                },
                Output::ToClient {
                    client: ClientKey { flow: 1, xid: 2 },
                    response: "answer-done".into()
                },
            ]
        );
        assert_eq!(
            c.stats().stray_actions,
            1,
            "a Forward from a tick has nothing to forward"
        );
        c.recv_response(1, "r".into());
        assert_eq!(c.run(now, 100).len(), 1);
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn generated_copies_go_to_their_servers_and_complete_the_original() {
        let now = Instant::now();
        let mut c = holder_chain();
        c.recv_request(C, "fan".into(), now);
        let out = c.run(now, 100);
        let sent: Vec<(u32, usize)> = out
            .iter()
            .map(|o| match o {
                Output::ToServer { xid, server, .. } => (*xid, *server),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sent.iter().map(|s| s.1).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(c.server_of(sent[0].0), Some(1));
        c.recv_response(sent[1].0, "from2".into());
        assert_eq!(
            c.run(now, 100),
            vec![Output::ToClient {
                client: C,
                response: "from2".into()
            }]
        );
        c.recv_response(sent[0].0, "from1".into());
        assert!(c.run(now, 100).is_empty());
        assert_eq!(c.pending(), 0, "both copies and the original are done");
    }

    #[test]
    fn schedulers_pick_non_empty_buffers() {
        let mut rr = RoundRobin::default();
        assert_eq!(rr.pick(&[0, 2, 1]), Some(1));
        assert_eq!(rr.pick(&[0, 1, 1]), Some(2));
        assert_eq!(rr.pick(&[3, 1, 1]), Some(0));
        assert_eq!(rr.pick(&[0, 0, 0]), None);
        let mut lq = LongestQueue;
        assert_eq!(lq.pick(&[1, 3, 3]), Some(1));
        assert_eq!(lq.pick(&[0, 0]), None);
        for name in SCHEDULERS {
            assert_eq!(scheduler(name).unwrap().name(), name);
        }
        // Either scheduler gives the same end result for a chain.
        for name in SCHEDULERS {
            let now = Instant::now();
            let log: Log = Arc::default();
            let policies: Vec<Box<dyn Policy<String>>> = (0..3)
                .map(|i| {
                    Box::new(Probe {
                        name: format!("p{i}"),
                        log: log.clone(),
                        respond_to: None,
                        generate_on: None,
                    }) as Box<dyn Policy<String>>
                })
                .collect();
            let limits = ChainLimits {
                buffer_slots: 4,
                first_xid: 10,
                timeout: Duration::from_secs(1),
                max_pending: 10,
            };
            let mut c = Chain::with_scheduler(policies, scheduler(name).unwrap(), limits).unwrap();
            c.recv_request(C, "a".into(), now);
            c.recv_request(ClientKey { flow: 2, xid: 1 }, "b".into(), now);
            assert_eq!(server_xids(&c.run(now, 100)), vec![10, 11], "{name}");
        }
    }

    #[test]
    fn configuration_errors() {
        let policies: Vec<Box<dyn Policy<String>>> = Vec::new();
        assert_eq!(
            Chain::new(policies, 0, 0, Duration::ZERO, 1).err(),
            Some(ChainError::ZeroBuffer)
        );
    }
}
