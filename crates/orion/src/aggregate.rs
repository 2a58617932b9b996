//! Counter aggregates the monitor keeps between views (sans-IO): the rate of a counter
//! over a sliding window, a mean over a window of samples, and a Count-Min sketch for
//! per-key counts in bounded memory.
//!
//! Count-Min is hand-rolled: it is thirty lines, and the crates that offer it pull in
//! hashing stacks we do not need; rows use independent seeds of the std SipHash.

use serde::Serialize;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};

/// The rate of a monotone counter over the last `window_ns`, from timestamped samples.
#[derive(Debug, Clone)]
pub struct Rate {
    window_ns: u64,
    samples: VecDeque<(u64, u64)>,
}

impl Rate {
    /// A rate over `window_ns` nanoseconds (at least 1).
    pub fn new(window_ns: u64) -> Rate {
        Rate {
            window_ns: window_ns.max(1),
            samples: VecDeque::new(),
        }
    }

    /// Adds the counter's value at time `t_ns`. Samples out of time order are ignored;
    /// a counter that went backwards (restarted) starts the window afresh.
    pub fn push(&mut self, t_ns: u64, value: u64) {
        if let Some(&(lt, lv)) = self.samples.back() {
            if t_ns < lt {
                return;
            }
            if value < lv {
                self.samples.clear();
            }
        }
        self.samples.push_back((t_ns, value));
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|&(t1, _)| t_ns - t1 >= self.window_ns)
        {
            self.samples.pop_front();
        }
    }

    /// Increase per second over the window, if two samples span some time.
    pub fn per_second(&self) -> Option<f64> {
        let (&(t0, v0), &(t1, v1)) = (self.samples.front()?, self.samples.back()?);
        (t1 > t0).then(|| (v1 - v0) as f64 * 1e9 / (t1 - t0) as f64)
    }
}

/// The mean of the last `n` samples.
#[derive(Debug, Clone)]
pub struct Mean {
    n: usize,
    samples: VecDeque<f64>,
    sum: f64,
}

impl Mean {
    /// A mean over the last `n` samples (at least 1).
    pub fn new(n: usize) -> Mean {
        Mean {
            n: n.max(1),
            samples: VecDeque::new(),
            sum: 0.0,
        }
    }

    /// Adds a sample.
    pub fn push(&mut self, x: f64) {
        self.samples.push_back(x);
        self.sum += x;
        if self.samples.len() > self.n
            && let Some(old) = self.samples.pop_front()
        {
            self.sum -= old;
        }
    }

    /// The mean, if any sample was added.
    pub fn mean(&self) -> Option<f64> {
        // Recomputed rather than from `sum` to keep floating-point drift out.
        (!self.samples.is_empty())
            .then(|| self.samples.iter().sum::<f64>() / self.samples.len() as f64)
    }

    /// The running sum (may drift by rounding; for cheap display).
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// A Count-Min sketch: estimates never fall below the true count, and exceed it by at
/// most ε·N with probability 1 − δ for width ⌈e/ε⌉ and depth ⌈ln 1/δ⌉.
#[derive(Debug, Clone, Serialize)]
pub struct CountMin {
    width: usize,
    depth: usize,
    rows: Vec<u64>,
    total: u64,
    #[serde(skip)]
    seeds: Vec<std::hash::RandomState>,
}

impl CountMin {
    /// A sketch of `depth` rows of `width` counters (each at least 1).
    pub fn new(width: usize, depth: usize) -> CountMin {
        let (width, depth) = (width.max(1), depth.max(1));
        CountMin {
            width,
            depth,
            rows: vec![0; width * depth],
            total: 0,
            seeds: (0..depth).map(|_| std::hash::RandomState::new()).collect(),
        }
    }

    fn index(&self, row: usize, key: &impl Hash) -> usize {
        row * self.width + (self.seeds[row].hash_one(key) % self.width as u64) as usize
    }

    /// Adds `n` to `key`'s count.
    pub fn add(&mut self, key: &impl Hash, n: u64) {
        for row in 0..self.depth {
            let i = self.index(row, key);
            self.rows[i] = self.rows[i].saturating_add(n);
        }
        self.total = self.total.saturating_add(n);
    }

    /// The estimate of `key`'s count.
    pub fn estimate(&self, key: &impl Hash) -> u64 {
        (0..self.depth)
            .map(|row| self.rows[self.index(row, key)])
            .min()
            .unwrap_or(0)
    }

    /// Everything added.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn rate_of_a_steady_counter() {
        let mut r = Rate::new(1_000_000_000);
        for i in 0..50u64 {
            r.push(i * 100_000_000, i * 10);
        }
        let v = r.per_second().unwrap();
        assert!((v - 100.0).abs() < 1e-9, "{v}");
        r.push(5_000_000_000, 3); // restart
        assert_eq!(r.per_second(), None);
    }

    #[test]
    fn mean_over_a_window() {
        let mut m = Mean::new(3);
        assert_eq!(m.mean(), None);
        for x in [1.0, 2.0, 3.0, 10.0] {
            m.push(x);
        }
        assert_eq!(m.mean(), Some(5.0));
    }

    proptest! {
        #[test]
        fn count_min_never_underestimates_and_stays_within_its_bound(
            keys in proptest::collection::vec(0u32..200, 1..2000)
        ) {
            let mut cm = CountMin::new(272, 5); // ε = e/272 ≈ 0.01, δ ≈ e^-5
            let mut truth: HashMap<u32, u64> = HashMap::new();
            for k in &keys {
                cm.add(k, 1);
                *truth.entry(*k).or_default() += 1;
            }
            let n = keys.len() as u64;
            let mut over = 0;
            for (k, c) in &truth {
                let e = cm.estimate(k);
                prop_assert!(e >= *c);
                if e > c + n / 100 + 1 { over += 1; }
            }
            // With δ ≈ 0.7 %, more than a few keys over the bound would be a bug.
            prop_assert!(over <= 1 + truth.len() / 20, "{} of {} keys over", over, truth.len());
        }

        #[test]
        fn rate_is_exact_for_linear_counters(step in 1u64..1000, dt in 1u64..1_000_000, n in 2usize..100) {
            let mut r = Rate::new(u64::MAX);
            for i in 0..n as u64 { r.push(i * dt, i * step); }
            let v = r.per_second().unwrap();
            let want = step as f64 * 1e9 / dt as f64;
            prop_assert!((v - want).abs() <= want * 1e-9);
        }
    }
}
