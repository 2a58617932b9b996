//! Relay Enforced (RE, §5.2): relays with fixed token buckets, and the optional
//! credit-based flow control from senders to relays.

use crate::bucket::TokenBucket;
use crate::formulas;

/// RE configuration.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReParams {
    /// `R_a`, the aggregate limit.
    pub r_a: f64,
    /// `R_r`, the rate capability of one relay.
    pub r_r: f64,
    /// `S_b` of each relay's bucket.
    pub bucket_size: f64,
    /// `N_o`, the credits of one sender (outstanding messages it may have at relays);
    /// `None` disables credit flow control. **[A]** the dissertation says both "per
    /// sender" (§5.2) and "per relay" (Table 5.1); sidecore counts per sender.
    pub credits: Option<u32>,
}

impl ReParams {
    /// `N_r` (Eq. 5.1).
    pub fn relays(&self) -> usize {
        formulas::relay_count(self.r_a, self.r_r)
    }

    /// Each relay's `R_t` (Eq. 5.2).
    pub fn relay_rate(&self) -> f64 {
        formulas::relay_rate(self.r_a, self.relays())
    }
}

/// One relay: a token bucket at the fixed rate `R_a/N_r`.
#[derive(Clone, Debug)]
pub struct Relay {
    bucket: TokenBucket,
}

impl Relay {
    /// A relay with a full bucket.
    pub fn new(p: &ReParams, now: f64) -> Self {
        Relay {
            bucket: TokenBucket::new(p.bucket_size, p.relay_rate(), now),
        }
    }

    /// Forwards a packet of `size` tokens if the bucket covers it.
    pub fn try_forward(&mut self, now: f64, size: f64) -> bool {
        self.bucket.try_take(now, size)
    }

    /// When a packet of `size` tokens could be forwarded.
    pub fn ready_at(&self, now: f64, size: f64) -> Option<f64> {
        self.bucket.ready_at(now, size)
    }

    /// The relay's fill rate.
    pub fn rate(&self) -> f64 {
        self.bucket.rate
    }
}

/// A sender's credits towards the relays.
#[derive(Clone, Debug)]
pub struct Credits {
    limit: Option<u32>,
    outstanding: u32,
}

impl Credits {
    /// `limit = None` means unlimited.
    pub fn new(limit: Option<u32>) -> Self {
        Credits {
            limit,
            outstanding: 0,
        }
    }

    /// Takes a credit to send one message to a relay.
    pub fn try_take(&mut self) -> bool {
        match self.limit {
            Some(l) if self.outstanding >= l => false,
            _ => {
                self.outstanding += 1;
                true
            }
        }
    }

    /// A credit came back from a relay. A return without an outstanding credit (a
    /// duplicate) is ignored and reported as `false`.
    pub fn on_return(&mut self) -> bool {
        if self.outstanding == 0 {
            return false;
        }
        self.outstanding -= 1;
        true
    }

    /// Messages now outstanding.
    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relays_split_the_aggregate() {
        let p = ReParams {
            r_a: 500.0,
            r_r: 1.0,
            bucket_size: 2000.0,
            credits: Some(4),
        };
        assert_eq!(p.relays(), 500);
        assert_eq!(p.relay_rate(), 1.0);
        let mut r = Relay::new(&p, 0.0);
        assert!(r.try_forward(0.0, 2000.0));
        assert!(!r.try_forward(0.0, 1.0));
        assert_eq!(r.ready_at(0.0, 82.0), Some(82.0));
    }

    #[test]
    fn credits_cap_outstanding_and_ignore_duplicates() {
        let mut c = Credits::new(Some(2));
        assert!(c.try_take());
        assert!(c.try_take());
        assert!(!c.try_take());
        assert!(c.on_return());
        assert!(c.try_take());
        assert!(c.on_return());
        assert!(c.on_return());
        assert!(!c.on_return());
        assert_eq!(c.outstanding(), 0);
        let mut u = Credits::new(None);
        for _ in 0..1000 {
            assert!(u.try_take());
        }
    }
}
