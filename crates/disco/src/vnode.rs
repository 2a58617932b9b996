//! Virtual inodes (§6.2): coherent stat information and the mapping of a
//! file's blocks onto regions of the physical space, the open and close
//! lists that drive manager changes and closure, write-through, and the
//! valid ranges written through a write-back overlay.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::msg::Msg;
use crate::space::{REGION_BYTES, Space, SpaceError};
use crate::types::{Endpoint, ObjectId, VnodeId};

/// What a vnode represents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Directory,
    Symlink,
    Memory,
    Stream,
}

/// The stat fields a vnode keeps coherent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub kind: Kind,
    pub mode: u32,
    pub size_bytes: u64,
    pub mtime_ns: i128,
}

/// One endpoint's copy of a vnode.
#[derive(Debug, Clone)]
pub struct Vnode {
    pub id: VnodeId,
    pub stat: Stat,
    /// Region index (offset / REGION_BYTES) → physical region. Mappings are
    /// only ever added (extend), never removed (§6.2.1).
    regions: BTreeMap<u64, ObjectId>,
    pub open_list: BTreeSet<Endpoint>,
    pub close_list: BTreeSet<Endpoint>,
    /// Remote endpoints with it open (seen by the manager).
    pub remote_count: u32,
    /// Writes go to the client at once (`VNODEWRITE`) instead of at exit.
    pub write_through: bool,
    /// Byte ranges written (start → end), for files opened write-only.
    valid_ranges: BTreeMap<u64, u64>,
}

impl Vnode {
    /// A vnode with no mappings yet.
    #[must_use]
    pub fn new(id: VnodeId, stat: Stat) -> Self {
        Vnode {
            id,
            stat,
            regions: BTreeMap::new(),
            open_list: BTreeSet::new(),
            close_list: BTreeSet::new(),
            remote_count: 0,
            write_through: false,
            valid_ranges: BTreeMap::new(),
        }
    }

    /// The region holding byte `offset`, if mapped.
    #[must_use]
    pub fn region(&self, offset: u64) -> Option<ObjectId> {
        self.regions.get(&(offset / REGION_BYTES)).copied()
    }

    /// Every mapped region, in file order.
    #[must_use]
    pub fn regions(&self) -> Vec<ObjectId> {
        self.regions.values().copied().collect()
    }

    /// Extend (§6.2.2): maps every unmapped region up to `size_bytes` into
    /// fresh regions of `space` (the caller holds the extend mutex). Returns
    /// the chunk notices to send. The size grows only after the mappings.
    pub fn extend(&mut self, size_bytes: u64, space: &mut Space) -> Result<Vec<Msg>, SpaceError> {
        let want = size_bytes.div_ceil(REGION_BYTES);
        let have = self.regions.keys().next_back().map_or(0, |k| k + 1);
        let mut notices = Vec::new();
        if want > have {
            let (base, n) = space.allocate(want - have)?;
            notices = n;
            for i in have..want {
                self.regions
                    .insert(i, ObjectId(base.0 + (i - have) * REGION_BYTES));
            }
        }
        self.stat.size_bytes = self.stat.size_bytes.max(size_bytes);
        Ok(notices)
    }

    /// Records that `[offset, offset+len)` was written.
    pub fn mark_written(&mut self, offset: u64, len: u64) {
        let (mut start, mut end) = (offset, offset + len);
        let overlapping: Vec<(u64, u64)> = self
            .valid_ranges
            .range(..=end)
            .filter(|(s, e)| **e >= start && **s <= end)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in overlapping {
            self.valid_ranges.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.valid_ranges.insert(start, end);
    }

    /// The written ranges, merged and in order.
    #[must_use]
    pub fn valid_ranges(&self) -> Vec<(u64, u64)> {
        self.valid_ranges.iter().map(|(s, e)| (*s, *e)).collect()
    }

    /// Phase one of closure (§6.2.4): joins the close list; true if this
    /// endpoint manages it and others still have it open (a manager change
    /// must come first).
    pub fn begin_close(&mut self, me: Endpoint, manager: Endpoint) -> bool {
        self.close_list.insert(me);
        manager == me && self.open_list.iter().any(|e| *e != me)
    }

    /// A manager-change target: open, not closing, the owner preferred.
    #[must_use]
    pub fn chman_target(&self, me: Endpoint, owner: Option<Endpoint>) -> Option<Endpoint> {
        let ok = |e: &Endpoint| *e != me && !self.close_list.contains(e);
        owner
            .filter(|o| self.open_list.contains(o) && ok(o))
            .or_else(|| self.open_list.iter().copied().find(ok))
    }

    /// Phase two: leaves both lists; the `VNODECLOSE` for the manager when
    /// this endpoint is not it.
    pub fn finish_close(&mut self, me: Endpoint, manager: Endpoint) -> Option<Msg> {
        self.open_list.remove(&me);
        self.close_list.remove(&me);
        (manager != me).then(|| Msg::Vnodeclose {
            vnode: self.id,
            from: me,
            regions: self.regions(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_maps_only_what_is_missing_and_ranges_merge() {
        let me = Endpoint(1);
        let mut space = Space::new(me);
        let stat = Stat {
            kind: Kind::File,
            mode: 0o644,
            size_bytes: 0,
            mtime_ns: 0,
        };
        let mut v = Vnode::new(VnodeId(5), stat);
        let n = v.extend(REGION_BYTES + 1, &mut space).unwrap();
        assert_eq!(n.len(), 1, "the first chunk is announced");
        assert_eq!(v.regions().len(), 2);
        let first = v.region(0).unwrap();
        assert!(v.extend(10, &mut space).unwrap().is_empty());
        assert_eq!(v.region(0), Some(first), "mappings are never changed");
        assert_eq!(
            v.stat.size_bytes,
            REGION_BYTES + 1,
            "size never shrinks by extend"
        );
        v.mark_written(10, 5);
        v.mark_written(0, 4);
        v.mark_written(14, 10);
        assert_eq!(v.valid_ranges(), vec![(0, 4), (10, 24)]);
        v.mark_written(4, 6);
        assert_eq!(v.valid_ranges(), vec![(0, 24)]);
    }

    #[test]
    fn closure_prefers_a_live_owner_for_the_new_manager() {
        let (a, b, c) = (Endpoint(1), Endpoint(2), Endpoint(3));
        let stat = Stat {
            kind: Kind::File,
            mode: 0o644,
            size_bytes: 0,
            mtime_ns: 0,
        };
        let mut v = Vnode::new(VnodeId(1), stat);
        v.open_list.extend([a, b, c]);
        assert!(v.begin_close(a, a));
        assert_eq!(v.chman_target(a, Some(c)), Some(c));
        v.close_list.insert(c);
        assert_eq!(v.chman_target(a, Some(c)), Some(b));
        assert!(v.finish_close(a, b).is_some());
        assert!(!v.open_list.contains(&a));
    }
}
