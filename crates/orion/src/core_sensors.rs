//! The sensors behind a dedicated core's liveness, in this process.
//!
//! - **Explicit** ([`register`]): each executor thread pinned to a core (and each
//!   recovery probe, [`crate::core_monitor`]) registers a [`CoreSensor`] and bumps its
//!   `ticks` once per loop iteration — a loop that iterates at least every few
//!   milliseconds whenever the thread is given its CPU, busy or idle — and marks when
//!   it is `inside` an offcode's code (a turn or a command), where a long stay is the
//!   offcode's doing, not the core's.
//! - **Implicit**, read at fetch time without the target's help ([`read_sched`],
//!   [`read_online`]): each registered thread's `/proc/self/task/TID/schedstat` (time
//!   on the CPU, time waiting on the run queue) and the CPU's
//!   `/sys/devices/system/cpu/cpuN/online`.
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

/// A thread's scheduler accounting (`/proc/self/task/TID/schedstat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SchedStat {
    /// Time on the CPU (ns).
    pub run_ns: u64,
    /// Time runnable but waiting on a run queue (ns).
    pub wait_ns: u64,
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
    /// Its scheduler accounting (None: unreadable).
    pub sched: Option<SchedStat>,
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

/// Parses a schedstat line: `run_ns wait_ns timeslices`.
pub fn parse_schedstat(text: &str) -> Option<SchedStat> {
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    Some(SchedStat {
        run_ns: it.next()?.ok()?,
        wait_ns: it.next()?.ok()?,
    })
}

/// Thread `tid` of this process's scheduler accounting.
pub fn read_sched(tid: i32) -> Option<SchedStat> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    parse_schedstat(&text)
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
            sched: read_sched(s.tid),
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
    fn schedstat_lines_parse_and_bad_ones_do_not() {
        assert_eq!(
            parse_schedstat("54695945 8531081 202\n"),
            Some(SchedStat {
                run_ns: 54_695_945,
                wait_ns: 8_531_081
            })
        );
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("12 x 3"), None);
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
        assert!(me.sched.is_some_and(|s| s.run_ns > 0), "{me:?}");
        assert_eq!(v.online, None, "no CPU 4000 here");
        drop(g);
        assert!(!views().iter().any(|v| v.cpu == 4000));
    }
}
