//! The monitor of this process's dedicated cores: a thread of its own (not pinned, so
//! the kernel runs it on whichever CPU still runs ordinary threads) that fetches a view
//! of every core with a registered executor each refresh ([`crate::core_sensors`]),
//! judges them ([`crate::core_watch`]) and posts what it declares — `core:N` dead or
//! recovered, with the evidence — on the process's [`health`] board, where the daemon
//! hears it and re-places the core's offcodes, as for a dead peer node.
//!
//! A dead core's executors leave with their apps, so the monitor keeps a *probe* on
//! it: a thread pinned to that CPU that ticks every millisecond, whose steady progress
//! is the core's recovery. The probe is let go (not joined: a starved thread ends when
//! the CPU next runs it) once the core recovers or the monitor stops.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::core_sensors;
use crate::core_watch::{CoreNote, CoreWatch};
use crate::detect::LivenessConfig;
use crate::error::OrionError;
use crate::health::{self, Declaration};

/// How often a probe ticks.
const PROBE_TICK: Duration = Duration::from_millis(1);
/// How often a probe that could not pin itself (its CPU offline) tries again.
const PROBE_RETRY: Duration = Duration::from_millis(100);
/// The longest the monitor sleeps before looking at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// The PE id of CPU `cpu`'s dedicated core, as the runtime's inventory names it.
pub fn core_pe(cpu: u32) -> String {
    format!("core:{cpu}")
}

/// What the monitor is told of every note (declarations also go to the board).
pub type NoteSink = Box<dyn Fn(&CoreNote) + Send>;

/// The running monitor; dropping it stops it.
pub struct CoreMonitor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CoreMonitor {
    /// Starts watching this process's cores, judging by `cfg`; declarations are
    /// signed `by`, and every note is also handed to `on_note`.
    pub fn start(cfg: LivenessConfig, by: &str, on_note: NoteSink) -> Result<Self, OrionError> {
        let watch = CoreWatch::new(cfg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let by = by.to_owned();
        let thread = std::thread::Builder::new()
            .name("sc-core-watch".into())
            .spawn(move || run(watch, &by, &st, &on_note))
            .map_err(|e| OrionError::Config {
                what: "core watch".to_owned(),
                why: format!("cannot start its thread: {e}"),
            })?;
        Ok(CoreMonitor {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for CoreMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The monitor thread: refreshes until stopped, each at least a period after the
/// last (never two in quick succession after a late one, which would judge `k`
/// views over less than `k` periods).
fn run(mut watch: CoreWatch, by: &str, stop: &AtomicBool, on_note: &NoteSink) {
    let refresh = Duration::from_nanos(watch.config().refresh_ns);
    let epoch = Instant::now();
    let mut next = epoch;
    let mut probes: BTreeMap<u32, Probe> = BTreeMap::new();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(STOP_POLL));
            continue;
        }
        next = now + refresh;
        let now_ns = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        for n in watch.refresh(now_ns, &core_sensors::views()) {
            post(by, &n);
            on_note(&n);
        }
        let dead = watch.dead();
        probes.retain(|cpu, _| dead.contains(cpu));
        for cpu in dead {
            if let std::collections::btree_map::Entry::Vacant(e) = probes.entry(cpu)
                && let Some(p) = Probe::start(cpu)
            {
                e.insert(p);
            }
        }
    }
}

/// Posts a declaration on the health board.
fn post(by: &str, note: &CoreNote) {
    let (cpu, dead, evidence) = match note {
        CoreNote::Declared { cpu, evidence } => (*cpu, true, evidence),
        CoreNote::Recovered { cpu, evidence } => (*cpu, false, evidence),
        CoreNote::Stuck { .. } => return,
    };
    health::declare(Declaration {
        pe: core_pe(cpu),
        by: by.to_owned(),
        dead,
        evidence: evidence.clone(),
    });
}

/// A thread pinned to a dead core that ticks while the CPU runs it.
struct Probe {
    stop: Arc<AtomicBool>,
}

impl Probe {
    fn start(cpu: u32) -> Option<Probe> {
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        std::thread::Builder::new()
            .name(format!("sc-probe-{cpu}"))
            .spawn(move || {
                let mut sensor: Option<core_sensors::SensorGuard> = None;
                while !st.load(Ordering::Acquire) {
                    match &sensor {
                        Some(s) => {
                            s.tick();
                            std::thread::sleep(PROBE_TICK);
                        }
                        None if pin(cpu) => sensor = Some(core_sensors::register(cpu)),
                        None => std::thread::sleep(PROBE_RETRY),
                    }
                }
            })
            .ok()?;
        Some(Probe { stop })
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Pins the calling thread to `cpu`; false when the kernel refuses (an offline CPU).
fn pin(cpu: u32) -> bool {
    sidecore_pe::cores::pin_current_thread(cpu).is_ok()
}
