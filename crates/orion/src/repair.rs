//! The healer: watches one cgroup v2 subtree from outside, keeps its shadow process
//! tree from the kernel's fork/exec/exit events (eBPF, [`sidecore_kernel::orion_sched`])
//! reconciled with the cgroup's member list, or from /proc scans where the kernel
//! refuses the programs ([`TreeSource`] says which, and why), and repairs fork bombs (freeze → walk → kill the culprit's
//! subtree → thaw, repeated until the thresholds hold) and memory hogs (freeze → rank by
//! RSS minus the whitelist → kill the victim scope → thaw). Only processes listed in
//! the frozen cgroup are ever signalled, through pidfds (no pid reuse), and every step
//! goes to the action log with its evidence.

use crate::actions::ActionLog;
use crate::aggregate::Rate;
use crate::error::OrionError;
use crate::lock::{Frozen, probe};
use crate::policy::{
    ForkBombThresholds, VictimScope, Whitelist, fork_bomb_check, fork_bomb_victims,
    memory_hog_victims,
};
use crate::procscan::{cgroup_pids, read_proc, scan_cgroup};
use crate::shm::now_ns;
use crate::tree::{ShadowTree, TreeStats};
use serde::Serialize;
use sidecore_kernel::orion_sched::{SchedAttach, SchedEvents, SchedKind};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The healer's settings.
#[derive(Debug, Clone)]
pub struct HealerConfig {
    /// The cgroup v2 directory watched, locked and repaired.
    pub cgroup: PathBuf,
    /// Fork-bomb thresholds.
    pub thresholds: ForkBombThresholds,
    /// Never-touched processes.
    pub whitelist: Whitelist,
    /// Memory-hog victim scope (E10).
    pub scope: VictimScope,
    /// How long the freeze may take to settle.
    pub freeze_timeout: Duration,
    /// Memory use, as a fraction of the limit, above which a hog is repaired.
    pub memory_fraction: f64,
    /// Window of the creation rate.
    pub rate_window: Duration,
    /// Keep the shadow tree from eBPF fork/exec/exit events (falling back to /proc
    /// scans when the kernel refuses them); `false`: /proc scans only.
    pub kernel_sensors: bool,
    /// After a kill pass, how long to wait for the victims to leave the cgroup before
    /// checking again.
    pub settle_timeout: Duration,
}

/// Where the shadow tree comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "source")]
pub enum TreeSource {
    /// eBPF on `sched_process_fork`/`exec`/`exit`, attached as `attach`.
    Kernel {
        /// `tp_btf` or `raw_tp`.
        attach: &'static str,
    },
    /// /proc scans each check; `why` the kernel sensors are not used.
    ProcScan {
        /// Why not the kernel's events.
        why: String,
    },
}

/// The settle poll's period.
const SETTLE_POLL: Duration = Duration::from_millis(1);
/// Kill passes before a repair gives up.
const MAX_PASSES: u32 = 8;

impl HealerConfig {
    /// Defaults for `cgroup`.
    pub fn new(cgroup: impl Into<PathBuf>) -> HealerConfig {
        HealerConfig {
            cgroup: cgroup.into(),
            thresholds: ForkBombThresholds::default(),
            whitelist: Whitelist::default(),
            scope: VictimScope::ProcessGroup,
            freeze_timeout: Duration::from_secs(2),
            memory_fraction: 0.8,
            rate_window: Duration::from_secs(1),
            kernel_sensors: true,
            settle_timeout: Duration::from_millis(20),
        }
    }
}

/// What a repair did.
#[derive(Debug, Clone, Serialize)]
pub struct RepairReport {
    /// `fork-bomb` or `memory-hog`.
    pub kind: &'static str,
    /// The culprit (bomb root, or largest process).
    pub culprit: u32,
    /// Every process signalled.
    pub killed: Vec<u32>,
    /// Freeze → kill → thaw rounds.
    pub passes: u32,
    /// Time frozen in total, ms.
    pub frozen_ms: f64,
    /// From detection to the end of the repair, ms.
    pub total_ms: f64,
}

/// The healer of one cgroup.
pub struct Healer {
    cfg: HealerConfig,
    tree: ShadowTree,
    rate: Rate,
    log: ActionLog,
    sched: Option<SchedEvents>,
    source: TreeSource,
}

/// Signals every victim of a frozen cgroup with SIGKILL, plain kill(2): a victim not yet
/// signalled is frozen, so it cannot exit and its pid cannot be reused before its turn
/// (pidfds are for processes that may run meanwhile). The loop runs at real-time
/// priority where it may: SIGKILL thaws each victim into its exit, and a thousand exits
/// on a small machine would otherwise preempt the loop that is still signalling.
fn kill_frozen(victims: &[u32]) -> Vec<String> {
    use rustix::process::{Pid, Signal, kill_process};
    let boosted = FifoBoost::new();
    let failed = victims
        .iter()
        .filter_map(|&pid| {
            let p = i32::try_from(pid).ok().and_then(Pid::from_raw)?;
            kill_process(p, Signal::KILL)
                .err()
                .map(|e| format!("SIGKILL to {pid}: {e}"))
        })
        .collect();
    drop(boosted);
    failed
}

/// SCHED_FIFO (the lowest real-time priority) for the calling thread while it
/// lives, then its old policy back: the kill loop, and a monitor that CPU-bound
/// load must not delay (`orion watch --realtime`). Without the right to it
/// (no CAP_SYS_NICE, an RT budget of 0) the thread keeps its policy and
/// [`FifoBoost::active`] says so.
pub struct FifoBoost {
    old: Option<(libc::c_int, libc::sched_param)>,
}

impl FifoBoost {
    /// Boosts the calling thread if it may be.
    #[must_use]
    pub fn new() -> FifoBoost {
        FifoBoost::try_new().unwrap_or(FifoBoost { old: None })
    }

    /// Boosts the calling thread, or says why the kernel refused.
    pub fn try_new() -> std::io::Result<FifoBoost> {
        // SAFETY: sched_getscheduler/sched_getparam/sched_setscheduler on the calling
        // thread (pid 0) with a valid, initialised sched_param; failures are returned,
        // not undefined.
        unsafe {
            let policy = libc::sched_getscheduler(0);
            let mut old = libc::sched_param { sched_priority: 0 };
            if policy < 0 || libc::sched_getparam(0, &mut old) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fifo = libc::sched_param {
                sched_priority: libc::sched_get_priority_min(libc::SCHED_FIFO).max(1),
            };
            if libc::sched_setscheduler(0, libc::SCHED_FIFO, &fifo) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(FifoBoost {
                old: Some((policy, old)),
            })
        }
    }

    /// True if the thread now runs at SCHED_FIFO.
    #[must_use]
    pub fn active(&self) -> bool {
        self.old.is_some()
    }
}

impl Default for FifoBoost {
    fn default() -> Self {
        FifoBoost::new()
    }
}

impl Drop for FifoBoost {
    fn drop(&mut self) {
        if let Some((policy, param)) = self.old {
            // SAFETY: restores the policy and parameters read in `new` on this thread.
            unsafe {
                libc::sched_setscheduler(0, policy, &param);
            }
        }
    }
}

fn kill(pid: u32) -> Result<(), OrionError> {
    use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
    let p = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| OrionError::Config {
            what: "kill".to_owned(),
            why: format!("{pid} is not a process id"),
        })?;
    let fd = pidfd_open(p, PidfdFlags::empty())
        .map_err(|e| OrionError::sys(format!("pidfd_open({pid})"), e))?;
    pidfd_send_signal(&fd, Signal::KILL)
        .map_err(|e| OrionError::sys(format!("SIGKILL to {pid}"), e))
}

impl Healer {
    /// A healer for `cfg.cgroup`; refused when it cannot be frozen. With
    /// `kernel_sensors`, the eBPF fork/exec/exit sensors are attached to the cgroup;
    /// where the kernel refuses them (no BTF, no BPF, no privilege) the healer scans
    /// /proc instead, and says why in [`Healer::source`] and in its log.
    pub fn new(cfg: HealerConfig, mut log: ActionLog) -> Result<Healer, OrionError> {
        probe(&cfg.cgroup)?;
        let rate = Rate::new(cfg.rate_window.as_nanos() as u64);
        let (sched, source) = if cfg.kernel_sensors {
            match SchedEvents::attach(&cfg.cgroup) {
                Ok(ev) => {
                    let attach = match ev.attached_as() {
                        SchedAttach::BtfTracepoint => "tp_btf",
                        SchedAttach::RawTracepoint => "raw_tp",
                    };
                    (Some(ev), TreeSource::Kernel { attach })
                }
                Err(e) => (
                    None,
                    TreeSource::ProcScan {
                        why: format!("the kernel refused the eBPF process sensors: {e}"),
                    },
                ),
            }
        } else {
            let why = "kernel sensors turned off".to_owned();
            (None, TreeSource::ProcScan { why })
        };
        log.record("sensors", cfg.cgroup.display().to_string(), &source);
        Ok(Healer {
            cfg,
            tree: ShadowTree::new(),
            rate,
            log,
            sched,
            source,
        })
    }

    /// The action log.
    pub fn log(&self) -> &ActionLog {
        &self.log
    }

    /// Where the shadow tree comes from.
    pub fn source(&self) -> &TreeSource {
        &self.source
    }

    /// Records lost because the kernel's ring buffer was full (0 without the sensors).
    pub fn events_dropped(&self) -> u64 {
        self.sched
            .as_ref()
            .and_then(|s| s.stats().ok())
            .map_or(0, |s| s.dropped)
    }

    /// Brings the shadow tree up to date: the kernel's events first, then the cgroup's
    /// member list (read after them, so a fork the list shows is either in the events
    /// or read from /proc, and counted once); without the sensors, a /proc scan.
    fn refresh_tree(&mut self) -> Result<BTreeSet<u32>, OrionError> {
        let Some(sched) = self.sched.as_mut() else {
            let procs = scan_cgroup(&self.cfg.cgroup)?;
            let scope = procs.iter().map(|p| p.pid).collect();
            self.tree.update(procs);
            return Ok(scope);
        };
        let tree = &mut self.tree;
        sched.drain(|e| match e.kind {
            SchedKind::Fork => {
                tree.fork(e.ppid, e.pid);
                tree.exec(e.pid, &e.comm, e.uid);
            }
            SchedKind::Exec => tree.exec(e.pid, &e.comm, e.uid),
            SchedKind::Exit => tree.exit(e.pid),
        });
        let scope: BTreeSet<u32> = cgroup_pids(&self.cfg.cgroup)?.into_iter().collect();
        self.tree.reconcile(&scope, read_proc);
        Ok(scope)
    }

    /// Updates the shadow tree: its shape over the cgroup and the creation rate.
    pub fn scan(&mut self) -> Result<(TreeStats, f64, BTreeSet<u32>), OrionError> {
        let scope = self.refresh_tree()?;
        self.rate.push(now_ns(), self.tree.created());
        let rate = self.rate.per_second().unwrap_or(0.0);
        // The shape follows lineage through exited ancestors; the count is the live.
        let mut stats = self.tree.stats(&self.tree.with_ghosts(&scope));
        stats.count = scope.len();
        Ok((stats, rate, scope))
    }

    /// Waits up to `settle_timeout` for `killed` to leave the cgroup.
    fn settle(&self, killed: &[u32]) -> Result<(), OrionError> {
        let start = Instant::now();
        while start.elapsed() < self.cfg.settle_timeout {
            let now: BTreeSet<u32> = cgroup_pids(&self.cfg.cgroup)?.into_iter().collect();
            if killed.iter().all(|p| !now.contains(p)) {
                break;
            }
            std::thread::sleep(SETTLE_POLL);
        }
        Ok(())
    }

    fn target(&self) -> String {
        self.cfg.cgroup.display().to_string()
    }

    /// One check for a fork bomb, repairing it when the thresholds trip.
    pub fn check_fork_bomb(&mut self) -> Result<Option<RepairReport>, OrionError> {
        let (stats, rate, _) = self.scan()?;
        let Some(evidence) = fork_bomb_check(&self.cfg.thresholds, &stats, rate) else {
            return Ok(None);
        };
        let start = Instant::now();
        self.log
            .record("detected", self.target(), ("fork-bomb", &evidence));
        let mut report = RepairReport {
            kind: "fork-bomb",
            culprit: 0,
            killed: Vec::new(),
            passes: 0,
            frozen_ms: 0.0,
            total_ms: 0.0,
        };
        while report.passes < MAX_PASSES {
            report.passes += 1;
            let killed = self.kill_pass(&mut report)?;
            self.settle(&killed)?;
            let (stats, _, scope) = self.scan()?;
            let left = fork_bomb_victims(&self.tree, &scope, &self.cfg.whitelist)
                .map(|(_, v)| v.len())
                .unwrap_or(0);
            if fork_bomb_check(&self.cfg.thresholds, &stats, 0.0).is_none() && left == 0 {
                break;
            }
        }
        report.total_ms = start.elapsed().as_secs_f64() * 1e3;
        self.log.record("repaired", self.target(), &report);
        Ok(Some(report))
    }

    /// One freeze → walk → kill → thaw pass; returns whom it signalled.
    fn kill_pass(&mut self, report: &mut RepairReport) -> Result<Vec<u32>, OrionError> {
        let mut lock = Frozen::take(&self.cfg.cgroup, self.cfg.freeze_timeout)?;
        let t = Instant::now();
        self.log.record(
            "freeze",
            self.target(),
            serde_json::json!({ "settled_ms": lock.took().as_secs_f64() * 1e3 }),
        );
        let (stats, _, scope) = self.scan()?;
        let picked = fork_bomb_victims(&self.tree, &scope, &self.cfg.whitelist);
        let walk_ms = t.elapsed().as_secs_f64() * 1e3;
        let mut killed = Vec::new();
        if let Some((culprit, victims)) = picked {
            if report.culprit == 0 {
                report.culprit = culprit;
            }
            let k = Instant::now();
            let failed = kill_frozen(&victims);
            let kill_ms = k.elapsed().as_secs_f64() * 1e3;
            self.log.record(
                "kill",
                self.target(),
                serde_json::json!({ "culprit": culprit, "comm": self.tree.get(culprit).map(|p| p.comm.clone()), "pids": victims, "tree": stats, "tree_source": self.source, "failed": failed, "walk_ms": walk_ms, "kill_ms": kill_ms }),
            );
            killed = victims;
        }
        let th = Instant::now();
        lock.release()?;
        let thaw_ms = th.elapsed().as_secs_f64() * 1e3;
        report.frozen_ms += t.elapsed().as_secs_f64() * 1e3 + lock.took().as_secs_f64() * 1e3;
        self.log.record(
            "thaw",
            self.target(),
            serde_json::json!({ "pass": report.passes, "thaw_ms": thaw_ms }),
        );
        report.killed.extend(killed.iter().copied());
        Ok(killed)
    }

    /// One check for a memory hog given the cgroup's memory use and limit (bytes),
    /// repairing when use exceeds `memory_fraction` of the limit.
    pub fn check_memory(
        &mut self,
        usage: u64,
        limit: u64,
    ) -> Result<Option<RepairReport>, OrionError> {
        if limit == 0 || (usage as f64) < self.cfg.memory_fraction * limit as f64 {
            return Ok(None);
        }
        let start = Instant::now();
        self.log.record(
            "detected",
            self.target(),
            serde_json::json!({ "kind": "memory-hog", "usage_bytes": usage, "limit_bytes": limit, "fraction": self.cfg.memory_fraction }),
        );
        let mut lock = Frozen::take(&self.cfg.cgroup, self.cfg.freeze_timeout)?;
        self.log.record(
            "freeze",
            self.target(),
            serde_json::json!({ "settled_ms": lock.took().as_secs_f64() * 1e3 }),
        );
        let procs = scan_cgroup(&self.cfg.cgroup)?;
        let Some((hog, victims)) = memory_hog_victims(&procs, &self.cfg.whitelist, self.cfg.scope)
        else {
            lock.release()?;
            self.log.record(
                "release",
                self.target(),
                "no unprotected process to kill: false positive",
            );
            return Ok(None);
        };
        let mut ranking: Vec<_> = procs
            .iter()
            .map(|p| (p.rss_kib, p.pid, p.comm.clone()))
            .collect();
        ranking.sort_unstable_by(|a, b| b.cmp(a));
        ranking.truncate(5);
        let victims_rss_kib: u64 = procs
            .iter()
            .filter(|p| victims.contains(&p.pid))
            .map(|p| p.rss_kib)
            .sum();
        let failed: Vec<String> = victims
            .iter()
            .filter_map(|p| kill(*p).err().map(|e| e.to_string()))
            .collect();
        self.log.record(
            "kill",
            self.target(),
            serde_json::json!({ "hog": hog, "scope": self.cfg.scope, "pids": victims, "victims_rss_kib": victims_rss_kib, "top_rss_kib": ranking, "failed": failed }),
        );
        lock.release()?;
        self.log
            .record("thaw", self.target(), serde_json::Value::Null);
        let report = RepairReport {
            kind: "memory-hog",
            culprit: hog.pid,
            killed: victims,
            passes: 1,
            frozen_ms: start.elapsed().as_secs_f64() * 1e3,
            total_ms: start.elapsed().as_secs_f64() * 1e3,
        };
        self.log.record("repaired", self.target(), &report);
        Ok(Some(report))
    }
}
