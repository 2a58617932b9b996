//! The token bucket of Fig. 5.1 that every enforcing algorithm is built from.

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
}
