//! The sensors behind a dedicated core's liveness, in this process.
//!
//! - **Explicit** ([`register`]): each executor thread pinned to a core (and each
//!   recovery probe, [`crate::core_monitor`]) registers a [`CoreSensor`] and bumps its
//!   `ticks` once per loop iteration — a loop that iterates at least every few
//!   milliseconds whenever the thread is given its CPU, busy or idle — and marks when
//!   it is `inside` an offcode's code (a turn or a command), where a long stay is the
//!   offcode's doing, not the core's.
//! - **Implicit**, read at fetch time without the target's help ([`read_run_ns`],
//!   [`read_runnable`], [`read_online`]): each registered thread's CPU time (its
//!   thread CPU-time clock, exact even between scheduler ticks), whether it is
//!   runnable (`R` in `/proc/self/task/TID/stat`: on a CPU or waiting for one), and the
//!   CPU's `/sys/devices/system/cpu/cpuN/online`. (`schedstat`'s run-queue wait is no
//!   use here: the kernel adds a wait to it only once the wait ends.)
//!
//! [`views`] gathers both into one [`CoreView`] per core, for the sans-IO judgement of
//! [`crate::core_watch`]. The registry is process-wide, like the health board: the
//! runtime's executors register without a handle to the monitor that reads them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;

/// One thread's explicit liveness sensor.
#[derive(Debug)]
pub struct CoreSensor {
    cpu: u32,
    tid: i32,
    ticks: AtomicU64,
    inside: AtomicBool,
}

impl CoreSensor {
    /// The CPU the thread is pinned to.
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    /// One iteration of the thread's loop.
    #[inline]
    pub fn tick(&self) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
    }

    /// The thread enters (`true`) or leaves (`false`) an offcode's code.
    #[inline]
    pub fn inside(&self, yes: bool) {
        self.inside.store(yes, Ordering::Relaxed);
    }
}

/// A registration; dropping it removes the sensor.
#[derive(Debug)]
pub struct SensorGuard(Arc<CoreSensor>);

impl std::ops::Deref for SensorGuard {
    type Target = CoreSensor;
    fn deref(&self) -> &CoreSensor {
        &self.0
    }
}

impl Drop for SensorGuard {
    fn drop(&mut self) {
        registry().retain(|s| !Arc::ptr_eq(s, &self.0));
    }
}

fn registry() -> std::sync::MutexGuard<'static, Vec<Arc<CoreSensor>>> {
    static SENSORS: OnceLock<Mutex<Vec<Arc<CoreSensor>>>> = OnceLock::new();
    SENSORS
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The calling thread's id.
pub fn current_tid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// Registers the calling thread, pinned to `cpu`, as one that keeps core `cpu` busy.
pub fn register(cpu: u32) -> SensorGuard {
    let s = Arc::new(CoreSensor {
        cpu,
        tid: current_tid(),
        ticks: AtomicU64::new(0),
        inside: AtomicBool::new(false),
    });
    registry().push(Arc::clone(&s));
    SensorGuard(s)
}

/// One thread as seen at one fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ThreadSample {
    /// Its thread id.
    pub tid: i32,
    /// Loop iterations so far.
    pub ticks: u64,
    /// In an offcode's code at the fetch.
    pub inside: bool,
    /// Its CPU time so far (ns; None: unreadable).
    pub run_ns: Option<u64>,
    /// Runnable: on a CPU or waiting for one (None: unreadable).
    pub runnable: Option<bool>,
}

/// One core at one fetch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CoreView {
    /// The CPU.
    pub cpu: u32,
    /// `cpuN/online` (None: the file is absent, as for a CPU that cannot go offline).
    pub online: Option<bool>,
    /// The registered threads pinned to it.
    pub threads: Vec<ThreadSample>,
}

/// The state letter of a `/proc/.../stat` line (the field after the parenthesised
/// command, which may itself hold spaces and parentheses).
pub fn parse_stat_state(text: &str) -> Option<char> {
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// Whether thread `tid` of this process is runnable (state `R`).
pub fn read_runnable(tid: i32) -> Option<bool> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    parse_stat_state(&text).map(|c| c == 'R')
}

/// Thread `tid`'s CPU time (ns), from its thread CPU-time clock.
pub fn read_run_ns(tid: i32) -> Option<u64> {
    // The kernel's clock id of a thread's CPU time: the complement of its tid shifted
    // left by 3, with CPUCLOCK_PERTHREAD (4) and CPUCLOCK_SCHED (2) set — the id
    // `pthread_getcpuclockid` returns, which needs a pthread_t rather than a tid.
    let clock = (!tid << 3) | 6;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; an id naming no thread of this
    // process makes clock_gettime fail with EINVAL, which is returned as None.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    Some(secs * 1_000_000_000 + nanos)
}

/// Whether `cpu` is online; None when the kernel offers no `online` file for it.
pub fn read_online(cpu: u32) -> Option<bool> {
    let text = std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/online")).ok()?;
    Some(text.trim() != "0")
}

/// One view per core with a registered thread, read now.
pub fn views() -> Vec<CoreView> {
    let sensors: Vec<Arc<CoreSensor>> = registry().clone();
    let mut by_cpu: BTreeMap<u32, Vec<ThreadSample>> = BTreeMap::new();
    for s in sensors {
        // The counter first: a schedstat read after it can only show more progress.
        let ticks = s.ticks.load(Ordering::Relaxed);
        let inside = s.inside.load(Ordering::Relaxed);
        by_cpu.entry(s.cpu).or_default().push(ThreadSample {
            tid: s.tid,
            ticks,
            inside,
            run_ns: read_run_ns(s.tid),
            runnable: read_runnable(s.tid),
        });
    }
    by_cpu
        .into_iter()
        .map(|(cpu, threads)| CoreView {
            cpu,
            online: read_online(cpu),
            threads,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_states_parse_and_bad_lines_do_not() {
        assert_eq!(parse_stat_state("42 (sc-core:1) R 1 42 42"), Some('R'));
        assert_eq!(parse_stat_state("42 (a) b) (c) S 1"), Some('S'));
        assert_eq!(parse_stat_state("42 (sc"), None);
        assert_eq!(parse_stat_state("42 (x)"), None);
    }

    #[test]
    fn a_registered_thread_is_seen_and_leaves_when_dropped() {
        let g = register(4000);
        g.tick();
        g.tick();
        g.inside(true);
        let v = views().into_iter().find(|v| v.cpu == 4000).unwrap();
        let me = v.threads.iter().find(|t| t.tid == current_tid()).unwrap();
        assert_eq!((me.ticks, me.inside), (2, true));
        assert!(me.run_ns.is_some_and(|n| n > 0), "{me:?}");
        assert_eq!(me.runnable, Some(true), "this thread is running");
        assert_eq!(read_run_ns(-5), None, "no such thread");
        assert_eq!(v.online, None, "no CPU 4000 here");
        drop(g);
        assert!(!views().iter().any(|v| v.cpu == 4000));
    }
}
