//! The healer: watches one cgroup v2 subtree from outside, keeps its shadow process
//! tree from /proc scans, and repairs fork bombs (freeze → walk → kill the culprit's
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
use crate::procscan::scan_cgroup;
use crate::shm::now_ns;
use crate::tree::{ShadowTree, TreeStats};
use serde::Serialize;
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
}

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
    /// A healer for `cfg.cgroup`; refused when it cannot be frozen.
    pub fn new(cfg: HealerConfig, log: ActionLog) -> Result<Healer, OrionError> {
        probe(&cfg.cgroup)?;
        let rate = Rate::new(cfg.rate_window.as_nanos() as u64);
        Ok(Healer {
            cfg,
            tree: ShadowTree::new(),
            rate,
            log,
        })
    }

    /// The action log.
    pub fn log(&self) -> &ActionLog {
        &self.log
    }

    /// Scans the cgroup into the shadow tree: its shape and the creation rate.
    pub fn scan(&mut self) -> Result<(TreeStats, f64, BTreeSet<u32>), OrionError> {
        let procs = scan_cgroup(&self.cfg.cgroup)?;
        let scope: BTreeSet<u32> = procs.iter().map(|p| p.pid).collect();
        self.tree.update(procs);
        self.rate.push(now_ns(), self.tree.created());
        let rate = self.rate.per_second().unwrap_or(0.0);
        Ok((self.tree.stats(&scope), rate, scope))
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
        while report.passes < 8 {
            report.passes += 1;
            let mut lock = Frozen::take(&self.cfg.cgroup, self.cfg.freeze_timeout)?;
            let t = Instant::now();
            self.log.record(
                "freeze",
                self.target(),
                serde_json::json!({ "settled_ms": lock.took().as_secs_f64() * 1e3 }),
            );
            let (stats, _, scope) = self.scan()?;
            let picked = fork_bomb_victims(&self.tree, &scope, &self.cfg.whitelist);
            if let Some((culprit, victims)) = picked {
                if report.culprit == 0 {
                    report.culprit = culprit;
                }
                let failed: Vec<String> = victims
                    .iter()
                    .filter_map(|p| kill(*p).err().map(|e| e.to_string()))
                    .collect();
                self.log.record(
                    "kill",
                    self.target(),
                    serde_json::json!({ "culprit": culprit, "comm": self.tree.get(culprit).map(|p| p.comm.clone()), "pids": victims, "tree": stats, "failed": failed }),
                );
                report.killed.extend(victims);
            }
            lock.release()?;
            report.frozen_ms += t.elapsed().as_secs_f64() * 1e3 + lock.took().as_secs_f64() * 1e3;
            self.log.record(
                "thaw",
                self.target(),
                serde_json::json!({ "pass": report.passes }),
            );
            std::thread::sleep(Duration::from_millis(20));
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
        let failed: Vec<String> = victims
            .iter()
            .filter_map(|p| kill(*p).err().map(|e| e.to_string()))
            .collect();
        self.log.record(
            "kill",
            self.target(),
            serde_json::json!({ "hog": hog, "scope": self.cfg.scope, "pids": victims, "top_rss_kib": ranking, "failed": failed }),
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
