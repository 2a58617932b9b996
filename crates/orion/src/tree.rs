//! The shadow process tree (sans-IO): processes as the monitor last saw them, each with
//! the parent it had when first seen, so lineage survives reparenting to init (the
//! seed's FORK_REC dependency graph). Fed by /proc scans or fork/exit events.

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
                },
            );
        }
        let exited = self.nodes.len();
        self.nodes = next;
        self.created += created as u64;
        (created, exited)
    }

    /// A fork event: `child` of `parent` (info filled from the parent's when unknown).
    pub fn fork(&mut self, parent: u32, child: u32) {
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
            },
        );
        self.created += 1;
    }

    /// An exit event.
    pub fn exit(&mut self, pid: u32) {
        self.nodes.remove(&pid);
    }

    /// Processes created since the tree began (for the creation rate).
    pub fn created(&self) -> u64 {
        self.created
    }

    /// A process.
    pub fn get(&self, pid: u32) -> Option<&ProcInfo> {
        self.nodes.get(&pid).map(|n| &n.info)
    }

    /// Every process.
    pub fn all(&self) -> impl Iterator<Item = &ProcInfo> {
        self.nodes.values().map(|n| &n.info)
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
}
