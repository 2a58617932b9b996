//! Sikker's distributed rate control (dissertation ch. 5) as sans-IO state machines.
//!
//! Six algorithms enforce a unidirectional aggregate rate limit `R_a` from a source
//! service to a destination service:
//!
//! | algorithm | module / type | what runs where |
//! |---|---|---|
//! | NE (§5.1) | none needed | nothing is enforced |
//! | RE (§5.2) | [`relay`] | `N_r = ceil(R_a/R_r)` relays, each a token bucket at `R_a/N_r` |
//! | SE-FA (§5.3) | [`SeSender`] with [`SeVariant::FixedAllocation`] | one bucket per source process at a fixed share |
//! | SE-TE (§5.4) | [`SeSender`] with [`SeVariant::TokenExchange`] | buckets ask peers for tokens (Eq. 5.3, 5.4) |
//! | SE-RE (§5.5) | [`SeSender`] with [`SeVariant::RateExchange`] | buckets ask peers for rate (Eq. 5.5, 5.6) |
//! | SE-TRE (§5.6) | [`SeSender`] with [`SeVariant::TokenAndRateExchange`] | both, in the same messages |
//!
//! [`RateFsm`] wraps all six behind one set of calls (`on_send`, `on_request`,
//! `on_response`, `on_credit`), the per-destination `RateFSM` of §6.2.6.
//!
//! Nothing here owns a thread, a clock or a socket: every entry point takes the current
//! time `now` (any monotonic unit; RateSim uses cycles of 1 ns) and returns the messages
//! to send. Units follow the dissertation: one token is one phit, rates are normalised
//! so that `1.0` is the line rate (one phit per time unit).
//!
//! The formulas are exactly those of chapter 5 ([`formulas`]). Where chapter 5 does not
//! say how a step works (Fig. 5.7 is missing from the text), this crate follows the
//! reconstruction in the Sikker digest (§4.3 of the digest); each such choice is marked
//! **[A]** in the documentation of the item that makes it, and nothing else is assumed.

pub mod formulas;
mod fsm;
pub mod relay;
mod se;

pub use fsm::{Decision, RateFsm};
pub use se::{Request, Response, SeAccounting, SeParams, SeSender, SeVariant};

/// The six rate-control algorithms of chapter 5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Algorithm {
    /// Nothing Enforced (§5.1).
    Ne,
    /// Relay Enforced (§5.2).
    Re,
    /// Sender-Enforced, Fixed Allocation (§5.3).
    SeFa,
    /// Sender-Enforced, Token Exchange (§5.4).
    SeTe,
    /// Sender-Enforced, Rate Exchange (§5.5).
    SeRe,
    /// Sender-Enforced, Token and Rate Exchange (§5.6).
    SeTre,
}

impl Algorithm {
    /// All six, in the order of Table 8.1.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Ne,
        Algorithm::Re,
        Algorithm::SeFa,
        Algorithm::SeTe,
        Algorithm::SeRe,
        Algorithm::SeTre,
    ];

    /// The name used in the dissertation.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ne => "NE",
            Algorithm::Re => "RE",
            Algorithm::SeFa => "SE-FA",
            Algorithm::SeTe => "SE-TE",
            Algorithm::SeRe => "SE-RE",
            Algorithm::SeTre => "SE-TRE",
        }
    }

    /// The section of chapter 5 that defines it.
    pub fn section(self) -> &'static str {
        match self {
            Algorithm::Ne => "5.1",
            Algorithm::Re => "5.2",
            Algorithm::SeFa => "5.3",
            Algorithm::SeTe => "5.4",
            Algorithm::SeRe => "5.5",
            Algorithm::SeTre => "5.6",
        }
    }

    /// Whether the algorithm guarantees the aggregate limit (Table 8.1 "Correct").
    pub fn correct(self) -> bool {
        !matches!(self, Algorithm::Ne)
    }

    /// The sender-enforced variant, for the four SE algorithms.
    pub fn se_variant(self) -> Option<SeVariant> {
        match self {
            Algorithm::SeFa => Some(SeVariant::FixedAllocation),
            Algorithm::SeTe => Some(SeVariant::TokenExchange),
            Algorithm::SeRe => Some(SeVariant::RateExchange),
            Algorithm::SeTre => Some(SeVariant::TokenAndRateExchange),
            _ => None,
        }
    }

    /// Parses a dissertation name (`se-tre`, `SE-TRE`, `setre` ...).
    pub fn parse(s: &str) -> Option<Algorithm> {
        let k: String = s
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect::<String>()
            .to_ascii_lowercase();
        Some(match k.as_str() {
            "ne" => Algorithm::Ne,
            "re" => Algorithm::Re,
            "sefa" => Algorithm::SeFa,
            "sete" => Algorithm::SeTe,
            "sere" => Algorithm::SeRe,
            "setre" => Algorithm::SeTre,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Rounding tolerance of token comparisons, in tokens.
pub const EPSILON: f64 = 1e-7;

/// A plain token bucket (Fig. 5.1): size `S_b`, fill rate `R_t`, overflow discarded.
///
/// Tokens are `f64` so that fractional fill rates (e.g. `R_a/N_src = 0.5` phit per
/// cycle) accumulate exactly enough over time.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    /// `S_b`.
    pub size: f64,
    /// `R_t`, tokens per time unit.
    pub rate: f64,
    /// `N_t`.
    pub tokens: f64,
    /// Time of the last refill.
    pub t_last: f64,
    /// Tokens added by refill since creation (after overflow was discarded).
    pub refilled: f64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(size: f64, rate: f64, now: f64) -> Self {
        TokenBucket {
            size,
            rate,
            tokens: size,
            t_last: now,
            refilled: 0.0,
        }
    }

    /// Adds `rate × elapsed` tokens, discarding overflow. Time never runs backwards:
    /// an earlier `now` is ignored.
    pub fn refill(&mut self, now: f64) {
        if now > self.t_last {
            let before = self.tokens;
            self.tokens = (self.tokens + self.rate * (now - self.t_last)).min(self.size);
            if self.tokens > before {
                self.refilled += self.tokens - before;
            }
            self.t_last = now;
        }
    }

    /// Takes `n` tokens if the bucket holds them (to within [`EPSILON`], so that a
    /// wake-up computed by [`TokenBucket::ready_at`] always succeeds despite rounding;
    /// the level never goes below zero).
    pub fn try_take(&mut self, now: f64, n: f64) -> bool {
        self.refill(now);
        if self.tokens + EPSILON >= n {
            self.tokens = (self.tokens - n).max(0.0);
            true
        } else {
            false
        }
    }

    /// The earliest time at which the bucket holds `n` tokens at the current rate,
    /// or `None` if it never will (rate zero, or `n` larger than the bucket).
    pub fn ready_at(&self, now: f64, n: f64) -> Option<f64> {
        let have = (self.tokens + self.rate * (now - self.t_last).max(0.0)).min(self.size);
        if have + EPSILON >= n {
            Some(now)
        } else if self.rate <= 0.0 || n > self.size {
            None
        } else {
            Some(now + (n - have) / self.rate)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_discards_overflow_and_counts_refill() {
        let mut b = TokenBucket::new(100.0, 0.5, 0.0);
        assert!(b.try_take(0.0, 80.0));
        assert_eq!(b.tokens, 20.0);
        b.refill(100.0);
        assert_eq!(b.tokens, 70.0);
        b.refill(1000.0);
        assert_eq!(b.tokens, 100.0);
        assert_eq!(b.refilled, 80.0);
        assert!(!b.try_take(1000.0, 101.0));
        assert_eq!(b.ready_at(1000.0, 101.0), None);
    }

    #[test]
    fn bucket_ready_at_is_exact() {
        let mut b = TokenBucket::new(100.0, 0.5, 0.0);
        assert!(b.try_take(0.0, 100.0));
        assert_eq!(b.ready_at(0.0, 10.0), Some(20.0));
        b.rate = 0.0;
        assert_eq!(b.ready_at(0.0, 10.0), None);
    }

    #[test]
    fn parse_names() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.name()), Some(a));
        }
        assert_eq!(Algorithm::parse("se_tre"), Some(Algorithm::SeTre));
        assert_eq!(Algorithm::parse("bogus"), None);
    }
}
