//! Repair policies (sans-IO): when a process tree is a fork bomb, which processes are
//! its victims, and which processes a memory hog's repair kills. Whitelisted processes
//! (kernel threads, PID 1, sidecore itself, services the administrator names) are
//! never chosen.

use crate::error::OrionError;
use crate::tree::{ProcInfo, ShadowTree, TreeStats};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Processes that repairs never touch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Whitelist {
    /// Process ids (sidecore's own is always added by [`Whitelist::protects`]).
    pub pids: BTreeSet<u32>,
    /// Command names (`comm`) of services the administrator names.
    pub names: BTreeSet<String>,
}

impl Whitelist {
    /// Whether `p` is protected: a kernel thread, PID 1, this process, a listed pid or a
    /// listed name.
    pub fn protects(&self, p: &ProcInfo) -> bool {
        p.kthread
            || p.pid == 1
            || p.pid == std::process::id()
            || self.pids.contains(&p.pid)
            || self.names.contains(&p.comm)
    }
}

/// When a tree is a fork bomb (any one threshold suffices).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ForkBombThresholds {
    /// Processes in the watched scope.
    pub max_count: usize,
    /// Longest parent chain.
    pub max_depth: usize,
    /// Widest level (catches bombs that start new process groups).
    pub max_breadth: usize,
    /// Processes created per second.
    pub max_rate_per_s: f64,
}

impl Default for ForkBombThresholds {
    fn default() -> Self {
        ForkBombThresholds {
            max_count: 100,
            max_depth: 32,
            max_breadth: 64,
            max_rate_per_s: 500.0,
        }
    }
}

/// Why a scope was judged a fork bomb.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BombEvidence {
    /// The tree's shape.
    pub stats: TreeStats,
    /// Creation rate, per second.
    pub rate_per_s: f64,
    /// Thresholds crossed, as `name value > limit`.
    pub tripped: Vec<String>,
}

/// Checks a scope's shape and creation rate against the thresholds.
pub fn fork_bomb_check(
    th: &ForkBombThresholds,
    stats: &TreeStats,
    rate_per_s: f64,
) -> Option<BombEvidence> {
    let mut tripped = Vec::new();
    if stats.count > th.max_count {
        tripped.push(format!("count {} > {}", stats.count, th.max_count));
    }
    if stats.depth > th.max_depth {
        tripped.push(format!("depth {} > {}", stats.depth, th.max_depth));
    }
    if stats.max_breadth() > th.max_breadth {
        tripped.push(format!(
            "breadth {} > {}",
            stats.max_breadth(),
            th.max_breadth
        ));
    }
    if rate_per_s > th.max_rate_per_s {
        tripped.push(format!("rate {rate_per_s:.0}/s > {}/s", th.max_rate_per_s));
    }
    (!tripped.is_empty()).then(|| BombEvidence {
        stats: stats.clone(),
        rate_per_s,
        tripped,
    })
}

/// The culprit of a bomb in `scope` and its victims: the unprotected root with the
/// largest subtree, its descendants, and the orphans that share its user and command
/// (bomb processes whose parents exited before the monitor saw them, reparented to
/// init), with their descendants. Lineage runs through the tree's ghosts (exited
/// ancestors the kernel's events kept), so a bomb whose every parent has exited is
/// still one tree; the culprit may be such a ghost. Protected processes are never
/// victims, and only live members of `scope` are.
pub fn fork_bomb_victims(
    tree: &ShadowTree,
    scope: &BTreeSet<u32>,
    wl: &Whitelist,
) -> Option<(u32, Vec<u32>)> {
    let candidates: BTreeSet<u32> = scope
        .iter()
        .copied()
        .filter(|p| tree.get(*p).is_some_and(|i| !wl.protects(i)))
        .collect();
    let lineage = tree.with_ghosts(&candidates);
    let live = |r: u32| -> Vec<u32> {
        tree.subtree(r, &lineage)
            .into_iter()
            .filter(|p| candidates.contains(p))
            .collect()
    };
    let roots: Vec<u32> = tree
        .roots(&lineage)
        .into_iter()
        .filter(|r| !live(*r).is_empty())
        .collect();
    let culprit = roots
        .iter()
        .copied()
        .max_by_key(|r| (live(*r).len(), std::cmp::Reverse(*r)))?;
    let c = tree.get(culprit)?;
    let (uid, comm) = (c.uid, c.comm.clone());
    let mut victims = BTreeSet::new();
    for r in roots {
        let orphan_like = tree.get(r).is_some_and(|i| {
            i.uid == uid
                && i.comm == comm
                && (i.ppid == 1
                    || !scope.contains(&i.ppid) && tree.origin_parent(r) != Some(i.ppid))
        });
        if r == culprit || orphan_like {
            victims.extend(live(r));
        }
    }
    Some((culprit, victims.into_iter().collect()))
}

/// Whom a memory hog's repair kills (erratum E10: the seed kills the largest process
/// group in §3.5.2 and all of the user's processes in §3.7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VictimScope {
    /// The process group whose unprotected processes hold the most RSS together.
    ProcessGroup,
    /// Every unprotected process of the user whose processes hold the most RSS.
    Uid,
    /// Every unprotected process in the scope (the cgroup).
    Cgroup,
}

impl std::str::FromStr for VictimScope {
    type Err = OrionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "process-group" | "pgid" => Ok(VictimScope::ProcessGroup),
            "uid" | "user" => Ok(VictimScope::Uid),
            "cgroup" => Ok(VictimScope::Cgroup),
            other => Err(OrionError::Config {
                what: "victim scope".to_owned(),
                why: format!("`{other}`: expected process-group, uid or cgroup"),
            }),
        }
    }
}

/// The memory hog and its victims. Processes are ranked by the unit the scope
/// names, not one by one: the process group (or user) whose unprotected
/// processes hold the most RSS together is the hog, as §3.5.2 ranks "the
/// process group with the largest RSS", so a group of small hogs outranks one
/// large bystander. The returned process is the unit's largest (the evidence
/// logged); the victims are every unprotected process of the unit. With scope
/// cgroup the unit is `procs` itself.
pub fn memory_hog_victims(
    procs: &[ProcInfo],
    wl: &Whitelist,
    scope: VictimScope,
) -> Option<(ProcInfo, Vec<u32>)> {
    let open: Vec<&ProcInfo> = procs.iter().filter(|p| !wl.protects(p)).collect();
    let unit = |p: &ProcInfo| match scope {
        VictimScope::ProcessGroup => p.pgid,
        VictimScope::Uid => p.uid,
        VictimScope::Cgroup => 0,
    };
    let mut totals: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for p in &open {
        *totals.entry(unit(p)).or_default() += p.rss_kib;
    }
    // Ties go to the lower unit id, so the choice is deterministic.
    let (&hog_unit, _) = totals
        .iter()
        .max_by_key(|(id, rss)| (**rss, std::cmp::Reverse(**id)))?;
    let members: Vec<&ProcInfo> = open.into_iter().filter(|p| unit(p) == hog_unit).collect();
    let hog = members
        .iter()
        .max_by_key(|p| (p.rss_kib, std::cmp::Reverse(p.pid)))?;
    let victims = members.iter().map(|p| p.pid).collect();
    Some(((*hog).clone(), victims))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, ppid: u32, pgid: u32, uid: u32, comm: &str, rss: u64) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            pgid,
            uid,
            comm: comm.to_owned(),
            rss_kib: rss,
            kthread: false,
        }
    }

    #[test]
    fn bomb_victims_take_orphans_and_spare_the_whitelist_and_bystanders() {
        let mut t = ShadowTree::new();
        t.update(vec![
            p(50, 40, 50, 0, "sleep", 10),  // whitelisted service
            p(60, 40, 60, 0, "tail", 10),   // bystander, parent outside
            p(100, 40, 100, 0, "bash", 10), // bomb root
            p(101, 100, 100, 0, "bash", 10),
            p(102, 101, 100, 0, "bash", 10),
            p(200, 1, 100, 0, "bash", 10), // orphan of the bomb
            p(201, 200, 100, 0, "bash", 10),
        ]);
        let scope: BTreeSet<u32> = [50, 60, 100, 101, 102, 200, 201].into();
        let wl = Whitelist {
            names: ["sleep".to_owned()].into(),
            ..Whitelist::default()
        };
        let (culprit, victims) = fork_bomb_victims(&t, &scope, &wl).unwrap();
        assert_eq!(culprit, 100);
        assert_eq!(victims, vec![100, 101, 102, 200, 201]);
        let th = ForkBombThresholds {
            max_count: 5,
            ..ForkBombThresholds::default()
        };
        let ev = fork_bomb_check(&th, &t.stats(&scope), 0.0).unwrap();
        assert_eq!(ev.tripped, vec!["count 7 > 5".to_owned()]);
        assert!(fork_bomb_check(&ForkBombThresholds::default(), &t.stats(&scope), 10.0).is_none());
    }

    #[test]
    fn memory_hog_scopes() {
        let procs = vec![
            p(1, 0, 1, 0, "init", 9_000_000),
            p(10, 1, 10, 1000, "hog", 500_000),
            p(11, 10, 10, 1000, "hog-child", 1000),
            p(12, 1, 12, 1000, "editor", 2000),
            p(13, 1, 13, 0, "sshd", 3000),
            p(14, 1, 14, 1000, "db", 400_000),
        ];
        let wl = Whitelist {
            names: ["db".to_owned()].into(),
            ..Whitelist::default()
        };
        let (hog, v) = memory_hog_victims(&procs, &wl, VictimScope::ProcessGroup).unwrap();
        assert_eq!((hog.pid, v), (10, vec![10, 11]));
        assert_eq!(
            memory_hog_victims(&procs, &wl, VictimScope::Uid).unwrap().1,
            vec![10, 11, 12]
        );
        assert_eq!(
            memory_hog_victims(&procs, &wl, VictimScope::Cgroup)
                .unwrap()
                .1,
            vec![10, 11, 12, 13]
        );
        // Four small hogs of one group outrank a larger bystander (the bench's
        // group-of-4 case): ranking by process would kill the bystander first.
        let group = vec![
            p(20, 1, 20, 0, "bystander", 65_000),
            p(30, 1, 30, 0, "perl", 40_000),
            p(31, 30, 30, 0, "perl", 40_000),
            p(32, 30, 30, 0, "perl", 40_000),
            p(33, 30, 30, 0, "perl", 40_000),
        ];
        let (hog, v) = memory_hog_victims(&group, &wl, VictimScope::ProcessGroup).unwrap();
        assert_eq!((hog.pid, v), (30, vec![30, 31, 32, 33]));
        // By user the same processes are one unit; the largest is the evidence.
        let (hog, v) = memory_hog_victims(&group, &wl, VictimScope::Uid).unwrap();
        assert_eq!((hog.pid, v.len()), (20, 5));
        assert!(memory_hog_victims(&[], &wl, VictimScope::ProcessGroup).is_none());
        assert!(
            "nope"
                .parse::<VictimScope>()
                .unwrap_err()
                .to_string()
                .contains("expected process-group")
        );
    }
}
