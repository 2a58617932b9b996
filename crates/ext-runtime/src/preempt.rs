//! Was an overrun the handler's, or the scheduler's? An invocation's cycle
//! count includes any time the kernel kept this thread off the CPU, so on a
//! busy machine a handler can seem to overrun its admitted bound without
//! running one instruction too many. Before a suspected violation is
//! charged, the accounting reads how long this thread has waited for a CPU
//! (`/proc/thread-self/schedstat`, run-queue delay) since it last looked: if
//! that wait covers the overrun, the overrun is excused and counted apart; a
//! handler that really runs long overruns by more than it waited, and is
//! charged. The baseline is read again before any invocation that starts
//! more than [`REFRESH_NS`] after it was taken (a file read per millisecond
//! at most), so only waiting during, or just before, an invocation can
//! excuse it.

/// Age (ns) after which the baseline is read again before an invocation.
pub const REFRESH_NS: f64 = 1e6;

/// This thread's run-queue wait so far, ns (`None` without schedstat).
fn waited_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

/// The thread's run-queue wait, as last read, and when (cycle counter).
#[derive(Debug, Default)]
pub struct Preemptions {
    baseline_ns: Option<u64>,
    taken_at: u64,
}

impl Preemptions {
    /// No baseline yet: the first invocation takes one.
    pub fn new() -> Self {
        Preemptions::default()
    }

    /// Called as an invocation starts at cycle counter `now`: reads the
    /// baseline again if it is older than [`REFRESH_NS`].
    #[inline]
    pub fn before(&mut self, now: u64, ticks_per_ns: f64) {
        let age = now.wrapping_sub(self.taken_at) as f64 / ticks_per_ns;
        if self.baseline_ns.is_none() || age > REFRESH_NS {
            self.baseline_ns = waited_ns();
            self.taken_at = now;
        }
    }

    /// Whether the thread waited for a CPU at least `overrun_ns` since the
    /// baseline (which then moves on). Never excuses without schedstat.
    pub fn excuses(&mut self, overrun_ns: u64) -> bool {
        let now = waited_ns();
        let waited = match (now, self.baseline_ns) {
            (Some(n), Some(b)) => n.saturating_sub(b),
            _ => 0,
        };
        self.baseline_ns = now;
        now.is_some() && waited >= overrun_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn spin(d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn sleeping_excuses_nothing_but_waiting_for_a_shared_cpu_does() {
        let mut p = Preemptions::new();
        p.before(0, 1.0);
        std::thread::sleep(Duration::from_millis(50));
        // Had the 50 ms asleep counted as waiting, they would excuse a 50 ms
        // overrun. (Only the wake-up's own run-queue delay counts, which on a
        // loaded machine can be a few ms: no smaller bound is asserted.)
        assert!(!p.excuses(50_000_000), "a sleep is not a wait for the CPU");
        // Two spinning threads on one CPU: each waits while the other runs.
        let cpu = core_affinity::get_core_ids().and_then(|v| v.first().copied());
        let other = std::thread::spawn(move || {
            if let Some(c) = cpu {
                core_affinity::set_for_current(c);
            }
            spin(Duration::from_millis(300));
        });
        let mine = std::thread::spawn(move || {
            if let Some(c) = cpu {
                core_affinity::set_for_current(c);
            }
            let mut p = Preemptions::new();
            p.before(0, 1.0);
            spin(Duration::from_millis(300));
            // Sharing a CPU with a spinner for 300 ms means waiting for tens of
            // ms; it cannot excuse an overrun of seconds.
            (p.excuses(1_000_000), {
                spin(Duration::from_millis(100));
                p.excuses(10_000_000_000)
            })
        });
        let (small, huge) = mine.join().unwrap();
        other.join().unwrap();
        assert!(
            small,
            "300 ms sharing a CPU with a spinner, never waited 1 ms"
        );
        assert!(!huge, "an overrun longer than the wait is not excused");
    }
}
