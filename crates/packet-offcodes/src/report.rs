//! The traffic generator's report (issue 11 item 4) as plain arithmetic, no
//! I/O: the inter-arrival times of its departures, kept as sums so that any
//! window between two readings of its cumulative metrics gives pps, Mb/s,
//! CPU % and the inter-arrival mean and standard deviation over exactly that
//! window ([`window`]); `sidecore demo` reads them this way.

/// Inter-arrival times of departing frames, as a count, a sum and a sum of
/// squares (ns, ns²). A batch of `k` frames sent by one call departs at one
/// time: its first frame is `t - last` after the previous batch, the other
/// `k - 1` are 0 ns after it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Departures {
    n: u64,
    sum_ns: u128,
    sumsq_ns2: u128,
    last_ns: Option<u64>,
}

impl Departures {
    /// `frames` frames left at `t_ns` (a monotonic clock).
    pub fn record(&mut self, t_ns: u64, frames: u64) {
        if frames == 0 {
            return;
        }
        match self.last_ns {
            Some(last) => {
                let gap = u128::from(t_ns.saturating_sub(last));
                self.n += frames;
                self.sum_ns += gap;
                self.sumsq_ns2 += gap * gap;
            }
            // The first frame has no predecessor: only its batch mates count.
            None => self.n += frames - 1,
        }
        self.last_ns = Some(t_ns);
    }

    /// Inter-arrival times counted.
    pub fn n(&self) -> u64 {
        self.n
    }

    /// Their sum, ns (saturated to u64 for publishing).
    pub fn sum_ns(&self) -> u64 {
        u64::try_from(self.sum_ns).unwrap_or(u64::MAX)
    }

    /// The sum of their squares, ns² (saturated to u64 for publishing: a
    /// gap of a second squared is 10^18, so only long sparse runs saturate).
    pub fn sumsq_ns2(&self) -> u64 {
        u64::try_from(self.sumsq_ns2).unwrap_or(u64::MAX)
    }

    /// Mean and sample standard deviation since the start, ns.
    pub fn mean_std_ns(&self) -> (f64, f64) {
        moments(self.n, self.sum_ns as f64, self.sumsq_ns2 as f64)
    }
}

/// Mean and sample standard deviation from a count, a sum and a sum of
/// squares.
#[allow(clippy::cast_precision_loss)] // counts far below 2^53
fn moments(n: u64, sum: f64, sumsq: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let nf = n as f64;
    let mean = sum / nf;
    if n < 2 {
        return (mean, 0.0);
    }
    let var = ((sumsq - sum * sum / nf) / (nf - 1.0)).max(0.0);
    (mean, var.sqrt())
}

/// The generator's cumulative metrics at one moment, as `ps` shows them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub sent: u64,
    pub bytes: u64,
    pub cpu_ns: u64,
    pub iat_n: u64,
    pub iat_sum_ns: u64,
    pub iat_sumsq_ns2: u64,
}

impl Reading {
    /// Reads the metrics by name (missing ones are 0).
    pub fn from_metrics(get: impl Fn(&str) -> u64) -> Reading {
        Reading {
            sent: get("sent"),
            bytes: get("bytes"),
            cpu_ns: get("cpu_ns"),
            iat_n: get("iat_n"),
            iat_sum_ns: get("iat_sum_ns"),
            iat_sumsq_ns2: get("iat_sumsq_ns2"),
        }
    }
}

/// What the generator did over a window between two readings.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Window {
    pub pps: f64,
    /// Frame bits per second / 10^6 (no preamble, no FCS).
    pub mbps: f64,
    /// The sending thread's CPU time over the window, % of one CPU.
    pub cpu_pct: f64,
    pub iat_mean_ns: f64,
    pub iat_std_ns: f64,
}

/// The window from reading `a` to reading `b`, `secs` apart.
#[allow(clippy::cast_precision_loss)] // counts far below 2^53
pub fn window(a: &Reading, b: &Reading, secs: f64) -> Window {
    let secs = secs.max(1e-9);
    let d = |x: u64, y: u64| y.saturating_sub(x) as f64;
    let (iat_mean_ns, iat_std_ns) = moments(
        b.iat_n.saturating_sub(a.iat_n),
        d(a.iat_sum_ns, b.iat_sum_ns),
        d(a.iat_sumsq_ns2, b.iat_sumsq_ns2),
    );
    Window {
        pps: d(a.sent, b.sent) / secs,
        mbps: d(a.bytes, b.bytes) * 8.0 / secs / 1e6,
        cpu_pct: d(a.cpu_ns, b.cpu_ns) / (secs * 1e9) * 100.0,
        iat_mean_ns,
        iat_std_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_depart_together_and_the_moments_are_the_textbook_ones() {
        let mut d = Departures::default();
        d.record(1_000, 1); // first frame: no gap yet
        d.record(3_000, 1); // 2000
        d.record(7_000, 3); // 4000, 0, 0
        d.record(7_000, 0); // nothing sent: nothing counted
        assert_eq!(d.n(), 4);
        assert_eq!(d.sum_ns(), 6_000);
        assert_eq!(d.sumsq_ns2(), 2_000 * 2_000 + 4_000 * 4_000);
        let (mean, std) = d.mean_std_ns();
        assert!((mean - 1_500.0).abs() < 1e-9, "{mean}");
        // Sample deviation of [2000, 4000, 0, 0]: sqrt(11/3) * 1000.
        assert!(
            (std - (11.0f64 / 3.0).sqrt() * 1_000.0).abs() < 1e-6,
            "{std}"
        );
    }

    #[test]
    fn a_window_is_the_difference_of_two_readings() {
        let mut d = Departures::default();
        d.record(0, 10);
        let read = |d: &Departures, sent, cpu_ns| Reading {
            sent,
            bytes: sent * 64,
            cpu_ns,
            iat_n: d.n(),
            iat_sum_ns: d.sum_ns(),
            iat_sumsq_ns2: d.sumsq_ns2(),
        };
        let a = read(&d, 10, 1_000);
        // Then a steady stream: one frame every 1000 ns.
        for i in 1..=1000 {
            d.record(i * 1_000, 1);
        }
        let b = read(&d, 1010, 501_000);
        let w = window(&a, &b, 0.001);
        assert!((w.pps - 1_000_000.0).abs() < 1e-3, "{w:?}");
        assert!((w.mbps - 512.0).abs() < 1e-6, "{w:?}");
        assert!((w.cpu_pct - 50.0).abs() < 1e-9, "{w:?}");
        assert!((w.iat_mean_ns - 1_000.0).abs() < 1e-9, "{w:?}");
        assert!(
            w.iat_std_ns.abs() < 1e-6,
            "a steady stream has no deviation: {w:?}"
        );
        assert_eq!(window(&a, &a, 1.0).pps, 0.0);
    }
}
