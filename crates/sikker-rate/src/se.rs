//! The sender-enforced algorithms (SE-FA, SE-TE, SE-RE, SE-TRE): one token bucket per
//! source process, and the token/rate exchange between peers (§5.3–§5.6).

use rand::Rng;

use crate::bucket::TokenBucket;
use crate::formulas;

/// Which sender-enforced algorithm a [`SeSender`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum SeVariant {
    /// SE-FA (§5.3): no exchange.
    FixedAllocation,
    /// SE-TE (§5.4): tokens only.
    TokenExchange,
    /// SE-RE (§5.5): rate only.
    RateExchange,
    /// SE-TRE (§5.6): tokens and rate, in the same messages.
    TokenAndRateExchange,
}

impl SeVariant {
    fn tokens(self) -> bool {
        matches!(
            self,
            SeVariant::TokenExchange | SeVariant::TokenAndRateExchange
        )
    }
    fn rate(self) -> bool {
        matches!(
            self,
            SeVariant::RateExchange | SeVariant::TokenAndRateExchange
        )
    }
}

/// The variables of Table 5.1 used by the sender-enforced algorithms. Thresholds are
/// in tokens (§5.4, §5.5), rates are normalised (1.0 = line rate).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SeParams {
    /// `S_b`.
    pub bucket_size: f64,
    /// `Th_low`: ask peers when `N_t` falls below it.
    pub th_low: f64,
    /// `N_peers`.
    pub n_peers: usize,
    /// `F_t`.
    pub f_t: f64,
    /// `Th_t`: give tokens only above it.
    pub th_t: f64,
    /// `F_r`.
    pub f_r: f64,
    /// `Th_r`: give rate only when the token count exceeds it (§5.5; erratum 7).
    pub th_r: f64,
    /// `F_mr`, `0 < F_mr < 1`.
    pub f_mr: f64,
    /// **Not in the dissertation; off (`None`) unless asked for.** With `Some(τ)`, a
    /// giver never gives rate it is using: `R_give` (Eq. 5.6) is further capped at
    /// `R_t − u`, where `u` is the sender's own send rate averaged exponentially over
    /// `τ` time units. An experiment on why SE-TRE keeps exchanging once demand is
    /// uniform (BENCHMARKS.md, RateSim); the reproduction of record runs without it.
    #[serde(default)]
    pub keep_used: Option<f64>,
}

impl SeParams {
    /// The SE-TRE tuning for a bucket of `s_b`: `Th_t = 35 % S_b` and `Th_r = 90 % S_b`
    /// as §8.3.2 publishes; the other constants are unpublished, and these are the
    /// ones sidecore's RateSim sweep chose (penalty of §8.1 averaged over seeds 1–3;
    /// BENCHMARKS.md): `Th_low = 65 % S_b`, `N_peers = 6`, `F_t = 1.25`, `F_r = 0.75`,
    /// `F_mr = 0.75`.
    pub fn tuned(s_b: f64) -> Self {
        SeParams {
            bucket_size: s_b,
            th_low: 0.65 * s_b,
            n_peers: 6,
            f_t: 1.25,
            th_t: 0.35 * s_b,
            f_r: 0.75,
            th_r: 0.90 * s_b,
            f_mr: 0.75,
            keep_used: None,
        }
    }
}

/// An exchange request: tokens `T_ask` and/or rate `R_ask` (zero when the variant does
/// not exchange that resource).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// Unique per requester, so each response is applied at most once.
    pub id: u64,
    /// `T_ask`.
    pub tokens: f64,
    /// `R_ask`.
    pub rate: f64,
}

/// An exchange response: tokens `T_give` and rate `R_give`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Response {
    /// The id of the request answered.
    pub id: u64,
    /// `T_give`.
    pub tokens: f64,
    /// `R_give`.
    pub rate: f64,
}

/// Conservation counters of one sender (for tests and simulators).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SeAccounting {
    /// Tokens the bucket held at creation.
    pub initial: f64,
    /// Tokens consumed by packets.
    pub consumed: f64,
    /// Tokens given to peers in responses.
    pub given: f64,
    /// Tokens received from peers and kept.
    pub received: f64,
    /// Tokens received from peers but discarded because the bucket was full.
    pub discarded: f64,
    /// Requests sent.
    pub requests_sent: u64,
    /// Responses applied.
    pub responses_applied: u64,
    /// Responses ignored (unknown, duplicate or late).
    pub responses_ignored: u64,
}

/// The rate-control state of one source process towards one destination service
/// (the NMU's `RateFSM`, §6.2.6) for the sender-enforced algorithms.
///
/// Assumptions, all from the digest's reconstruction of Fig. 5.7:
/// - **[A]** equal start: `R_t = R_a / N_src` and a full bucket (`N_t = S_b`);
/// - **[A]** one round of requests at a time: no new round while one is outstanding;
///   when the last response of a round arrives and `N_t` is still below `Th_low`,
///   a second, serial round is asked (§8.3.1);
/// - **[A]** a responder decides both gives on its token level before giving;
/// - **[A]** received tokens overflowing the bucket are discarded; received rate is
///   never clipped (clipping would leak rate).
#[derive(Clone, Debug)]
pub struct SeSender {
    variant: SeVariant,
    params: SeParams,
    bucket: TokenBucket,
    peers: Vec<u32>,
    pending: Vec<u64>,
    next_id: u64,
    acct: SeAccounting,
    /// Send rate averaged over `keep_used`'s τ, as of `t_usage` (only with it).
    usage: f64,
    t_usage: f64,
}

impl SeSender {
    /// A sender with fill rate `initial_rate` and a full bucket. `peers` is the PeerSet:
    /// the other processes of the source service it may ask.
    pub fn new(
        variant: SeVariant,
        params: SeParams,
        initial_rate: f64,
        peers: Vec<u32>,
        now: f64,
    ) -> Self {
        let bucket = TokenBucket::new(params.bucket_size, initial_rate, now);
        SeSender {
            variant,
            params,
            acct: SeAccounting {
                initial: bucket.tokens,
                ..Default::default()
            },
            bucket,
            peers,
            pending: Vec::new(),
            next_id: 0,
            usage: initial_rate,
            t_usage: now,
        }
    }

    /// The variant.
    pub fn variant(&self) -> SeVariant {
        self.variant
    }
    /// The parameters.
    pub fn params(&self) -> &SeParams {
        &self.params
    }
    /// `N_t` as of the last event (call [`SeSender::refill`] first for "now").
    pub fn tokens(&self) -> f64 {
        self.bucket.tokens
    }
    /// `R_t`.
    pub fn rate(&self) -> f64 {
        self.bucket.rate
    }
    /// Requests of the current round still unanswered.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }
    /// Ids of the unanswered requests.
    pub fn pending(&self) -> &[u64] {
        &self.pending
    }
    /// Conservation counters.
    pub fn accounting(&self) -> SeAccounting {
        self.acct
    }
    /// Tokens added by refill since creation.
    pub fn refilled(&self) -> f64 {
        self.bucket.refilled
    }

    /// The send rate averaged over `tau` (exponential decay), as of `now`.
    fn usage_at(&self, now: f64, tau: f64) -> f64 {
        self.usage * (-(now - self.t_usage).max(0.0) / tau.max(f64::MIN_POSITIVE)).exp()
    }

    /// Brings the bucket up to `now`.
    pub fn refill(&mut self, now: f64) {
        self.bucket.refill(now);
    }

    /// Consumes `size` tokens for a packet if the bucket covers it.
    pub fn try_send(&mut self, now: f64, size: f64) -> bool {
        let before = {
            self.bucket.refill(now);
            self.bucket.tokens
        };
        if self.bucket.try_take(now, size) {
            if let Some(tau) = self.params.keep_used {
                self.usage = self.usage_at(now, tau) + size / tau;
                self.t_usage = now.max(self.t_usage);
            }
            // Within EPSILON of empty, the bucket gives what it has.
            self.acct.consumed += before - self.bucket.tokens;
            true
        } else {
            false
        }
    }

    /// When `size` tokens will be available at the current rate (`None`: never,
    /// unless a peer gives tokens or rate).
    pub fn ready_at(&self, now: f64, size: f64) -> Option<f64> {
        self.bucket.ready_at(now, size)
    }

    /// Starts a round of requests if `N_t < Th_low` and no round is outstanding:
    /// `N_peers` peers chosen at random without replacement, each asked for `T_ask`
    /// (Eq. 5.3) and/or `R_ask` (Eq. 5.5). SE-FA never asks.
    pub fn maybe_ask<R: Rng + ?Sized>(&mut self, now: f64, rng: &mut R) -> Vec<(u32, Request)> {
        if self.variant == SeVariant::FixedAllocation || !self.pending.is_empty() {
            return Vec::new();
        }
        self.bucket.refill(now);
        let p = self.params;
        if self.bucket.tokens >= p.th_low || self.peers.is_empty() || p.n_peers == 0 {
            return Vec::new();
        }
        let n = p.n_peers.min(self.peers.len());
        let tokens = if self.variant.tokens() {
            formulas::t_ask(p.bucket_size, self.bucket.tokens, p.n_peers, p.f_t)
        } else {
            0.0
        };
        let rate = if self.variant.rate() {
            formulas::r_ask(self.bucket.rate, p.n_peers, p.f_r)
        } else {
            0.0
        };
        if tokens <= 0.0 && rate <= 0.0 {
            return Vec::new();
        }
        let picks = rand::seq::index::sample(rng, self.peers.len(), n);
        let mut out = Vec::with_capacity(n);
        for i in picks.iter() {
            let id = self.next_id;
            self.next_id += 1;
            self.pending.push(id);
            self.acct.requests_sent += 1;
            out.push((self.peers[i], Request { id, tokens, rate }));
        }
        out
    }

    /// Answers a peer's request: `T_give` by Eq. 5.4 and, if `N_t > Th_r`, `R_give`
    /// by Eq. 5.6, both decided on the token level before either is given **[A]**.
    pub fn on_request(&mut self, now: f64, req: &Request) -> Response {
        self.bucket.refill(now);
        let p = self.params;
        let n_obs = self.bucket.tokens;
        let mut tokens = 0.0;
        if self.variant.tokens() && req.tokens > 0.0 {
            tokens = formulas::t_give(req.tokens, n_obs, p.th_t).max(0.0);
            self.bucket.tokens -= tokens;
            self.acct.given += tokens;
        }
        let mut rate = 0.0;
        if self.variant.rate() && req.rate > 0.0 && n_obs > p.th_r {
            rate = formulas::r_give(req.rate, self.bucket.rate, p.f_mr).max(0.0);
            if let Some(tau) = p.keep_used {
                rate = rate.min((self.bucket.rate - self.usage_at(now, tau)).max(0.0));
            }
            self.bucket.rate -= rate;
        }
        // Conservation: a give never exceeds what the giver holds, so an exchange
        // moves tokens and rate and never creates them (F_mr ≤ 1, Th_t ≥ 0).
        assert!(
            self.bucket.tokens >= 0.0 && self.bucket.rate >= 0.0,
            "SE sender gave more than it held: tokens {} rate {} left (gave {tokens}, {rate})",
            self.bucket.tokens,
            self.bucket.rate
        );
        Response {
            id: req.id,
            tokens,
            rate,
        }
    }

    /// Applies a response exactly once: tokens are added up to `S_b` (overflow
    /// discarded), rate is added unclipped. An unknown or repeated id is ignored and
    /// `false` returned, so a duplicated message can never create rate or tokens.
    /// When the round completes and `N_t` is still below `Th_low`, the next (serial)
    /// round is returned.
    pub fn on_response<R: Rng + ?Sized>(
        &mut self,
        now: f64,
        resp: &Response,
        rng: &mut R,
    ) -> (bool, Vec<(u32, Request)>) {
        let Some(pos) = self.pending.iter().position(|&id| id == resp.id) else {
            self.acct.responses_ignored += 1;
            return (false, Vec::new());
        };
        self.pending.swap_remove(pos);
        self.acct.responses_applied += 1;
        self.bucket.refill(now);
        let room = (self.bucket.size - self.bucket.tokens).max(0.0);
        let kept = resp.tokens.max(0.0).min(room);
        self.bucket.tokens += kept;
        self.acct.received += kept;
        self.acct.discarded += resp.tokens.max(0.0) - kept;
        self.bucket.rate += resp.rate.max(0.0);
        let next = if self.pending.is_empty() {
            self.maybe_ask(now, rng)
        } else {
            Vec::new()
        };
        (true, next)
    }

    /// Restarts the exchange with fill rate `rate` (a new membership view: the
    /// caller re-divides the limit among the members it can reach). Tokens are
    /// kept; the round in flight is forgotten, so its responses, if any arrive,
    /// are ignored (request ids keep counting, so none is mistaken for a new one).
    pub fn reset_rate(&mut self, now: f64, rate: f64) {
        self.bucket.refill(now);
        self.bucket.rate = rate.max(0.0);
        self.pending.clear();
        if self.params.keep_used.is_some() {
            self.usage = rate.max(0.0);
            self.t_usage = now;
        }
    }

    /// Declares a request lost (the caller's timeout). Its response, if it ever
    /// arrives, will be ignored; the rate it carried is leaked, which is safe.
    pub fn on_request_lost(&mut self, id: u64) -> bool {
        if let Some(pos) = self.pending.iter().position(|&x| x == id) {
            self.pending.swap_remove(pos);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_sets_the_rate_and_forgets_the_round_in_flight() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut s = SeSender::new(
            SeVariant::TokenAndRateExchange,
            params(),
            0.5,
            vec![1, 2, 3],
            0.0,
        );
        assert!(s.try_send(0.0, 450.0));
        let asked = s.maybe_ask(0.0, &mut rng);
        assert!(!asked.is_empty());
        s.reset_rate(1.0, 0.25);
        assert_eq!(s.rate(), 0.25);
        assert_eq!(s.outstanding(), 0);
        let late = Response {
            id: asked[0].1.id,
            tokens: 10.0,
            rate: 0.1,
        };
        let (applied, _) = s.on_response(2.0, &late, &mut rng);
        assert!(!applied, "a response from before the reset is ignored");
        assert_eq!(s.rate(), 0.25);
        // Ids continue: a new round does not reuse the forgotten ones.
        let again = s.maybe_ask(2.0, &mut rng);
        assert!(again.iter().all(|(_, r)| r.id >= asked.len() as u64));
    }
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn params() -> SeParams {
        SeParams {
            bucket_size: 500.0,
            th_low: 300.0,
            n_peers: 3,
            f_t: 1.0,
            th_t: 100.0,
            f_r: 1.0,
            th_r: 400.0,
            f_mr: 0.5,
            keep_used: None,
        }
    }

    #[test]
    fn fixed_allocation_never_asks() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut s = SeSender::new(
            SeVariant::FixedAllocation,
            params(),
            0.5,
            vec![1, 2, 3],
            0.0,
        );
        assert!(s.try_send(0.0, 450.0));
        assert!(s.maybe_ask(0.0, &mut rng).is_empty());
        assert!(!s.try_send(0.0, 82.0));
        assert_eq!(s.ready_at(0.0, 82.0), Some(64.0));
    }

    #[test]
    fn token_exchange_asks_eq_5_3_and_gives_eq_5_4() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut a = SeSender::new(SeVariant::TokenExchange, params(), 0.5, vec![1, 2, 3], 0.0);
        assert!(a.try_send(0.0, 300.0)); // N_t = 200: the example of §5.4
        let reqs = a.maybe_ask(0.0, &mut rng);
        assert_eq!(reqs.len(), 3);
        let mut peers: Vec<u32> = reqs.iter().map(|r| r.0).collect();
        peers.sort();
        assert_eq!(peers, vec![1, 2, 3]);
        for (_, r) in &reqs {
            assert_eq!(r.tokens, 100.0);
            assert_eq!(r.rate, 0.0);
        }
        // One round at a time.
        assert!(a.maybe_ask(0.0, &mut rng).is_empty());
        let mut b = SeSender::new(SeVariant::TokenExchange, params(), 0.5, vec![0], 0.0);
        assert!(b.try_send(0.0, 350.0)); // N_t = 150 > Th_t = 100 by 50
        let resp = b.on_request(0.0, &reqs[0].1);
        assert_eq!(resp.tokens, 50.0);
        assert_eq!(resp.rate, 0.0);
        assert_eq!(b.tokens(), 100.0);
        let (applied, next) = a.on_response(0.0, &resp, &mut rng);
        assert!(applied);
        assert!(next.is_empty(), "round still outstanding");
        assert_eq!(a.tokens(), 250.0);
        // A duplicate is ignored.
        let (applied, _) = a.on_response(0.0, &resp, &mut rng);
        assert!(!applied);
        assert_eq!(a.tokens(), 250.0);
    }

    #[test]
    fn rate_exchange_gives_only_above_token_threshold() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let mut a = SeSender::new(SeVariant::RateExchange, params(), 0.4, vec![1, 2, 3], 0.0);
        assert!(a.try_send(0.0, 300.0));
        let reqs = a.maybe_ask(0.0, &mut rng);
        assert_eq!(reqs.len(), 3);
        assert!((reqs[0].1.rate - 0.2).abs() < 1e-12); // the example of §5.5
        assert_eq!(reqs[0].1.tokens, 0.0);
        // Full bucket (500 > Th_r 400): gives min(0.2, 0.5 × 0.5).
        let mut rich = SeSender::new(SeVariant::RateExchange, params(), 0.5, vec![0], 0.0);
        let r = rich.on_request(0.0, &reqs[0].1);
        assert!((r.rate - 0.2).abs() < 1e-12);
        assert!((rich.rate() - 0.3).abs() < 1e-12);
        // Below Th_r: gives nothing.
        let mut poor = SeSender::new(SeVariant::RateExchange, params(), 0.5, vec![0], 0.0);
        assert!(poor.try_send(0.0, 150.0));
        let r2 = poor.on_request(0.0, &reqs[1].1);
        assert_eq!(r2.rate, 0.0);
        assert_eq!(poor.rate(), 0.5);
        let before = a.rate();
        a.on_response(0.0, &r, &mut rng);
        assert!((a.rate() - before - 0.2).abs() < 1e-12);
    }

    #[test]
    fn keep_used_gives_no_rate_the_giver_is_using() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut a = SeSender::new(SeVariant::RateExchange, params(), 0.1, vec![1], 0.0);
        assert!(a.try_send(0.0, 300.0));
        let req = a.maybe_ask(0.0, &mut rng)[0].1; // asks (1 − 0.1)/3 = 0.3
        // A giver at rate 0.5 that has sent 0.4 per time unit for a long while.
        let busy_giver = |p: SeParams| {
            let mut g = SeSender::new(SeVariant::RateExchange, p, 0.5, vec![0], 0.0);
            let mut t = 0.0;
            while t < 2000.0 {
                t += 10.0;
                assert!(g.try_send(t, 4.0));
            }
            (g, t)
        };
        let mut p = params();
        p.keep_used = Some(100.0);
        let (mut g, t) = busy_giver(p);
        let u = g.usage_at(t, 100.0);
        assert!((u - 0.4).abs() < 0.03, "usage {u}");
        let r = g.on_request(t, &req);
        // Eq. 5.6 alone would give min(0.3, 0.5 × 0.5) = 0.25; the cap leaves 0.5 − u.
        assert!((r.rate - (0.5 - u)).abs() < 1e-9, "{r:?}");
        assert!(g.rate() >= u - 1e-9, "kept what it uses");
        // Without the option the same giver gives Eq. 5.6's 0.25.
        let (mut h, t) = busy_giver(params());
        assert!((h.on_request(t, &req).rate - 0.25).abs() < 1e-9);
    }

    #[test]
    fn serial_second_round_when_still_low() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut p = params();
        p.n_peers = 1;
        let mut a = SeSender::new(SeVariant::TokenAndRateExchange, p, 0.5, vec![7, 8], 0.0);
        assert!(a.try_send(0.0, 450.0));
        let r1 = a.maybe_ask(0.0, &mut rng);
        assert_eq!(r1.len(), 1);
        let empty = Response {
            id: r1[0].1.id,
            tokens: 0.0,
            rate: 0.0,
        };
        let (_, r2) = a.on_response(1.0, &empty, &mut rng);
        assert_eq!(r2.len(), 1, "a second round follows an empty answer");
        assert_ne!(r2[0].1.id, r1[0].1.id);
    }

    #[test]
    fn lost_request_leaks_and_late_response_is_ignored() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let mut a = SeSender::new(SeVariant::TokenAndRateExchange, params(), 0.5, vec![1], 0.0);
        assert!(a.try_send(0.0, 400.0));
        let r = a.maybe_ask(0.0, &mut rng);
        assert!(a.on_request_lost(r[0].1.id));
        let late = Response {
            id: r[0].1.id,
            tokens: 10.0,
            rate: 0.1,
        };
        let (applied, _) = a.on_response(0.0, &late, &mut rng);
        assert!(!applied);
        assert_eq!(a.rate(), 0.5);
        // A new round can start.
        assert_eq!(a.maybe_ask(0.0, &mut rng).len(), 1);
    }
}
