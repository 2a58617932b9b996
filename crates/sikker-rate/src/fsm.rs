//! One entry point for all six algorithms: the `RateFSM` a sender's NMU keeps per
//! destination service (§6.2.6), so that a data path can hold any algorithm behind
//! the same calls.

use rand::Rng;

use crate::algorithm::Algorithm;
use crate::relay::{Credits, ReParams};
use crate::se::{Request, Response, SeParams, SeSender};

/// What to do with the packet at the head of the sender's queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    /// Send it now, directly to its destination.
    Send,
    /// Send it now through this relay (RE).
    SendVia(u32),
    /// Keep it queued; try again at this time, or when a message arrives (`None`).
    Wait(Option<f64>),
}

/// A sender's rate-control state for one destination service.
#[derive(Clone, Debug)]
pub enum RateFsm {
    /// NE: nothing enforced.
    Ne,
    /// RE: pick a relay per packet, within the credits.
    Re {
        /// Relays `N_r`.
        relays: u32,
        /// Credits towards them.
        credits: Credits,
    },
    /// SE-FA, SE-TE, SE-RE, SE-TRE (boxed: far larger than the other two).
    Se(Box<SeSender>),
}

impl RateFsm {
    /// The state for `alg`, for a source service of `n_src` processes sharing `R_a`
    /// equally **[A]**, with `peers` as the PeerSet.
    pub fn new(
        alg: Algorithm,
        se: SeParams,
        re: ReParams,
        n_src: usize,
        peers: Vec<u32>,
        now: f64,
    ) -> Self {
        match alg {
            Algorithm::Ne => RateFsm::Ne,
            Algorithm::Re => RateFsm::Re {
                relays: re.relays() as u32,
                credits: Credits::new(re.credits),
            },
            _ => {
                let v = alg.se_variant().expect("SE algorithm");
                let rate = re.r_a / n_src.max(1) as f64;
                RateFsm::Se(Box::new(SeSender::new(v, se, rate, peers, now)))
            }
        }
    }

    /// Decides on a packet of `size` tokens at `now`, consuming tokens or a credit if
    /// it may go. Requests to send to peers, if any, are appended to `out`.
    pub fn on_send<R: Rng + ?Sized>(
        &mut self,
        now: f64,
        size: f64,
        rng: &mut R,
        out: &mut Vec<(u32, Request)>,
    ) -> Decision {
        match self {
            RateFsm::Ne => Decision::Send,
            RateFsm::Re { relays, credits } => {
                if credits.try_take() {
                    Decision::SendVia(rng.random_range(0..*relays))
                } else {
                    Decision::Wait(None)
                }
            }
            RateFsm::Se(s) => {
                let d = if s.try_send(now, size) {
                    Decision::Send
                } else {
                    Decision::Wait(s.ready_at(now, size))
                };
                out.extend(s.maybe_ask(now, rng));
                d
            }
        }
    }

    /// A peer's request (SE only; others answer nothing).
    pub fn on_request(&mut self, now: f64, req: &Request) -> Option<Response> {
        match self {
            RateFsm::Se(s) => Some(s.on_request(now, req)),
            _ => None,
        }
    }

    /// A peer's response (SE) — applied at most once; the next serial round, if any,
    /// is appended to `out`.
    pub fn on_response<R: Rng + ?Sized>(
        &mut self,
        now: f64,
        resp: &Response,
        rng: &mut R,
        out: &mut Vec<(u32, Request)>,
    ) -> bool {
        match self {
            RateFsm::Se(s) => {
                let (applied, next) = s.on_response(now, resp, rng);
                out.extend(next);
                applied
            }
            _ => false,
        }
    }

    /// A relay returned a credit (RE).
    pub fn on_credit(&mut self) -> bool {
        match self {
            RateFsm::Re { credits, .. } => credits.on_return(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn re() -> ReParams {
        ReParams {
            r_a: 4.0,
            r_r: 1.0,
            bucket_size: 100.0,
            credits: Some(1),
        }
    }

    #[test]
    fn each_algorithm_decides() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut out = Vec::new();
        let se = SeParams::tuned(100.0);
        let mut ne = RateFsm::new(Algorithm::Ne, se, re(), 4, vec![], 0.0);
        assert_eq!(ne.on_send(0.0, 1e9, &mut rng, &mut out), Decision::Send);
        let mut r = RateFsm::new(Algorithm::Re, se, re(), 4, vec![], 0.0);
        assert!(matches!(r.on_send(0.0, 10.0, &mut rng, &mut out), Decision::SendVia(x) if x < 4));
        assert_eq!(
            r.on_send(0.0, 10.0, &mut rng, &mut out),
            Decision::Wait(None)
        );
        assert!(r.on_credit());
        assert!(matches!(
            r.on_send(0.0, 10.0, &mut rng, &mut out),
            Decision::SendVia(_)
        ));
        let mut fa = RateFsm::new(Algorithm::SeFa, se, re(), 4, vec![1, 2], 0.0);
        assert_eq!(fa.on_send(0.0, 100.0, &mut rng, &mut out), Decision::Send);
        // R_t = 4/4 = 1 token per time unit: 50 tokens take 50.
        assert_eq!(
            fa.on_send(0.0, 50.0, &mut rng, &mut out),
            Decision::Wait(Some(50.0))
        );
        assert!(out.is_empty(), "SE-FA never asks");
        let mut tre = RateFsm::new(Algorithm::SeTre, se, re(), 4, vec![1, 2, 3], 0.0);
        assert_eq!(tre.on_send(0.0, 90.0, &mut rng, &mut out), Decision::Send);
        assert_eq!(
            out.len(),
            3,
            "below Th_low: asks N_peers = 4, capped by the 3 peers"
        );
        let resp = Response {
            id: out[0].1.id,
            tokens: 30.0,
            rate: 0.1,
        };
        let mut more = Vec::new();
        assert!(tre.on_response(0.0, &resp, &mut rng, &mut more));
        assert!(
            !tre.on_response(0.0, &resp, &mut rng, &mut more),
            "applied once"
        );
    }
}
