//! Rate limits on real time (§5.3–§5.6, §6.2.6), sans-IO: one
//! [`SeSender`] per local source process and rate limit, run on the agent's
//! clock (nanoseconds since it started) with bytes as tokens, and the SE-TRE
//! exchange with the other processes of the source service, wherever they run.
//! Exchanges with processes on this host are answered at once; the others
//! leave as [`RateExchange`] messages for the I/O layer to carry to their
//! agents.
//!
//! What the dissertation leaves to the implementation, decided here and
//! marked **[A]**:
//! - **membership views.** The limit is shared among the processes of the
//!   source service on the hosts this agent can reach (itself and its linked
//!   peers): when that set changes — an agent dies, or comes back — every
//!   member resets its processes' fill rates to an equal share of what is
//!   left, `R_a / N_alive`. Exchange messages carry a view number, and a
//!   message from another view is not applied, so no response from before a
//!   reset can add rate after it. This is how the others reclaim a dead
//!   agent's share, and how a restarted one gets one back.
//! - **a gap between rounds.** On a real network a round trip takes tens of
//!   microseconds, and a saturated sender would ask every round trip; a new
//!   round starts at most every [`ROUND_GAP_NS`].
//! - **keep-used-rate** (the RateSim default, flagged [A] in BENCHMARKS.md):
//!   a giver keeps the rate it is using, averaged over `τ = S_b / R_a` — the
//!   time to drain a bucket at the limit.
//! - a request unanswered after [`REQUEST_TIMEOUT_NS`] is lost (its rate, if it
//!   ever arrives, is ignored: leaking is the safe direction).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sidecore_sikker_nmu::{ProcessId, ServiceId};
use sidecore_sikker_policy::Nos;
use sidecore_sikker_rate::{Algorithm, Request, Response, SeParams, SeSender};
use sidecore_wire::RateExchange;

/// The shortest time between two rounds of requests of one sender.
pub const ROUND_GAP_NS: f64 = 2_000_000.0;
/// A request unanswered this long is declared lost.
pub const REQUEST_TIMEOUT_NS: f64 = 200_000_000.0;

/// One rate limit as the agent enforces it.
#[derive(Clone, Debug)]
struct Limit {
    from: ServiceId,
    /// `R_a`, bytes per ns.
    rate: f64,
    /// `S_b`, bytes.
    bucket: f64,
    params: SeParams,
    /// The source service's processes and where they are placed.
    procs: Vec<(ProcessId, String)>,
}

/// Rate control of one agent.
pub struct RateControl {
    host: String,
    limits: BTreeMap<u32, Limit>,
    senders: BTreeMap<(u32, ProcessId), SeSender>,
    view: BTreeSet<String>,
    view_id: u64,
    last_round: HashMap<(u32, ProcessId), f64>,
    asked_at: HashMap<(u32, ProcessId, u64), f64>,
    rng: ChaCha8Rng,
    out: Vec<(String, sidecore_wire::Message)>,
}

/// What [`RateControl::admit`] decided about a message.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Admit {
    /// Send it now (its tokens are taken).
    Now,
    /// Not enough tokens: try again at this time (ns).
    Later(f64),
}

/// Why a rate limit cannot be enforced as the policy says.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RateError {
    #[error(
        "rate limit #{slot} ({alg}) cannot be run by the agent: it runs the sender-enforced algorithms (SE-FA, SE-TE, SE-RE, SE-TRE); RE needs relays"
    )]
    Unsupported { slot: u32, alg: &'static str },
    #[error(
        "a {size}-byte message can never pass rate limit #{slot}: its bucket holds {bucket} bytes"
    )]
    TooLarge { slot: u32, size: usize, bucket: u64 },
}

fn view_id(v: &BTreeSet<String>) -> u64 {
    // FNV-1a over the sorted names: the same set gives the same number on
    // every agent (std's hasher is randomly keyed per process).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for name in v {
        for b in name.bytes().chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl RateControl {
    /// The rate control of `host`, with `host` alone in its view until
    /// [`RateControl::set_view`] says otherwise.
    pub fn new(nos: &Nos, host: &str, now: f64) -> Result<RateControl, RateError> {
        let mut limits = BTreeMap::new();
        for (i, r) in nos.policy().rate_limits.iter().enumerate() {
            let slot = i as u32;
            let Some(variant) = r.algorithm.se_variant() else {
                if r.algorithm == Algorithm::Ne {
                    continue;
                }
                return Err(RateError::Unsupported {
                    slot,
                    alg: r.algorithm.name(),
                });
            };
            let _ = variant;
            let procs: Vec<(ProcessId, String)> = nos
                .policy()
                .services
                .get(&r.from)
                .map(|s| {
                    s.processes
                        .keys()
                        .filter_map(|&p| nos.locate(r.from, p).map(|(h, ..)| (p, h)))
                        .collect()
                })
                .unwrap_or_default();
            let rate = r.gbps / 8.0; // Gbps = bits per ns
            let bucket = r.bucket_bytes as f64;
            let mut params = SeParams::tuned(bucket);
            params.keep_used = Some(bucket / rate);
            limits.insert(
                slot,
                Limit {
                    from: r.from,
                    rate,
                    bucket,
                    params,
                    procs,
                },
            );
        }
        let mut rc = RateControl {
            host: host.to_string(),
            limits,
            senders: BTreeMap::new(),
            view: BTreeSet::new(),
            view_id: 0,
            last_round: HashMap::new(),
            asked_at: HashMap::new(),
            rng: ChaCha8Rng::seed_from_u64(view_id(&BTreeSet::from([host.to_string()]))),
            out: Vec::new(),
        };
        for (&slot, l) in &rc.limits {
            let alg = nos.policy().rate_limits[slot as usize].algorithm;
            let variant = alg.se_variant().expect("filtered above");
            for (p, h) in &l.procs {
                if h != host {
                    continue;
                }
                let peers = l.procs.iter().map(|x| x.0).filter(|q| q != p).collect();
                rc.senders.insert(
                    (slot, *p),
                    SeSender::new(variant, l.params, 0.0, peers, now),
                );
            }
        }
        rc.set_view(BTreeSet::from([host.to_string()]), now);
        Ok(rc)
    }

    /// The hosts this agent reaches (itself included), and the view's number.
    pub fn view(&self) -> (&BTreeSet<String>, u64) {
        (&self.view, self.view_id)
    }

    /// A new set of reachable hosts: every local sender's fill rate becomes an
    /// equal share of its limit among the source processes on those hosts.
    pub fn set_view(&mut self, mut alive: BTreeSet<String>, now: f64) {
        alive.insert(self.host.clone());
        if alive == self.view && self.view_id != 0 {
            return;
        }
        self.view_id = view_id(&alive);
        self.view = alive;
        self.asked_at.clear();
        for (&(slot, _), s) in self.senders.iter_mut() {
            let l = &self.limits[&slot];
            let n = l
                .procs
                .iter()
                .filter(|(_, h)| self.view.contains(h))
                .count();
            s.reset_rate(now, l.rate / n.max(1) as f64);
        }
    }

    /// Whether messages of `proc` under `slot` are rate-controlled here.
    pub fn controls(&self, slot: u32, proc: ProcessId) -> bool {
        self.senders.contains_key(&(slot, proc))
    }

    /// Takes `size` bytes of tokens for a message of `proc` under `slot`, or
    /// says when to try again. Starts a round of requests when the bucket runs low.
    pub fn admit(
        &mut self,
        slot: u32,
        proc: ProcessId,
        size: usize,
        now: f64,
    ) -> Result<Admit, RateError> {
        let Some(l) = self.limits.get(&slot) else {
            return Ok(Admit::Now);
        };
        if size as f64 > l.bucket {
            return Err(RateError::TooLarge {
                slot,
                size,
                bucket: l.bucket as u64,
            });
        }
        let Some(s) = self.senders.get_mut(&(slot, proc)) else {
            return Ok(Admit::Now);
        };
        let r = if s.try_send(now, size as f64) {
            Admit::Now
        } else {
            // No rate (every share given away): look again after a round.
            Admit::Later(
                s.ready_at(now, size as f64)
                    .unwrap_or(now + ROUND_GAP_NS)
                    .min(now + ROUND_GAP_NS)
                    .max(now + 1_000.0),
            )
        };
        self.ask(slot, proc, now);
        Ok(r)
    }

    /// Starts a round for `(slot, proc)` if its bucket is low, the gap has
    /// passed and no round is out.
    fn ask(&mut self, slot: u32, proc: ProcessId, now: f64) {
        if self
            .last_round
            .get(&(slot, proc))
            .is_some_and(|t| now - t < ROUND_GAP_NS)
        {
            return;
        }
        let Some(s) = self.senders.get_mut(&(slot, proc)) else {
            return;
        };
        let reqs = s.maybe_ask(now, &mut self.rng);
        if !reqs.is_empty() {
            self.last_round.insert((slot, proc), now);
        }
        self.send_requests(slot, proc, reqs, now);
    }

    fn send_requests(&mut self, slot: u32, proc: ProcessId, reqs: Vec<(u32, Request)>, now: f64) {
        let mut queue: Vec<(ProcessId, u32, Request)> =
            reqs.into_iter().map(|(to, r)| (proc, to, r)).collect();
        // Local answers may complete a round and start the next: a work list.
        while let Some((asker, to, r)) = queue.pop() {
            let host = self.limits[&slot]
                .procs
                .iter()
                .find(|x| x.0 == to)
                .map(|x| x.1.clone());
            match host {
                Some(h) if h == self.host => {
                    let resp = self.senders.get_mut(&(slot, to)).map_or(
                        Response {
                            id: r.id,
                            tokens: 0.0,
                            rate: 0.0,
                        },
                        |s| s.on_request(now, &r),
                    );
                    if let Some(s) = self.senders.get_mut(&(slot, asker)) {
                        let (_, next) = s.on_response(now, &resp, &mut self.rng);
                        queue.extend(next.into_iter().map(|(t, r)| (asker, t, r)));
                    }
                }
                Some(h) if self.view.contains(&h) => {
                    self.asked_at.insert((slot, asker, r.id), now);
                    self.out.push((
                        h,
                        sidecore_wire::Message::RateRequest(RateExchange {
                            slot,
                            from: asker,
                            to,
                            view: self.view_id,
                            id: r.id,
                            tokens: r.tokens,
                            rate: r.rate,
                        }),
                    ));
                }
                // Unreachable or unplaced: the request is lost at once.
                _ => {
                    if let Some(s) = self.senders.get_mut(&(slot, asker)) {
                        s.on_request_lost(r.id);
                    }
                }
            }
        }
    }

    /// A request from another agent: the answer to send back. A request from
    /// another view, or for a process not here, is answered with nothing
    /// given, so that its round completes.
    pub fn on_request(&mut self, ex: &RateExchange, now: f64) -> RateExchange {
        let mut resp = RateExchange {
            from: ex.to,
            to: ex.from,
            tokens: 0.0,
            rate: 0.0,
            ..*ex
        };
        if ex.view != self.view_id {
            return resp;
        }
        if let Some(s) = self.senders.get_mut(&(ex.slot, ex.to)) {
            let r = s.on_request(
                now,
                &Request {
                    id: ex.id,
                    tokens: ex.tokens.max(0.0),
                    rate: ex.rate.max(0.0),
                },
            );
            resp.tokens = r.tokens;
            resp.rate = r.rate;
        }
        resp
    }

    /// A response from another agent; it is applied at most once, and only in
    /// the view it was given in.
    pub fn on_response(&mut self, ex: &RateExchange, now: f64) {
        let key = (ex.slot, ex.to, ex.id);
        if self.asked_at.remove(&key).is_none() || ex.view != self.view_id {
            return;
        }
        let Some(s) = self.senders.get_mut(&(ex.slot, ex.to)) else {
            return;
        };
        let resp = Response {
            id: ex.id,
            tokens: ex.tokens.max(0.0),
            rate: ex.rate.max(0.0),
        };
        let (_, next) = s.on_response(now, &resp, &mut self.rng);
        self.send_requests(ex.slot, ex.to, next, now);
    }

    /// Time passing: lost requests are declared lost, and senders whose
    /// buckets run low ask.
    pub fn tick(&mut self, now: f64) {
        let lost: Vec<(u32, ProcessId, u64)> = self
            .asked_at
            .iter()
            .filter(|(_, t)| now - **t > REQUEST_TIMEOUT_NS)
            .map(|(k, _)| *k)
            .collect();
        for k in lost {
            self.asked_at.remove(&k);
            if let Some(s) = self.senders.get_mut(&(k.0, k.1)) {
                s.on_request_lost(k.2);
            }
        }
        let keys: Vec<(u32, ProcessId)> = self.senders.keys().copied().collect();
        for (slot, p) in keys {
            self.ask(slot, p, now);
        }
    }

    /// Messages for other agents (host, message).
    pub fn take_out(&mut self) -> Vec<(String, sidecore_wire::Message)> {
        std::mem::take(&mut self.out)
    }

    /// Each limit's fill rate held on this host, bytes per second.
    pub fn local_rates(&self) -> BTreeMap<u32, f64> {
        let mut m = BTreeMap::new();
        for (&(slot, _), s) in &self.senders {
            *m.entry(slot).or_insert(0.0) += s.rate() * 1e9;
        }
        m
    }

    /// The source service of a limit.
    pub fn source(&self, slot: u32) -> Option<ServiceId> {
        self.limits.get(&slot).map(|l| l.from)
    }
}

pub mod sim;
#[cfg(test)]
mod tests;
