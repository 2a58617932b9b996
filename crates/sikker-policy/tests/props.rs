//! Property: after compiling any policy and placement, and after any sequence of
//! incremental updates, an NMU check allows exactly what the SACL allows (for placed
//! destinations) and never anything else.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use sidecore_sikker_nmu::Triple;
use sidecore_sikker_policy::model::{ProcessDef, Selection};
use sidecore_sikker_policy::{Grant, GrantTarget, Nos, Placement, Policy, Service};

fn sel(all: bool, set: BTreeSet<u32>) -> Selection<u32> {
    if all {
        Selection::All
    } else {
        Selection::Only(set)
    }
}

prop_compose! {
    fn policy()(
        sizes in prop::collection::vec((1u32..5, 1u32..4, any::<bool>()), 3),
        grants in prop::collection::vec((0u32..3, 0u32..3, any::<bool>(), prop::collection::btree_set(0u32..5, 0..4), any::<bool>(), prop::collection::btree_set(0u32..4, 0..3)), 0..6),
    ) -> Policy {
        let mut p = Policy::default();
        for (i, (np, nd, self_access)) in sizes.into_iter().enumerate() {
            let id = i as u32 + 1;
            p.services.insert(id, Service {
                name: format!("s{id}"),
                id,
                processes: (0..np).map(|x| (x, ProcessDef::default())).collect(),
                domains: (0..nd).map(|d| (format!("d{d}"), d)).collect(),
                portals: BTreeMap::new(),
                self_access,
            });
        }
        for (f, t, ap, ps, ad, ds) in grants {
            let (from, to) = (f + 1, t + 1);
            // Keep only identifiers the destination defines (the parser enforces this).
            let np = p.services[&to].processes.len() as u32;
            let nd = p.services[&to].domains.len() as u32;
            let ps = ps.into_iter().filter(|&x| x < np).collect();
            let ds = ds.into_iter().filter(|&x| x < nd).collect();
            p.grants.push(Grant { from, to, target: GrantTarget::Direct { processes: sel(ap, ps), domains: sel(ad, ds) } });
        }
        p
    }
}

fn check_all(n: &Nos) -> Result<(), TestCaseError> {
    let sacl = n.sacl();
    for (&s, svc) in &n.policy().services {
        for &p in svc.processes.keys() {
            let Some((h, _, li)) = n.locate(s, p) else {
                continue;
            };
            let t = n.tables(&h).unwrap();
            for (&d, dsvc) in &n.policy().services {
                for dp in 0..6u32 {
                    for dd in 0..5u32 {
                        let want = sacl.get(&(s, d)).map(|e| e.allows(dp, dd)).unwrap_or(false)
                            && n.locate(d, dp).is_some();
                        let got = t.check(li, Triple::new(d, dp, dd));
                        prop_assert_eq!(
                            got.is_ok(),
                            want,
                            "{}:{} -> ({},{},{}) {:?} ({})",
                            s,
                            p,
                            d,
                            dp,
                            dd,
                            got,
                            dsvc.name
                        );
                        if let Ok((a, _)) = got {
                            prop_assert_eq!(Some(a), n.locate(d, dp).map(|x| x.1));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn checks_follow_the_sacl(pol in policy(), place in prop::collection::vec(0u8..3, 12), ops in prop::collection::vec((0u8..5, 0u32..3, 0u32..6), 0..8)) {
        // Place each process on host a, b, or nowhere.
        let mut hosts: Vec<(String, Vec<(u32, u32)>)> = vec![("a".into(), vec![]), ("b".into(), vec![])];
        let mut k = 0;
        for (&s, svc) in &pol.services {
            for &p in svc.processes.keys() {
                let w = place[k % place.len()];
                k += 1;
                if w < 2 { hosts[w as usize].1.push((s, p)); }
            }
        }
        let mut n = Nos::compile(pol, &Placement { hosts, ..Placement::default() }).unwrap();
        check_all(&n)?;
        for (op, s, x) in ops {
            let s = s + 1;
            let _ = match op {
                0 => n.add_process(s, 10 + x, if x % 2 == 0 { "a" } else { "b" }).map(|_| ()),
                1 => n.remove_process(s, x).map(|_| ()),
                2 => n.add_domain(s, &format!("new{x}")).map(|_| ()),
                3 => n.remove_domain(s, &format!("d{x}")).map(|_| ()),
                _ => n.remove_grants(s, (x % 3) + 1).map(|_| ()),
            };
            check_all(&n)?;
        }
    }
}
