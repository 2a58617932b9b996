//! The policy chain (§4.3.1–4.3.2): policies in configured order, each with a
//! fixed-size input buffer (overflow drops the message, which the protocol sees as
//! network loss); a forwarder that moves requests RECV→SEND and responses back
//! SEND→RECV; a round-robin scheduler that runs each handler to completion; and the
//! pending-request map whose per-request bitmap gives exactly-once handling: a
//! response visits only the policies that handled its request, so a policy that
//! generates a request alone sees its response, and a policy that answers a request
//! itself keeps its successors from seeing either. Sans-IO: the driver feeds decoded
//! messages in and sends the outputs.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::pending::{ClientKey, MAX_POLICIES, PendingError, PendingMap};

/// What a handler asks the forwarder to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<M> {
    /// Pass the message on in its direction.
    Forward(M),
    /// Answer the request here; the response goes back through the predecessors that
    /// handled the request (in a response handler this is the same as `Forward`).
    Respond(M),
    /// Send a new request from this policy; only this policy will see its response.
    Generate(M),
}

/// A policy: handlers invoked on messages. Doing nothing with a message drops it.
pub trait Policy<M>: Send {
    fn name(&self) -> &str;
    /// A request travelling towards the server; `xid` is its server XID.
    fn on_request(&mut self, xid: u32, request: M, out: &mut Vec<Action<M>>);
    /// A response travelling towards the client, with the request it answers.
    fn on_response(&mut self, xid: u32, request: &M, response: M, out: &mut Vec<Action<M>>);
}

/// What leaves the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output<M> {
    ToServer { xid: u32, request: M },
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
}

/// Policies, their buffers and the pending-request map.
pub struct Chain<M> {
    policies: Vec<Box<dyn Policy<M>>>,
    buffers: Vec<VecDeque<Item<M>>>,
    buffer_slots: usize,
    pending: PendingMap<Entry<M>>,
    outputs: Vec<Output<M>>,
    stats: ChainStats,
    /// The time of the current `run`, for generated requests' deadlines.
    now: Option<Instant>,
}

impl<M: Clone> Chain<M> {
    pub fn new(
        policies: Vec<Box<dyn Policy<M>>>,
        buffer_slots: usize,
        first_xid: u32,
        timeout: Duration,
        max_pending: usize,
    ) -> Result<Self, ChainError> {
        if policies.len() > MAX_POLICIES {
            return Err(ChainError::TooManyPolicies(policies.len()));
        }
        if buffer_slots == 0 {
            return Err(ChainError::ZeroBuffer);
        }
        let n = policies.len();
        Ok(Self {
            policies,
            buffers: (0..n)
                .map(|_| VecDeque::with_capacity(buffer_slots))
                .collect(),
            buffer_slots,
            pending: PendingMap::new(first_xid, timeout, max_pending),
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

    /// The request still pending under server XID `xid` (to decode its reply).
    pub fn request(&self, xid: u32) -> Option<&M> {
        self.pending.get(xid).map(|p| &p.payload.request)
    }

    /// The forwarder: places `item` in policy `at`'s buffer, dropping it if full.
    /// `at == len` means SEND (towards the server for requests).
    /// Returns false if the message was dropped.
    fn enqueue(&mut self, at: usize, item: Item<M>) -> bool {
        if at == self.policies.len() {
            self.outputs.push(Output::ToServer {
                xid: item.xid,
                request: item.msg,
            });
            return true;
        }
        if self.buffers[at].len() >= self.buffer_slots {
            self.stats.overflow_drops[at] += 1;
            return false;
        }
        self.buffers[at].push_back(item);
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
        match self.pending.get(xid) {
            Some(p) if !p.payload.answered => {}
            _ => {
                self.stats.unmatched_responses += 1;
                return;
            }
        }
        if let Some(p) = self.pending.get_mut(xid) {
            p.payload.answered = true;
        }
        self.respond_down(self.policies.len(), xid, response);
    }

    /// Purges requests past their deadline; their responses will be discarded.
    pub fn expire(&mut self, now: Instant) {
        self.stats.timed_out += self.pending.expire(now).len() as u64;
    }

    /// The scheduler: round-robin RECV→SEND, each handler run to completion, until
    /// every buffer is empty or `max_steps` handlers have run. Returns what leaves.
    pub fn run(&mut self, now: Instant, max_steps: usize) -> Vec<Output<M>> {
        self.now = Some(now);
        let mut steps = 0;
        let mut scratch = Vec::new();
        while steps < max_steps && self.buffers.iter().any(|b| !b.is_empty()) {
            for i in 0..self.policies.len() {
                if steps >= max_steps {
                    break;
                }
                if let Some(item) = self.buffers[i].pop_front() {
                    steps += 1;
                    self.handle(i, item, &mut scratch);
                }
            }
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
                let request = p.payload.request.clone();
                self.policies[i].on_response(xid, &request, item.msg, out);
                if out.is_empty() {
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
                    if let Some(p) = self.pending.get_mut(xid) {
                        p.payload.answered = true;
                    }
                    self.respond_down(i, xid, m);
                }
                (Action::Generate(m), _) => self.generate(i, m),
            }
        }
    }

    fn generate(&mut self, i: usize, request: M) {
        let entry = Entry {
            request: request.clone(),
            answered: false,
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

    #[test]
    fn configuration_errors() {
        let policies: Vec<Box<dyn Policy<String>>> = Vec::new();
        assert_eq!(
            Chain::new(policies, 0, 0, Duration::ZERO, 1).err(),
            Some(ChainError::ZeroBuffer)
        );
    }
}
