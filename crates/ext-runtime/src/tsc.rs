//! Cycle counter: the timestamp reads of per-invocation accounting (thesis §3.3: two
//! reads per invocation). On x86-64 this is `rdtsc`; elsewhere a monotonic clock scaled to "cycles"
//! of 1 ns.

use std::time::{Duration, Instant};

/// Reads the cycle counter (unfenced: the accounting read around a guest call does not
/// need instruction-level precision, and a fence costs more than the read).
#[inline(always)]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` has no memory-safety preconditions and exists on every x86-64 CPU.
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Measures counter ticks per nanosecond over `dur` of wall time.
pub fn ticks_per_ns(dur: Duration) -> f64 {
    let t0 = Instant::now();
    let c0 = now();
    while t0.elapsed() < dur {
        std::hint::spin_loop();
    }
    let c1 = now();
    let ns = t0.elapsed().as_nanos() as f64;
    ((c1 - c0) as f64 / ns).max(1e-3)
}

static CACHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Records a measured ticks-per-ns figure for later `ticks_per_ns_cached` calls.
pub fn set_ticks_per_ns(v: f64) {
    CACHED.store(v.to_bits(), std::sync::atomic::Ordering::Relaxed);
}

/// Ticks per ns, measured once (20 ms) on first use.
pub fn ticks_per_ns_cached() -> f64 {
    let b = CACHED.load(std::sync::atomic::Ordering::Relaxed);
    if b != 0 {
        return f64::from_bits(b);
    }
    let v = ticks_per_ns(Duration::from_millis(20));
    set_ticks_per_ns(v);
    v
}
