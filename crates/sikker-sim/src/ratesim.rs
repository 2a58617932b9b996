//! RateSim (dissertation ch. 8): a deterministic discrete-event simulation of a source
//! service of 1,000 processes sending to a destination service of 750 under an
//! aggregate rate limit, for each of the six algorithms of `sidecore-sikker-rate`.
//!
//! Set-up (§8.1): 1 GHz clock, one phit (100 bits) per cycle per link, so 1 phit/cycle
//! is 100 Gbps; one-way latency 500 cycles; senders serialise at line rate and queue
//! locally; receivers have infinite bandwidth; packets of 5–82 phits (uniform) to a
//! random destination process; `R_a` = 500 phits/cycle; `S_b` = 2000; the four traffic
//! periods of Fig. 8.1 (all at 40 %, then half at 80 % and half off, swapped, then all
//! at 40 % again, changing every `interval` cycles).
//!
//! Choices the dissertation leaves open, each flagged in the digest (§4.6, erratum 9):
//! - **sources are paced** (packet *k+1* is created `size_k / rate` cycles after packet
//!   *k*; a random phase per sender), and the reported **latency excludes the packet's
//!   own serialisation**: it is the time from creation to the start of its transmission
//!   plus the 500-cycle network latency (and for RE the relay's queueing plus a second
//!   500). This is the reading under which NE's 99.99th percentile is the 500 ns of
//!   Table 8.1; Poisson arrivals are available as an option;
//! - a control message (exchange request/response, RE credit) is **2 phits** (RE's
//!   41,978 Gbps implies ≈2 phits of credit traffic per data packet) and **does not
//!   wait in the sender's data queue**;
//! - RE credits are counted per sender (`N_o`), returned when the relay forwards the
//!   packet; a relay's capability `R_r` is the line rate, so `N_r = 500`;
//! - a sender's PeerSet is every other process of the source service;
//! - Table 8.1's **bandwidth column is read as the run's aggregate**, the overhead
//!   averaged over the three periods ([`RateSimResult::overhead_mean_gbps`]), while the
//!   penalty keeps §8.1's own `max(B1, B2, 2·B3)`. §8.1 defines the worst-period figure
//!   only "in the penalty calculation" and §8.2 calls the table "aggregate results";
//!   the worst period is reported beside it ([`RateSimResult::overhead_worst_gbps`]).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sidecore_sikker_rate::relay::{Credits, ReParams, Relay};
use sidecore_sikker_rate::{Algorithm, Request, Response, SeParams, SeSender, formulas};

/// How sources create packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Arrivals {
    /// Deterministic spacing `size / rate`.
    Paced,
    /// Exponential spacing with the same mean.
    Poisson,
}

/// The experiment (§8.1).
#[derive(Clone, Debug, Serialize)]
pub struct RateSimConfig {
    /// Source processes.
    pub senders: usize,
    /// Destination processes.
    pub receivers: usize,
    /// `R_a`, phits per cycle.
    pub r_a: f64,
    /// One-way network latency, cycles.
    pub latency: f64,
    /// Smallest packet, phits.
    pub min_size: u32,
    /// Largest packet, phits.
    pub max_size: u32,
    /// Warm-up, cycles.
    pub warmup: f64,
    /// Length of each of the three measured periods, cycles (40,000 = 25 kHz).
    pub interval: f64,
    /// Cycles simulated after the last period with no new packets, so that packets
    /// created near the end can arrive.
    pub drain: f64,
    /// Control-message size, phits.
    pub ctrl_size: f64,
    /// Packet creation.
    pub arrivals: Arrivals,
    /// Width of a bin of the bandwidth time series, cycles.
    pub bin: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for RateSimConfig {
    fn default() -> Self {
        RateSimConfig {
            senders: 1000,
            receivers: 750,
            r_a: 500.0,
            latency: 500.0,
            min_size: 5,
            max_size: 82,
            warmup: 10_000.0,
            interval: 40_000.0,
            drain: 20_000.0,
            ctrl_size: 2.0,
            arrivals: Arrivals::Paced,
            bin: 500.0,
            seed: 1,
        }
    }
}

impl RateSimConfig {
    /// End of the last period.
    pub fn end(&self) -> f64 {
        self.warmup + 3.0 * self.interval
    }

    /// The sending rate of sender `i` at time `t` (Fig. 8.1).
    pub fn rate(&self, i: usize, t: f64) -> f64 {
        let first_half = i < self.senders / 2;
        match (self.period_at(t), first_half) {
            (Some(0), true) | (Some(1), false) => 0.8,
            (Some(0), false) | (Some(1), true) => 0.0,
            (Some(_), _) => 0.4,
            (None, _) if t < self.warmup => 0.4,
            (None, _) => 0.0,
        }
    }

    /// Which measured period (0, 1, 2) `t` falls in.
    pub fn period_at(&self, t: f64) -> Option<usize> {
        if t < self.warmup || t >= self.end() {
            return None;
        }
        Some((((t - self.warmup) / self.interval) as usize).min(2))
    }
}

/// An algorithm with its parameters.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AlgoConfig {
    /// Which algorithm.
    pub alg: Algorithm,
    /// SE parameters (SE-FA uses only `bucket_size`).
    pub se: SeParams,
    /// RE: credits per sender (`N_o`); `None` = unlimited.
    pub credits: Option<u32>,
    /// RE: relay capability `R_r`, phits/cycle.
    pub r_r: f64,
}

impl AlgoConfig {
    /// Defaults for `alg` with bucket `s_b`, under the assumption [A] that a
    /// giver keeps the rate it is using (`SeParams::keep_used`; not in the
    /// dissertation, adopted because it reproduces Table 8.1): the lowest-penalty
    /// configurations of sidecore's sweep with that rule (seeds 1–3; see
    /// BENCHMARKS.md), thresholds scaled with `s_b`. [`AlgoConfig::exact`] is
    /// chapter 5 literally.
    pub fn tuned(alg: Algorithm, s_b: f64) -> Self {
        let mut c = Self::exact(alg, s_b);
        match alg {
            Algorithm::SeTre => {
                c.se.f_r = 1.0;
                c.se.keep_used = Some(s_b);
            }
            Algorithm::SeRe => {
                c.se.th_low = 0.6 * s_b;
                c.se.n_peers = 24;
                c.se.f_r = 1.0;
                c.se.th_r = 0.75 * s_b;
                c.se.f_mr = 0.5;
                c.se.keep_used = Some(s_b);
            }
            // The others exchange no rate: the rule does not touch them.
            _ => {}
        }
        c
    }

    /// Defaults for `alg` with bucket `s_b` under chapter 5's formulas exactly
    /// (`--exact-formulas`): the lowest-penalty configurations of sidecore's
    /// sweep ([`sweep_grid`], averaged over seeds 1–3), thresholds scaled with
    /// `s_b`.
    pub fn exact(alg: Algorithm, s_b: f64) -> Self {
        let mut se = SeParams::tuned(s_b);
        match alg {
            Algorithm::SeTe => {
                se.th_low = 0.5 * s_b;
                se.n_peers = 3;
                se.f_t = 1.5;
                se.th_t = 0.5 * s_b;
            }
            Algorithm::SeRe => {
                se.th_low = 0.5 * s_b;
                se.n_peers = 16;
                se.f_r = 1.0;
                se.th_r = 0.9 * s_b;
                se.f_mr = 0.75;
            }
            _ => {}
        }
        AlgoConfig {
            alg,
            se,
            credits: Some(64),
            r_r: 1.0,
        }
    }
}

/// Latency and overhead of one measured period.
#[derive(Clone, Debug, Serialize)]
pub struct PeriodStats {
    /// Packets created in the period.
    pub packets: u64,
    /// Of which never delivered by the end of the drain.
    pub undelivered: u64,
    /// 99.99th percentile latency, ns (`inf` when it falls on an undelivered packet).
    pub p9999_ns: f64,
    /// Overhead: phits received by anything but destination processes, per cycle.
    pub overhead: f64,
    /// Growth of the data queued at the sources over the last quarter of the period,
    /// phits per cycle.
    pub backlog_growth: f64,
    /// The backlog still grows at the end of the period by more than 1 % of `R_a`:
    /// latency is unbounded (Table 8.1's ∞), whatever the finite run measured.
    pub unbounded: bool,
    /// The 99.99th percentile this finite run measured, ns.
    pub measured_p9999_ns: f64,
}

/// One bin of the bandwidth time series, phits per cycle.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Bin {
    /// Start of the bin, cycles.
    pub t: f64,
    /// Data sent by the source service.
    pub sent: f64,
    /// Data received by the destination service.
    pub received: f64,
    /// Received by source processes (control traffic).
    pub at_sources: f64,
    /// Received by relays.
    pub at_relays: f64,
    /// Data queued at the sources at the end of the bin, phits.
    pub queued: f64,
}

/// Result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct RateSimResult {
    /// Algorithm and parameters.
    pub algo: AlgoConfig,
    /// Periods 1–3.
    pub periods: Vec<PeriodStats>,
    /// Worst per-period 99.99th percentile, ns.
    pub latency_p9999_ns: f64,
    /// Overhead averaged over the three periods, Gbps: the figure compared with
    /// Table 8.1's column (read as the run's aggregate; flagged in the module comment).
    pub overhead_mean_gbps: f64,
    /// Worst per-period overhead, Gbps (the `max` of the penalty, without its 2× on
    /// period 3).
    pub overhead_worst_gbps: f64,
    /// `L + 75 × max(B1, B2, 2·B3)` (§8.1), B in phits/cycle.
    pub penalty: f64,
    /// Worst-case (over periods) latency at each percentile of
    /// [`PERCENTILES`] (Fig. 8.4).
    pub worst_percentiles: Vec<(f64, f64)>,
    /// Bandwidth over time (Fig. 8.2).
    pub series: Vec<Bin>,
    /// Eq. 8.1 in bytes: `S_b × N_tb × 100 bits / 8`.
    pub max_burst_bytes: f64,
    /// Events processed.
    pub events: u64,
    /// Largest Σ R_t observed over senders plus rate in flight (must stay ≤ R_a).
    pub max_rate_sum: f64,
}

/// Relative floating-point slack of the rate-conservation assertion.
const RATE_SUM_TOLERANCE: f64 = 1e-9;

/// Percentiles of the latency-percentile plot.
pub const PERCENTILES: [f64; 8] = [50.0, 90.0, 99.0, 99.9, 99.99, 99.999, 99.9999, 100.0];

#[derive(Clone, Copy, Debug)]
struct Pkt {
    created: f64,
    size: u32,
    /// Accumulated waiting (queueing) time before this hop.
    waited: f64,
    src: u32,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Create(u32),
    LinkFree(u32),
    Wakeup(u32, u32),
    Req { from: u32, to: u32, req: Request },
    Resp { to: u32, resp: Response },
    Credit(u32),
    RelayArrive(u32, Pkt, f64),
    RelayFree(u32),
    RelayWake(u32, u32),
    Tick,
}

struct Item {
    t: f64,
    seq: u64,
    ev: Ev,
}
impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on (time, sequence): ties resolve in scheduling order.
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

struct Sender {
    queue: VecDeque<Pkt>,
    busy_until: f64,
    link_pending: bool,
    se: Option<SeSender>,
    credits: Credits,
    wake_gen: u32,
    wake_at: f64,
    creating: bool,
}

struct RelayNode {
    relay: Relay,
    queue: VecDeque<(Pkt, f64)>,
    busy: bool,
    wake_gen: u32,
    wake_at: f64,
}

struct Sim<'a> {
    cfg: &'a RateSimConfig,
    algo: AlgoConfig,
    rng: ChaCha8Rng,
    heap: BinaryHeap<Item>,
    seq: u64,
    senders: Vec<Sender>,
    relays: Vec<RelayNode>,
    hist: Vec<Histogram<u64>>,
    created: Vec<u64>,
    delivered: Vec<u64>,
    overhead: [f64; 3],
    series: Vec<Bin>,
    rate_in_flight: f64,
    max_rate_sum: f64,
    events: u64,
    queued: f64,
}

impl<'a> Sim<'a> {
    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item {
            t,
            seq: self.seq,
            ev,
        });
    }

    fn bin(&mut self, t: f64) -> &mut Bin {
        let i = ((t / self.cfg.bin) as usize).min(self.series.len() - 1);
        &mut self.series[i]
    }

    fn overhead_at(&mut self, t: f64, phits: f64, relay: bool) {
        if let Some(p) = self.cfg.period_at(t) {
            self.overhead[p] += phits;
        }
        let b = self.bin(t);
        if relay {
            b.at_relays += phits;
        } else {
            b.at_sources += phits;
        }
    }

    fn record(&mut self, p: &Pkt, latency: f64, arrive: f64) {
        if let Some(k) = self.cfg.period_at(p.created) {
            let _ = self.hist[k].record(latency.ceil().max(0.0) as u64);
            self.delivered[k] += 1;
        }
        self.bin(arrive).received += p.size as f64;
    }

    fn next_gap(&mut self, i: usize, t: f64, size: u32) -> Option<f64> {
        let r = self.cfg.rate(i, t);
        if r <= 0.0 {
            return None;
        }
        let mean = size as f64 / r;
        Some(match self.cfg.arrivals {
            Arrivals::Paced => mean,
            Arrivals::Poisson => -mean * (1.0 - self.rng.random::<f64>()).ln(),
        })
    }

    fn create(&mut self, i: usize, now: f64) {
        if now >= self.cfg.end() || self.cfg.rate(i, now) <= 0.0 {
            self.senders[i].creating = false;
            return;
        }
        let size = self.rng.random_range(self.cfg.min_size..=self.cfg.max_size);
        let pkt = Pkt {
            created: now,
            size,
            waited: 0.0,
            src: i as u32,
        };
        if let Some(k) = self.cfg.period_at(now) {
            self.created[k] += 1;
        }
        self.queued += size as f64;
        let q = self.queued;
        self.bin(now).queued = q;
        self.senders[i].queue.push_back(pkt);
        if let Some(g) = self.next_gap(i, now, size) {
            self.push(now + g, Ev::Create(i as u32));
        } else {
            self.senders[i].creating = false;
        }
        self.try_send(i, now);
    }

    fn ask(&mut self, i: usize, now: f64) {
        let Some(se) = self.senders[i].se.as_mut() else {
            return;
        };
        let reqs = se.maybe_ask(now, &mut self.rng);
        self.send_reqs(i, now, reqs);
    }

    fn send_reqs(&mut self, i: usize, now: f64, reqs: Vec<(u32, Request)>) {
        let d = self.cfg.ctrl_size + self.cfg.latency;
        for (to, req) in reqs {
            self.push(
                now + d,
                Ev::Req {
                    from: i as u32,
                    to,
                    req,
                },
            );
        }
    }

    fn try_send(&mut self, i: usize, now: f64) {
        let alg = self.algo.alg;
        {
            let s = &mut self.senders[i];
            if s.busy_until > now || s.link_pending {
                return;
            }
            let Some(&head) = s.queue.front() else {
                return;
            };
            let size = head.size as f64;
            let mut wake = None;
            let ok = match alg {
                Algorithm::Ne => true,
                Algorithm::Re => s.credits.try_take(),
                _ => {
                    let se = s.se.as_mut().expect("SE state");
                    if se.try_send(now, size) {
                        true
                    } else {
                        if let Some(t) = se.ready_at(now, size)
                            && (s.wake_at <= now || t < s.wake_at)
                        {
                            s.wake_gen += 1;
                            s.wake_at = t;
                            wake = Some((t, s.wake_gen));
                        }
                        false
                    }
                }
            };
            if !ok {
                if let Some((t, g)) = wake {
                    self.push(t, Ev::Wakeup(i as u32, g));
                }
                self.ask(i, now);
                return;
            }
            let mut pkt = s.queue.pop_front().expect("head");
            s.busy_until = now + size;
            s.link_pending = true;
            pkt.waited += now - pkt.created;
            self.queued -= size;
            let q = self.queued;
            self.bin(now).queued = q;
            self.push(now + size, Ev::LinkFree(i as u32));
            self.bin(now).sent += size;
            match alg {
                Algorithm::Re => {
                    let r = self.rng.random_range(0..self.relays.len()) as u32;
                    let arrive = now + size + self.cfg.latency;
                    self.push(arrive, Ev::RelayArrive(r, pkt, arrive));
                }
                _ => {
                    let _dst = self.rng.random_range(0..self.cfg.receivers);
                    let lat = pkt.waited + self.cfg.latency;
                    self.record(&pkt, lat, now + size + self.cfg.latency);
                }
            }
            self.ask(i, now);
        }
    }

    fn relay_try(&mut self, r: usize, now: f64) {
        let n = &mut self.relays[r];
        if n.busy {
            return;
        }
        let Some(&(pkt, arrived)) = n.queue.front() else {
            return;
        };
        let size = pkt.size as f64;
        if !n.relay.try_forward(now, size) {
            if let Some(t) = n.relay.ready_at(now, size)
                && (n.wake_at <= now || t < n.wake_at)
            {
                n.wake_gen += 1;
                n.wake_at = t;
                let g = n.wake_gen;
                self.push(t, Ev::RelayWake(r as u32, g));
            }
            return;
        }
        n.queue.pop_front();
        n.busy = true;
        self.push(now + size, Ev::RelayFree(r as u32));
        let lat = pkt.waited + self.cfg.latency + (now - arrived) + self.cfg.latency;
        self.record(&pkt, lat, now + size + self.cfg.latency);
        // Return the credit to the sender.
        if self.algo.credits.is_some() {
            self.push(
                now + self.cfg.ctrl_size + self.cfg.latency,
                Ev::Credit(pkt.src),
            );
        }
    }

    fn rate_sum(&self) -> f64 {
        self.senders
            .iter()
            .filter_map(|s| s.se.as_ref().map(sidecore_sikker_rate::SeSender::rate))
            .sum::<f64>()
            + self.rate_in_flight
    }

    fn run(&mut self) {
        let end = self.cfg.end() + self.cfg.drain;
        while let Some(Item { t, ev, .. }) = self.heap.pop() {
            if t > end {
                break;
            }
            self.events += 1;
            match ev {
                Ev::Create(i) => self.create(i as usize, t),
                Ev::LinkFree(i) => {
                    self.senders[i as usize].link_pending = false;
                    self.try_send(i as usize, t);
                }
                Ev::Wakeup(i, g) => {
                    if self.senders[i as usize].wake_gen == g {
                        self.senders[i as usize].wake_at = 0.0;
                        self.try_send(i as usize, t);
                    }
                }
                Ev::Req { from, to, req } => {
                    self.overhead_at(t, self.cfg.ctrl_size, false);
                    let se = self.senders[to as usize].se.as_mut().expect("SE");
                    let resp = se.on_request(t, &req);
                    self.rate_in_flight += resp.rate;
                    self.push(
                        t + self.cfg.ctrl_size + self.cfg.latency,
                        Ev::Resp { to: from, resp },
                    );
                    // The giver's bucket shrank: its wake-up may be too early, which is
                    // harmless (it re-checks). Its threshold may now be crossed.
                    self.ask(to as usize, t);
                }
                Ev::Resp { to, resp } => {
                    self.overhead_at(t, self.cfg.ctrl_size, false);
                    let i = to as usize;
                    let se = self.senders[i].se.as_mut().expect("SE");
                    let (_, next) = se.on_response(t, &resp, &mut self.rng);
                    self.rate_in_flight -= resp.rate;
                    self.send_reqs(i, t, next);
                    // Tokens or rate arrived: re-plan the head packet.
                    self.senders[i].wake_at = 0.0;
                    self.senders[i].wake_gen += 1;
                    self.try_send(i, t);
                    let s = self.rate_sum();
                    // Rate conservation (§5.5): senders' rates plus rate in flight
                    // never exceed R_a, the sum they started with.
                    assert!(
                        s <= self.cfg.r_a * (1.0 + RATE_SUM_TOLERANCE),
                        "rate created at cycle {t}: Σ R_t + in flight = {s} > R_a = {}",
                        self.cfg.r_a
                    );
                    if s > self.max_rate_sum {
                        self.max_rate_sum = s;
                    }
                }
                Ev::Credit(i) => {
                    self.overhead_at(t, self.cfg.ctrl_size, false);
                    self.senders[i as usize].credits.on_return();
                    self.try_send(i as usize, t);
                }
                Ev::RelayArrive(r, pkt, arrived) => {
                    self.overhead_at(t, pkt.size as f64, true);
                    self.relays[r as usize].queue.push_back((pkt, arrived));
                    self.relay_try(r as usize, t);
                }
                Ev::RelayFree(r) => {
                    self.relays[r as usize].busy = false;
                    self.relay_try(r as usize, t);
                }
                Ev::RelayWake(r, g) => {
                    if self.relays[r as usize].wake_gen == g {
                        self.relays[r as usize].wake_at = 0.0;
                        self.relay_try(r as usize, t);
                    }
                }
                Ev::Tick => {
                    // Period boundary: restart senders that were off.
                    for i in 0..self.senders.len() {
                        if !self.senders[i].creating && self.cfg.rate(i, t) > 0.0 {
                            self.senders[i].creating = true;
                            let phase = self.rng.random::<f64>() * 43.5 / self.cfg.rate(i, t);
                            self.push(t + phase, Ev::Create(i as u32));
                        }
                    }
                }
            }
        }
    }
}

/// Runs one simulation.
pub fn simulate(cfg: &RateSimConfig, algo: AlgoConfig) -> RateSimResult {
    let mut sim = Sim::new(cfg, algo);
    sim.run();
    sim.into_result()
}

impl<'a> Sim<'a> {
    /// Senders (and RE's relays) at their initial rates, every source's first packet
    /// and the three period changes scheduled.
    fn new(cfg: &'a RateSimConfig, algo: AlgoConfig) -> Self {
        let n = cfg.senders;
        let init_rate = cfg.r_a / n as f64;
        let re = ReParams {
            r_a: cfg.r_a,
            r_r: algo.r_r,
            bucket_size: algo.se.bucket_size,
            credits: algo.credits,
        };
        let senders = (0..n)
            .map(|i| Sender {
                queue: VecDeque::new(),
                busy_until: 0.0,
                link_pending: false,
                se: algo.alg.se_variant().map(|v| {
                    let peers = (0..n as u32).filter(|&j| j as usize != i).collect();
                    SeSender::new(v, algo.se, init_rate, peers, 0.0)
                }),
                credits: Credits::new(algo.credits),
                wake_gen: 0,
                wake_at: 0.0,
                creating: true,
            })
            .collect();
        let relays = if algo.alg == Algorithm::Re {
            (0..re.relays())
                .map(|_| RelayNode {
                    relay: Relay::new(&re, 0.0),
                    queue: VecDeque::new(),
                    busy: false,
                    wake_gen: 0,
                    wake_at: 0.0,
                })
                .collect()
        } else {
            Vec::new()
        };
        let end = cfg.end() + cfg.drain;
        let bins = (end / cfg.bin).ceil() as usize + 1;
        let mut sim = Sim {
            cfg,
            algo,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            heap: BinaryHeap::new(),
            seq: 0,
            senders,
            relays,
            hist: (0..3)
                .map(|_| Histogram::new(3).expect("histogram"))
                .collect(),
            created: vec![0; 3],
            delivered: vec![0; 3],
            overhead: [0.0; 3],
            series: (0..bins)
                .map(|i| Bin {
                    t: i as f64 * cfg.bin,
                    ..Default::default()
                })
                .collect(),
            rate_in_flight: 0.0,
            max_rate_sum: 0.0,
            events: 0,
            queued: 0.0,
        };
        for i in 0..n {
            let phase = sim.rng.random::<f64>() * 43.5 / cfg.rate(i, 0.0);
            sim.push(phase, Ev::Create(i as u32));
        }
        for k in 0..3 {
            sim.push(cfg.warmup + k as f64 * cfg.interval, Ev::Tick);
        }
        sim.max_rate_sum = sim.rate_sum();
        sim
    }

    /// Period `k`'s statistics; raises `worst` to its latency at each of
    /// [`PERCENTILES`].
    fn period(&self, k: usize, worst: &mut [f64]) -> PeriodStats {
        let (sim, cfg) = (self, self.cfg);
        let h = &sim.hist[k];
        let created = sim.created[k];
        let undelivered = created.saturating_sub(sim.delivered[k]);
        // Undelivered packets count as infinitely late.
        let q_at = |q: f64| -> f64 {
            if created == 0 {
                return 0.0;
            }
            let rank = ((q / 100.0) * created as f64).ceil() as u64;
            if rank > sim.delivered[k] {
                f64::INFINITY
            } else {
                let qq = (rank as f64 / sim.delivered[k].max(1) as f64).min(1.0);
                h.value_at_quantile(qq) as f64
            }
        };
        // Backlog at 3/4 of the period and at its end (last sample at or before).
        let backlog = |t: f64| -> f64 {
            let i = ((t / cfg.bin) as usize).min(sim.series.len() - 1);
            sim.series[..=i]
                .iter()
                .rev()
                .find(|b| b.queued > 0.0)
                .map(|b| b.queued)
                .unwrap_or(0.0)
        };
        let start = cfg.warmup + k as f64 * cfg.interval;
        let growth = (backlog(start + cfg.interval - cfg.bin)
            - backlog(start + 0.75 * cfg.interval))
            / (0.25 * cfg.interval - cfg.bin);
        let unbounded = growth > 0.01 * cfg.r_a;
        let measured = q_at(99.99);
        for (j, &q) in PERCENTILES.iter().enumerate() {
            let v = if unbounded && q >= 99.99 {
                f64::INFINITY
            } else {
                q_at(q)
            };
            worst[j] = worst[j].max(v);
        }
        PeriodStats {
            packets: created,
            undelivered,
            p9999_ns: if unbounded { f64::INFINITY } else { measured },
            overhead: sim.overhead[k] / cfg.interval,
            backlog_growth: growth,
            unbounded,
            measured_p9999_ns: measured,
        }
    }

    /// The run's result: per-period statistics, the §8.1 penalty and the series.
    fn into_result(mut self) -> RateSimResult {
        let (cfg, algo, n) = (self.cfg, self.algo, self.cfg.senders);
        let mut worst = vec![0.0f64; PERCENTILES.len()];
        let periods: Vec<PeriodStats> = (0..3).map(|k| self.period(k, &mut worst)).collect();
        let sim = &mut self;
        let l = periods.iter().map(|p| p.p9999_ns).fold(0.0, f64::max);
        let b = periods[0]
            .overhead
            .max(periods[1].overhead)
            .max(2.0 * periods[2].overhead);
        let bmax = periods.iter().map(|p| p.overhead).fold(0.0, f64::max);
        let bmean = periods.iter().map(|p| p.overhead).sum::<f64>() / periods.len() as f64;
        let n_tb = match algo.alg {
            Algorithm::Ne => 0,
            Algorithm::Re => sim.relays.len(),
            _ => n,
        };
        for bin in &mut sim.series {
            bin.sent /= cfg.bin;
            bin.received /= cfg.bin;
            bin.at_sources /= cfg.bin;
            bin.at_relays /= cfg.bin;
        }
        RateSimResult {
            algo,
            latency_p9999_ns: l,
            overhead_mean_gbps: bmean * 100.0,
            overhead_worst_gbps: bmax * 100.0,
            penalty: l + 75.0 * b,
            periods,
            worst_percentiles: PERCENTILES.iter().copied().zip(worst).collect(),
            series: std::mem::take(&mut sim.series),
            max_burst_bytes: formulas::max_aggregate_burst(algo.se.bucket_size, n_tb) * 100.0 / 8.0,
            events: sim.events,
            max_rate_sum: sim.max_rate_sum,
        }
    }
}

/// The parameter grid of the sweep for `alg` (§8.1: "nearly all practical settings";
/// the dissertation publishes only `Th_t = 35 %` and `Th_r = 90 %` of `S_b` for
/// SE-TRE, which the SE-TRE grid keeps fixed).
pub fn sweep_grid(alg: Algorithm, s_b: f64) -> Vec<AlgoConfig> {
    let base = AlgoConfig::exact(alg, s_b);
    let mut out = Vec::new();
    match alg {
        Algorithm::Ne | Algorithm::SeFa => out.push(base),
        Algorithm::Re => {
            for c in [16, 32, 64, 128, 256] {
                out.push(AlgoConfig {
                    credits: Some(c),
                    ..base
                });
            }
        }
        Algorithm::SeTe => {
            for th_low in [0.4, 0.5, 0.6, 0.75] {
                for n_peers in [2, 3, 4] {
                    for f_t in [1.0, 1.5, 2.0, 3.0] {
                        for th_t in [0.35, 0.5, 0.75] {
                            let mut a = base;
                            a.se.th_low = th_low * s_b;
                            a.se.n_peers = n_peers;
                            a.se.f_t = f_t;
                            a.se.th_t = th_t * s_b;
                            out.push(a);
                        }
                    }
                }
            }
        }
        Algorithm::SeRe => {
            for th_low in [0.4, 0.5, 0.6] {
                for n_peers in [8, 12, 16, 24] {
                    for f_r in [0.5, 1.0, 2.0] {
                        for th_r in [0.75, 0.9] {
                            for f_mr in [0.25, 0.5, 0.75] {
                                let mut a = base;
                                a.se.th_low = th_low * s_b;
                                a.se.n_peers = n_peers;
                                a.se.f_r = f_r;
                                a.se.th_r = th_r * s_b;
                                a.se.f_mr = f_mr;
                                out.push(a);
                            }
                        }
                    }
                }
            }
        }
        Algorithm::SeTre => {
            for th_low in [0.6, 0.65, 0.7, 0.75] {
                for n_peers in [4, 6, 8] {
                    for f_t in [1.0, 1.25, 1.5] {
                        for f_r in [0.5, 0.75, 1.0] {
                            for f_mr in [0.75, 0.9] {
                                let mut a = base;
                                a.se.th_low = th_low * s_b;
                                a.se.n_peers = n_peers;
                                a.se.f_t = f_t;
                                a.se.f_r = f_r;
                                a.se.f_mr = f_mr;
                                a.se.th_t = 0.35 * s_b;
                                a.se.th_r = 0.90 * s_b;
                                out.push(a);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// One configuration of a sweep, scored over several seeds.
#[derive(Clone, Debug, Serialize)]
pub struct SweepRow {
    /// The configuration.
    pub algo: AlgoConfig,
    /// The §8.1 penalty averaged over the seeds.
    pub penalty: f64,
    /// Its run under each seed, in the order the seeds were given (time series dropped).
    pub runs: Vec<RateSimResult>,
}

/// Runs every configuration of `grid` under each of `seeds` and ranks them by their
/// penalty averaged over the seeds, best first. One seed is not enough to rank by: a
/// 99.99th percentile over ~368 k packets per period rests on its 37th-worst packet,
/// so a single seed's optimum is partly tuned to that seed's noise (digest §4.6, "run
/// several seeds").
pub fn sweep(
    cfg: &RateSimConfig,
    seeds: &[u64],
    grid: &[AlgoConfig],
    threads: usize,
) -> Vec<SweepRow> {
    let per_seed: Vec<Vec<RateSimResult>> = seeds
        .iter()
        .map(|&seed| {
            run_many(
                &RateSimConfig {
                    seed,
                    ..cfg.clone()
                },
                grid,
                threads,
            )
        })
        .collect();
    let mut rows: Vec<SweepRow> = grid
        .iter()
        .enumerate()
        .map(|(i, &algo)| {
            let runs: Vec<RateSimResult> = per_seed.iter().map(|rs| rs[i].clone()).collect();
            let penalty = runs.iter().map(|r| r.penalty).sum::<f64>() / runs.len().max(1) as f64;
            SweepRow {
                algo,
                penalty,
                runs,
            }
        })
        .collect();
    rows.sort_by(|x, y| x.penalty.total_cmp(&y.penalty));
    rows
}

/// Runs `configs` on `threads` worker threads (results in input order, each run
/// deterministic, so the outcome does not depend on the thread count).
pub fn run_many(cfg: &RateSimConfig, configs: &[AlgoConfig], threads: usize) -> Vec<RateSimResult> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out: Vec<std::sync::Mutex<Option<RateSimResult>>> = configs
        .iter()
        .map(|_| std::sync::Mutex::new(None))
        .collect();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= configs.len() {
                        break;
                    }
                    let mut r = simulate(cfg, configs[i]);
                    r.series.clear();
                    *out[i].lock().expect("no panics hold this lock") = Some(r);
                }
            });
        }
    });
    out.into_iter()
        .map(|m| m.into_inner().expect("lock").expect("every run finished"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> RateSimConfig {
        RateSimConfig {
            senders: 40,
            receivers: 30,
            r_a: 20.0,
            warmup: 2_000.0,
            interval: 8_000.0,
            drain: 5_000.0,
            ..Default::default()
        }
    }

    #[test]
    fn traffic_periods_follow_fig_8_1() {
        let c = RateSimConfig::default();
        assert_eq!(c.rate(0, 5_000.0), 0.4);
        assert_eq!(c.rate(0, 10_000.0), 0.8);
        assert_eq!(c.rate(999, 10_000.0), 0.0);
        assert_eq!(c.rate(0, 50_000.0), 0.0);
        assert_eq!(c.rate(999, 50_000.0), 0.8);
        assert_eq!(c.rate(500, 90_000.0), 0.4);
        assert_eq!(c.rate(0, 130_000.0), 0.0);
        assert_eq!(c.period_at(9_999.0), None);
        assert_eq!(c.period_at(89_999.0), Some(1));
        assert_eq!(c.period_at(129_999.0), Some(2));
    }

    #[test]
    fn ne_paced_has_no_queueing() {
        let r = simulate(&small(), AlgoConfig::tuned(Algorithm::Ne, 2000.0));
        assert_eq!(r.latency_p9999_ns, 500.0);
        assert_eq!(r.overhead_worst_gbps, 0.0);
        assert!(
            r.periods
                .iter()
                .all(|p| p.packets > 1000 && p.undelivered == 0 && !p.unbounded)
        );
    }

    #[test]
    fn se_fa_starves_non_uniform_senders() {
        // 80 % demand against a fixed 50 % share: the bucket (2000) empties after
        // 6,667 cycles, then the queue grows by 0.3 phit per cycle.
        let mut c = small();
        c.interval = 20_000.0;
        let r = simulate(&c, AlgoConfig::tuned(Algorithm::SeFa, 2000.0));
        assert!(r.latency_p9999_ns.is_infinite());
        let p1 = &r.periods[0];
        assert!(p1.unbounded && p1.measured_p9999_ns > 5_000.0, "{p1:?}");
        // 20 senders × (0.8 − 0.5) phit per cycle of unserved demand.
        assert!((p1.backlog_growth - 6.0).abs() < 1.0, "{p1:?}");
        // Before the first change nothing waits: the warm-up fits the share.
        assert!(r.worst_percentiles[0].1 < r.latency_p9999_ns);
        assert_eq!(r.overhead_worst_gbps, 0.0);
    }

    #[test]
    fn re_doubles_traffic_and_has_min_1000ns() {
        let mut c = small();
        c.r_a = 20.0;
        let r = simulate(&c, AlgoConfig::tuned(Algorithm::Re, 2000.0));
        assert!(r.worst_percentiles[0].1 >= 1000.0);
        // ≈ 40 % of 40 senders = 16 phits/cycle of data through relays, plus credits.
        let o = r.periods[2].overhead;
        assert!(o > 16.0 && o < 19.0, "RE overhead {o}");
    }

    #[test]
    fn exchange_algorithms_stay_within_the_limit_and_cost_bandwidth() {
        for alg in [Algorithm::SeTe, Algorithm::SeRe, Algorithm::SeTre] {
            let r = simulate(&small(), AlgoConfig::tuned(alg, 2000.0));
            assert!(
                r.max_rate_sum <= 20.0 + 1e-6,
                "{alg}: Σ R_t {}",
                r.max_rate_sum
            );
            assert!(r.periods[0].overhead > 0.0, "{alg} exchanged nothing");
            // The limit holds: data sent in any bin never exceeds R_a by more than the
            // buckets' content (Eq. 8.1) spread over the bin.
            let burst = 40.0 * 2000.0 / c_bin();
            assert!(r.series.iter().all(|b| b.sent <= 20.0 + burst));
        }
    }

    #[test]
    fn the_defaults_keep_used_rate_and_exact_does_not() {
        for alg in [Algorithm::SeRe, Algorithm::SeTre] {
            assert_eq!(AlgoConfig::tuned(alg, 2000.0).se.keep_used, Some(2000.0));
            assert_eq!(AlgoConfig::exact(alg, 2000.0).se.keep_used, None);
        }
        for alg in [
            Algorithm::Ne,
            Algorithm::Re,
            Algorithm::SeFa,
            Algorithm::SeTe,
        ] {
            assert_eq!(AlgoConfig::tuned(alg, 2000.0).se.keep_used, None, "{alg}");
        }
    }

    #[test]
    fn keep_used_touches_only_rate_gives_and_keeps_the_limit() {
        for alg in [Algorithm::SeTe, Algorithm::SeTre] {
            let exact = simulate(&small(), AlgoConfig::exact(alg, 2000.0));
            let mut c = AlgoConfig::exact(alg, 2000.0);
            c.se.keep_used = Some(2000.0);
            let what_if = simulate(&small(), c);
            assert!(what_if.max_rate_sum <= 20.0 + 1e-6, "{alg}");
            if alg == Algorithm::SeTe {
                // No rate is exchanged: the option cannot change anything.
                assert_eq!(what_if.events, exact.events);
                assert_eq!(what_if.penalty, exact.penalty);
            } else {
                assert_ne!(what_if.events, exact.events, "the option took effect");
            }
        }
    }

    fn c_bin() -> f64 {
        RateSimConfig::default().bin
    }

    #[test]
    fn deterministic_for_a_seed() {
        let a = simulate(&small(), AlgoConfig::tuned(Algorithm::SeTre, 2000.0));
        let b = simulate(&small(), AlgoConfig::tuned(Algorithm::SeTre, 2000.0));
        assert_eq!(a.penalty, b.penalty);
        assert_eq!(a.events, b.events);
    }

    #[test]
    fn sweep_ranks_by_the_penalty_averaged_over_seeds() {
        let grid = &sweep_grid(Algorithm::SeTe, 2000.0)[..3];
        let rows = sweep(&small(), &[1, 2], grid, 2);
        assert_eq!(rows.len(), grid.len());
        for w in rows.windows(2) {
            assert!(w[0].penalty <= w[1].penalty);
        }
        for row in &rows {
            assert_eq!(row.runs.len(), 2);
            let alone: Vec<f64> = [1, 2]
                .iter()
                .map(|&seed| simulate(&RateSimConfig { seed, ..small() }, row.algo).penalty)
                .collect();
            assert_eq!(row.runs[0].penalty, alone[0]);
            assert_eq!(row.runs[1].penalty, alone[1]);
            assert_eq!(row.penalty, (alone[0] + alone[1]) / 2.0);
        }
        // The seeds really differ, or averaging them would be pointless.
        assert_ne!(rows[0].runs[0].events, rows[0].runs[1].events);
    }

    #[test]
    fn mean_overhead_lies_between_the_periods() {
        let r = simulate(&small(), AlgoConfig::tuned(Algorithm::SeTre, 2000.0));
        let o: Vec<f64> = r.periods.iter().map(|p| p.overhead * 100.0).collect();
        let lo = o.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(r.overhead_worst_gbps > 0.0);
        assert_eq!(r.overhead_worst_gbps, o.iter().copied().fold(0.0, f64::max));
        assert!(r.overhead_mean_gbps >= lo && r.overhead_mean_gbps <= r.overhead_worst_gbps);
        assert!((r.overhead_mean_gbps - o.iter().sum::<f64>() / 3.0).abs() < 1e-9);
    }
}
