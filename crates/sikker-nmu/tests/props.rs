//! Property test: a check never allows what the SACL does not allow, and allows
//! everything it does (§3.1: allow ⇔ proc ∈ Procs ∧ dom ∈ Doms), across replacements.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use proptest::prelude::*;
use sidecore_sikker_nmu::{Address, NmuConfig, NmuTables, Triple};
use std::collections::{BTreeMap, BTreeSet};

type Sacl = BTreeMap<(u32, u32), (BTreeSet<u32>, BTreeSet<u32>)>;

fn id() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..20, 500u32..530, 5000u32..5003]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn check_agrees_with_sacl(
        entries in prop::collection::vec(
            (0u32..3, 0u32..4, prop::collection::btree_set(id(), 0..12), prop::collection::btree_set(id(), 0..6)),
            0..24),
        removals in prop::collection::vec((0u32..3, 0u32..4), 0..4),
        probes in prop::collection::vec((0u32..3, 0u32..5, id(), id()), 1..200),
    ) {
        let mut t = NmuTables::new(NmuConfig::default());
        let mut lis = Vec::new();
        for s in 0..3 { lis.push(t.add_process(s, 100 + s).unwrap()); }
        let mut sacl: Sacl = BTreeMap::new();
        for (src, dst, procs, doms) in entries {
            let ps: Vec<(u32, Address)> = procs.iter().map(|&p| (p, Address(dst * 100_000 + p))).collect();
            let ds: Vec<u32> = doms.iter().copied().collect();
            t.set_permission(src, dst, &ps, &ds, None).unwrap();
            sacl.insert((src, dst), (procs, doms));
        }
        for (src, dst) in removals {
            prop_assert_eq!(t.remove_permission(src, dst), sacl.remove(&(src, dst)).is_some());
        }
        for (src, dst, p, d) in probes {
            let got = t.check(lis[src as usize], Triple::new(dst, p, d));
            let want = sacl.get(&(src, dst)).map(|(ps, ds)| ps.contains(&p) && ds.contains(&d)).unwrap_or(false);
            prop_assert_eq!(got.is_ok(), want, "src {} dst {} p {} d {}: {:?}", src, dst, p, d, got);
            if let Ok((a, _)) = got { prop_assert_eq!(a, Address(dst * 100_000 + p)); }
        }
    }
}
