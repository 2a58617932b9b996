//! The shadow process tree (sans-IO): processes as the monitor last saw them, each with
//! the parent it had when first seen, so lineage survives reparenting to init (the
//! seed's FORK_REC dependency graph). Fed by /proc scans ([`ShadowTree::update`]) or by
//! the kernel's fork/exec/exit events ([`ShadowTree::fork`], [`ShadowTree::exec`],
//! [`ShadowTree::exit`]) reconciled with the cgroup's member list
//! ([`ShadowTree::reconcile`]).

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A process as a scan sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcInfo {
    /// Process id.
    pub pid: u32,
    /// Parent now.
    pub ppid: u32,
    /// Process group.
    pub pgid: u32,
    /// Real user id.
    pub uid: u32,
    /// Command name (`comm`).
    pub comm: String,
    /// Resident set, KiB.
    pub rss_kib: u64,
    /// A kernel thread (PF_KTHREAD).
    pub kthread: bool,
}

/// Shape of a set of processes in the tree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TreeStats {
    /// Processes.
    pub count: usize,
    /// Longest parent chain inside the set (a lone process has depth 1).
    pub depth: usize,
    /// Processes per level (level 0: those whose parent is outside the set).
    pub breadth: Vec<usize>,
}

impl TreeStats {
    /// The widest level.
    pub fn max_breadth(&self) -> usize {
        self.breadth.iter().copied().max().unwrap_or(0)
    }
}

#[derive(Debug, Clone)]
struct Node {
    info: ProcInfo,
    origin_parent: u32,
    /// False for a ghost: an exited process kept while it has live descendants, so
    /// that their lineage (the FORK_REC chain) survives its exit.
    alive: bool,
}

/// The shadow tree.
#[derive(Debug, Clone, Default)]
pub struct ShadowTree {
    nodes: BTreeMap<u32, Node>,
    created: u64,
}

impl ShadowTree {
    /// An empty tree.
    pub fn new() -> ShadowTree {
        ShadowTree::default()
    }

    /// Replaces the tree's contents with a scan: processes not in it have exited, new
    /// ones are counted as created and keep their current parent as their origin.
    /// Returns (created, exited).
    pub fn update(&mut self, scan: Vec<ProcInfo>) -> (usize, usize) {
        let mut next = BTreeMap::new();
        let mut created = 0;
        for info in scan {
            let origin_parent = match self.nodes.remove(&info.pid) {
                Some(old) if old.info.comm == info.comm || old.origin_parent == info.ppid => {
                    old.origin_parent
                }
                _ => {
                    created += 1;
                    info.ppid
                }
            };
            next.insert(
                info.pid,
                Node {
                    info,
                    origin_parent,
                    alive: true,
                },
            );
        }
        let exited = self.nodes.len();
        self.nodes = next;
        self.created += created as u64;
        (created, exited)
    }

    /// A fork event: `child` of `parent` (info filled from the parent's when unknown).
    /// A child already in the tree (read from /proc before its event arrived) only
    /// gets its origin parent, and is not counted twice; a ghost of the same pid (a
    /// reused pid) is replaced.
    pub fn fork(&mut self, parent: u32, child: u32) {
        if let Some(n) = self.nodes.get_mut(&child)
            && n.alive
        {
            n.origin_parent = parent;
            return;
        }
        let info = self.nodes.get(&parent).map(|n| ProcInfo {
            pid: child,
            ppid: parent,
            ..n.info.clone()
        });
        let info = info.unwrap_or(ProcInfo {
            pid: child,
            ppid: parent,
            pgid: 0,
            uid: 0,
            comm: String::new(),
            rss_kib: 0,
            kthread: false,
        });
        self.nodes.insert(
            child,
            Node {
                info,
                origin_parent: parent,
                alive: true,
            },
        );
        self.created += 1;
    }

    /// An exec event: `pid` now runs `comm` as `uid`.
    pub fn exec(&mut self, pid: u32, comm: &str, uid: u32) {
        if let Some(n) = self.nodes.get_mut(&pid) {
            comm.clone_into(&mut n.info.comm);
            n.info.uid = uid;
        }
    }

    /// An exit event: the process becomes a ghost until [`ShadowTree::reconcile`]
    /// finds it without live descendants.
    pub fn exit(&mut self, pid: u32) {
        if let Some(n) = self.nodes.get_mut(&pid) {
            n.alive = false;
        }
    }

    /// Makes the tree's live processes exactly `scope` (the cgroup's members now):
    /// live processes not in it become ghosts, members the events never showed (there
    /// before the sensors, or moved in) are read with `read` and counted as created,
    /// and ghosts without live descendants are dropped. Returns how many were read.
    pub fn reconcile(
        &mut self,
        scope: &BTreeSet<u32>,
        mut read: impl FnMut(u32) -> Option<ProcInfo>,
    ) -> usize {
        // Not a member any more: it exited (its event may still be on its way) or
        // left; a ghost until pruned, so that its descendants keep their lineage.
        for (pid, n) in &mut self.nodes {
            if n.alive && !scope.contains(pid) {
                n.alive = false;
            }
        }
        let mut added = 0;
        for pid in scope {
            if self.nodes.get(pid).is_some_and(|n| n.alive) {
                continue;
            }
            if let Some(info) = read(*pid) {
                let origin_parent = info.ppid;
                let node = Node {
                    info,
                    origin_parent,
                    alive: true,
                };
                self.nodes.insert(*pid, node);
                added += 1;
            }
        }
        self.created += added as u64;
        self.prune_ghosts();
        added
    }

    /// Drops ghosts that are no live process's ancestor.
    fn prune_ghosts(&mut self) {
        let mut needed = BTreeSet::new();
        for n in self.nodes.values().filter(|n| n.alive) {
            let mut up = n.origin_parent;
            while let Some(p) = self.nodes.get(&up) {
                if p.alive || !needed.insert(up) {
                    break;
                }
                up = p.origin_parent;
            }
        }
        self.nodes.retain(|pid, n| n.alive || needed.contains(pid));
    }

    /// Exited processes kept for their live descendants' lineage.
    pub fn ghosts(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes
            .iter()
            .filter(|(_, n)| !n.alive)
            .map(|(pid, _)| *pid)
    }

    /// `scope` with the ghosts: the set whose roots, subtrees and shape follow lineage
    /// through exited ancestors.
    pub fn with_ghosts(&self, scope: &BTreeSet<u32>) -> BTreeSet<u32> {
        let mut s = scope.clone();
        s.extend(self.ghosts());
        s
    }

    /// Processes created since the tree began (for the creation rate).
    pub fn created(&self) -> u64 {
        self.created
    }

    /// A process (a ghost too).
    pub fn get(&self, pid: u32) -> Option<&ProcInfo> {
        self.nodes.get(&pid).map(|n| &n.info)
    }

    /// Every live process.
    pub fn all(&self) -> impl Iterator<Item = &ProcInfo> {
        self.nodes.values().filter(|n| n.alive).map(|n| &n.info)
    }

    /// The parent a process had when first seen.
    pub fn origin_parent(&self, pid: u32) -> Option<u32> {
        self.nodes.get(&pid).map(|n| n.origin_parent)
    }

    /// The processes of `set` whose origin parent is outside it.
    pub fn roots(&self, set: &BTreeSet<u32>) -> Vec<u32> {
        set.iter()
            .copied()
            .filter(|p| self.origin_parent(*p).is_none_or(|pp| !set.contains(&pp)))
            .collect()
    }

    /// `root` and its descendants inside `set` (by origin parent).
    pub fn subtree(&self, root: u32, set: &BTreeSet<u32>) -> Vec<u32> {
        let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for p in set {
            if let Some(pp) = self.origin_parent(*p) {
                children.entry(pp).or_default().push(*p);
            }
        }
        let mut out = vec![root];
        let mut seen = BTreeSet::from([root]);
        let mut i = 0;
        while let Some(&p) = out.get(i) {
            for c in children.get(&p).into_iter().flatten() {
                if seen.insert(*c) {
                    out.push(*c);
                }
            }
            i += 1;
        }
        out
    }

    /// Count, depth and per-level breadth of `set`.
    pub fn stats(&self, set: &BTreeSet<u32>) -> TreeStats {
        let mut stats = TreeStats {
            count: set.len(),
            ..TreeStats::default()
        };
        let mut level: Vec<u32> = self.roots(set);
        let mut seen: BTreeSet<u32> = level.iter().copied().collect();
        let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for p in set {
            if let Some(pp) = self.origin_parent(*p) {
                children.entry(pp).or_default().push(*p);
            }
        }
        while !level.is_empty() {
            stats.breadth.push(level.len());
            let mut next = Vec::new();
            for p in &level {
                for c in children.get(p).into_iter().flatten() {
                    if seen.insert(*c) {
                        next.push(*c);
                    }
                }
            }
            level = next;
        }
        stats.depth = stats.breadth.len();
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, ppid: u32, comm: &str) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            pgid: pid,
            uid: 1000,
            comm: comm.to_owned(),
            rss_kib: 100,
            kthread: false,
        }
    }

    #[test]
    fn lineage_survives_reparenting_and_stats_count_levels() {
        let mut t = ShadowTree::new();
        t.update(vec![
            p(10, 1, "sh"),
            p(11, 10, "sh"),
            p(12, 11, "sh"),
            p(13, 11, "sh"),
        ]);
        // 11 exits; its children are reparented to init but keep their origin.
        let (created, exited) = t.update(vec![
            p(10, 1, "sh"),
            p(12, 1, "sh"),
            p(13, 1, "sh"),
            p(14, 12, "sh"),
        ]);
        assert_eq!((created, exited), (1, 1));
        let set: BTreeSet<u32> = [10, 12, 13, 14].into();
        // 12 and 13's origin parent 11 is gone: they are roots now, like 10.
        assert_eq!(t.roots(&set), vec![10, 12, 13]);
        assert_eq!(t.subtree(12, &set), vec![12, 14]);
        let s = t.stats(&set);
        assert_eq!((s.count, s.depth, s.breadth.clone()), (4, 2, vec![3, 1]));
        t.fork(14, 15);
        assert_eq!(t.origin_parent(15), Some(14));
        assert_eq!(t.created(), 6); // four first seen, 14 scanned, 15 forked
    }

    #[test]
    fn events_keep_lineage_that_scans_miss_and_reconcile_trims_to_the_cgroup() {
        let mut t = ShadowTree::new();
        let scope: BTreeSet<u32> = [10].into();
        assert_eq!(t.reconcile(&scope, |pid| Some(p(pid, 1, "bash"))), 1);
        // 10 forks 11, 11 forks 12 and exits before any scan: 12 keeps 11 as origin,
        // and 11 stays as a ghost, so 12 is still 10's descendant.
        t.fork(10, 11);
        t.fork(11, 12);
        t.fork(11, 16);
        t.exit(11);
        t.exit(16);
        t.exec(12, "sleep", 0);
        assert_eq!(
            t.get(12).map(|i| (i.comm.as_str(), i.uid)),
            Some(("sleep", 0))
        );
        assert_eq!(t.origin_parent(12), Some(11));
        let scope: BTreeSet<u32> = [10, 12].into();
        t.reconcile(&scope, |_| None);
        assert_eq!(
            t.ghosts().collect::<Vec<_>>(),
            vec![11],
            "16 had no descendants"
        );
        let all = t.with_ghosts(&scope);
        assert_eq!(t.roots(&all), vec![10]);
        assert_eq!(t.subtree(10, &all), vec![10, 11, 12]);
        // 12 is in the cgroup, 13 moved in; 10 left it.
        let scope: BTreeSet<u32> = [12, 13].into();
        assert_eq!(t.reconcile(&scope, |pid| Some(p(pid, 1, "cat"))), 1);
        assert_eq!(t.all().map(|i| i.pid).collect::<Vec<_>>(), vec![12, 13]);
        assert_eq!(t.created(), 5);
        // 10 left (or exited unseen): a ghost, still 12's ancestor.
        assert_eq!(t.ghosts().collect::<Vec<_>>(), vec![10, 11]);
        // A ghost's pid reused by a new process replaces it.
        t.fork(13, 11);
        assert!(t.ghosts().all(|g| g != 11));
        assert_eq!(t.origin_parent(11), Some(13));
        // A member that vanished before it could be read is left out.
        let scope: BTreeSet<u32> = [12, 13, 14].into();
        assert_eq!(t.reconcile(&scope, |_| None), 0);
    }
}
