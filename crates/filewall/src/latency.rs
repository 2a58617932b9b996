//! Call-to-reply latency per NFS/MOUNT operation, as a histogram with fixed
//! bounds (the Prometheus `_bucket`/`_sum`/`_count` shape): what the proxy
//! adds and the server takes, seen from the middlebox.

use std::time::Duration;

/// Upper bounds of the buckets in microseconds; one more bucket holds the rest.
pub const BOUNDS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];

/// Counts per bucket (not cumulative), the sum and the count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// `BOUNDS_US.len() + 1` entries; the last is above every bound.
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
    pub count: u64,
}

impl LatencyHistogram {
    /// Adds one observation.
    pub fn observe(&mut self, d: Duration) {
        if self.buckets.len() != BOUNDS_US.len() + 1 {
            self.buckets = vec![0; BOUNDS_US.len() + 1];
        }
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BOUNDS_US.partition_point(|&b| b < us);
        self.buckets[i] += 1;
        self.sum_ns = self
            .sum_ns
            .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        self.count += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket() {
        let mut h = LatencyHistogram::default();
        h.observe(Duration::from_micros(50)); // on a bound: that bucket
        h.observe(Duration::from_micros(51));
        h.observe(Duration::from_secs(3)); // above every bound
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[1], 1);
        assert_eq!(h.buckets[BOUNDS_US.len()], 1);
        assert_eq!(h.count, 3);
        assert_eq!(h.sum_ns, 50_000 + 51_000 + 3_000_000_000);
    }
}
