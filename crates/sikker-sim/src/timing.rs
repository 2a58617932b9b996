//! Cycle-accurate-enough timing of short code sections: the time-stamp counter on
//! x86-64 (fenced so that it measures the section, not whatever the CPU reordered
//! around it), `Instant` elsewhere, and huge-page advice for large tables.

use std::time::{Duration, Instant};

/// A started stopwatch reading, in ticks.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `lfence` and `rdtsc` have no memory-safety preconditions; both are
        // part of x86-64's baseline (SSE2) instruction set.
        unsafe {
            std::arch::x86_64::_mm_lfence();
            let t = std::arch::x86_64::_rdtsc();
            std::arch::x86_64::_mm_lfence();
            t
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<Instant> = OnceLock::new();
        T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Nanoseconds per tick, measured against the monotonic clock over `over`.
pub fn ns_per_tick(over: Duration) -> f64 {
    let i0 = Instant::now();
    let t0 = ticks();
    while i0.elapsed() < over {
        std::hint::spin_loop();
    }
    let t1 = ticks();
    let ns = i0.elapsed().as_nanos() as f64;
    ns / (t1 - t0).max(1) as f64
}

/// Asks the kernel to back `[ptr, ptr+len)` with transparent huge pages and to
/// collapse it now (`MADV_COLLAPSE`, Linux ≥ 6.1), so that random probes of a table
/// larger than the TLB reach do not also pay a page walk. Returns the bytes advised.
pub fn advise_huge_pages(ptr: *const u8, len: usize) -> usize {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        const MADV_COLLAPSE: libc::c_int = 25;
        let start = (ptr as usize).div_ceil(HUGE) * HUGE;
        let end = (ptr as usize + len) / HUGE * HUGE;
        if end <= start {
            return 0;
        }
        // SAFETY: the range lies inside an allocation the caller owns and keeps alive;
        // MADV_HUGEPAGE and MADV_COLLAPSE only change how the kernel backs it, never
        // its contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            if libc::madvise(start as *mut libc::c_void, end - start, MADV_COLLAPSE) == 0 {
                end - start
            } else {
                0
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (ptr, len);
        0
    }
}

/// Runs `f` under the real-time FIFO scheduler (priority 50) when `enable` is set and
/// permitted, so that other work on a shared machine does not preempt a measurement,
/// then restores the normal scheduler. Returns `f`'s result and whether real-time
/// scheduling was in force. The kernel's RT throttling (5 % of each second left to
/// others by default) still bounds the effect on the rest of the machine.
pub fn with_realtime<T>(enable: bool, f: impl FnOnce() -> T) -> (T, bool) {
    #[cfg(target_os = "linux")]
    if enable {
        let p = libc::sched_param { sched_priority: 50 };
        // SAFETY: plain system calls on the calling thread (pid 0) with a valid,
        // initialised `sched_param` and CPU set; pinning keeps the thread on one
        // core's L1/L2 for the whole measurement.
        let ok = unsafe {
            let cpu = libc::sched_getcpu();
            if cpu >= 0 {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu as usize, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0
        };
        let out = f();
        if ok {
            let n = libc::sched_param { sched_priority: 0 };
            // SAFETY: as above; the full CPU set lifts the pinning.
            unsafe {
                libc::sched_setscheduler(0, libc::SCHED_OTHER, &n);
                let mut all: libc::cpu_set_t = std::mem::zeroed();
                for c in 0..libc::CPU_SETSIZE as usize {
                    libc::CPU_SET(c, &mut all);
                }
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &all);
            }
        }
        return (out, ok);
    }
    let _ = enable;
    (f(), false)
}
