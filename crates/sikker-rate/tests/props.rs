//! Property tests of the exchange protocol: under any interleaving of requests and
//! responses, including lost, reordered and duplicated ones, the sum of fill rates never
//! exceeds `R_a` and tokens are never created.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sidecore_sikker_rate::{Request, Response, SeParams, SeSender, SeVariant};

#[derive(Clone, Debug)]
enum Op {
    /// Advance time.
    Tick(u16),
    /// Sender tries to send a packet of this size.
    Send(usize, u8),
    /// Sender checks its threshold.
    Ask(usize),
    /// Deliver the in-flight message at this index (mod len).
    Deliver(usize),
    /// Deliver it twice (duplicate).
    Duplicate(usize),
    /// Lose it.
    Lose(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u16..400).prop_map(Op::Tick),
        (0usize..6, 5u8..83).prop_map(|(s, n)| Op::Send(s, n)),
        (0usize..6).prop_map(Op::Ask),
        (0usize..64).prop_map(Op::Deliver),
        (0usize..64).prop_map(Op::Duplicate),
        (0usize..64).prop_map(Op::Lose),
    ]
}

enum Msg {
    Req {
        from: usize,
        to: usize,
        req: Request,
    },
    Resp {
        to: usize,
        resp: Response,
    },
}

fn variant() -> impl Strategy<Value = SeVariant> {
    prop_oneof![
        Just(SeVariant::FixedAllocation),
        Just(SeVariant::TokenExchange),
        Just(SeVariant::RateExchange),
        Just(SeVariant::TokenAndRateExchange),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn rate_never_exceeds_aggregate_and_tokens_never_created(
        v in variant(),
        ops in prop::collection::vec(op(), 1..400),
        th_low in 100.0f64..2000.0,
        n_peers in 1usize..5,
        f_t in 0.5f64..3.0,
        f_r in 0.5f64..3.0,
        f_mr in 0.01f64..0.99,
        th_t in 0.0f64..2000.0,
        th_r in 0.0f64..2000.0,
        keep_used in prop::option::of(1.0f64..5000.0),
        seed in any::<u64>(),
    ) {
        const N: usize = 6;
        let r_a = 3.0;
        let p = SeParams { bucket_size: 2000.0, th_low, n_peers, f_t, th_t, f_r, th_r, f_mr, keep_used };
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut s: Vec<SeSender> = (0..N)
            .map(|i| {
                let peers = (0..N as u32).filter(|&j| j as usize != i).collect();
                SeSender::new(v, p, r_a / N as f64, peers, 0.0)
            })
            .collect();
        let mut net: Vec<Msg> = Vec::new();
        // Tokens and rate that left a sender and will never arrive.
        let mut lost_tokens = 0.0;
        let mut now = 0.0;
        for o in ops {
            match o {
                Op::Tick(d) => now += d as f64,
                Op::Send(i, n) => {
                    s[i].try_send(now, n as f64);
                    for (to, req) in s[i].maybe_ask(now, &mut rng) {
                        net.push(Msg::Req { from: i, to: to as usize, req });
                    }
                }
                Op::Ask(i) => {
                    for (to, req) in s[i].maybe_ask(now, &mut rng) {
                        net.push(Msg::Req { from: i, to: to as usize, req });
                    }
                }
                Op::Deliver(k) | Op::Duplicate(k) if !net.is_empty() => {
                    let k = k % net.len();
                    let dup = matches!(o, Op::Duplicate(_));
                    match net.swap_remove(k) {
                        Msg::Req { from, to, req } => {
                            // A duplicated request is answered twice: both answers are real
                            // gives; the requester applies at most one of them.
                            for _ in 0..(if dup { 2 } else { 1 }) {
                                let resp = s[to].on_request(now, &req);
                                net.push(Msg::Resp { to: from, resp });
                            }
                        }
                        Msg::Resp { to, resp } => {
                            let (applied, next) = s[to].on_response(now, &resp, &mut rng);
                            if !applied {
                                lost_tokens += resp.tokens;
                            }
                            for (peer, req) in next {
                                net.push(Msg::Req { from: to, to: peer as usize, req });
                            }
                            if dup {
                                // The network copied the message: the copy must be refused.
                                let (again, _) = s[to].on_response(now, &resp, &mut rng);
                                prop_assert!(!again, "a duplicated response was applied twice");
                            }
                        }
                    }
                }
                Op::Lose(k) if !net.is_empty() => {
                    let k = k % net.len();
                    match net.swap_remove(k) {
                        Msg::Req { from, req, .. } => { s[from].on_request_lost(req.id); }
                        Msg::Resp { to, resp } => {
                            // The requester times the request out; the carried rate leaks.
                            s[to].on_request_lost(resp.id);
                            lost_tokens += resp.tokens;
                        }
                    }
                }
                _ => {}
            }
            // Invariant 1: Σ R_t + rate in flight ≤ R_a.
            let in_flight_rate: f64 = net.iter().map(|m| match m { Msg::Resp { resp, .. } => resp.rate, _ => 0.0 }).sum();
            let total_rate: f64 = s.iter().map(sidecore_sikker_rate::SeSender::rate).sum::<f64>() + in_flight_rate;
            prop_assert!(total_rate <= r_a + 1e-9, "rate {} > R_a {}", total_rate, r_a);
            for x in &s { prop_assert!(x.rate() >= 0.0); prop_assert!(x.tokens() >= -1e-9); }
            // Invariant 2: tokens are only created by refill.
            let in_flight_tokens: f64 = net.iter().map(|m| match m { Msg::Resp { resp, .. } => resp.tokens, _ => 0.0 }).sum();
            let held: f64 = s.iter().map(sidecore_sikker_rate::SeSender::tokens).sum();
            let mut consumed = 0.0; let mut discarded = 0.0; let mut initial = 0.0; let mut refilled = 0.0;
            for x in &s {
                let a = x.accounting();
                consumed += a.consumed; discarded += a.discarded; initial += a.initial; refilled += x.refilled();
            }
            let out = held + consumed + discarded + in_flight_tokens + lost_tokens;
            let src = initial + refilled;
            prop_assert!((out - src).abs() < 1e-6 * src.max(1.0), "tokens out {} != in {}", out, src);
        }
    }
}
