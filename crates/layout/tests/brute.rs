//! Property tests: the MILP layout against brute-force enumeration on small random
//! problems (feasibility, both lexicographic objective values, validity of the
//! assignment), and every reported conflict checked to be infeasible and irreducible
//! by brute force.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use proptest::prelude::*;
use sidecore_layout::{
    Candidate, Conflict, ConflictItem, ConstraintSpec, Flow, LayoutError, LinkCap, OffcodeSpec,
    PeSpec, Problem, Resource, SolveOptions, Why, solve,
};
use sidecore_types::{ConstraintKind, PeKind};

/// Independent check of one assignment (not the crate's `check`).
fn valid(p: &Problem, asg: &[usize]) -> bool {
    let host = p.pes.iter().position(|x| x.kind == PeKind::Host);
    let mut used = vec![(0.0f64, 0u128, 0u32); p.pes.len()];
    for (n, &k) in asg.iter().enumerate() {
        let Some(c) = p.offcodes[n].candidates.iter().find(|c| c.pe == k) else {
            return false;
        };
        used[k].0 += c.cpu;
        used[k].1 += c.memory_bytes as u128;
        used[k].2 += 1;
    }
    for (k, pe) in p.pes.iter().enumerate() {
        if used[k].0 > pe.cpu + 1e-9 || used[k].1 > pe.memory_bytes as u128 {
            return false;
        }
        if pe.slots.is_some_and(|s| used[k].2 > s) {
            return false;
        }
    }
    for l in &p.links {
        let load: f64 = p
            .flows
            .iter()
            .filter(|f| {
                (asg[f.a] == l.a && asg[f.b] == l.b) || (asg[f.a] == l.b && asg[f.b] == l.a)
            })
            .map(|f| f.bandwidth_bps)
            .sum();
        if load > l.bandwidth_bps + 1e-9 {
            return false;
        }
    }
    let off = |n: usize| Some(asg[n]) != host;
    p.constraints.iter().all(|c| match c.kind {
        ConstraintKind::Link => true,
        ConstraintKind::Pull => asg[c.a] == asg[c.b],
        ConstraintKind::Gang => off(c.a) == off(c.b),
        ConstraintKind::AsymGang => !off(c.a) || off(c.b),
    })
}

fn objectives(p: &Problem, asg: &[usize]) -> (u64, f64) {
    let host = p.pes.iter().position(|x| x.kind == PeKind::Host);
    let w = (0..asg.len())
        .filter(|&n| Some(asg[n]) != host)
        .map(|n| u64::from(p.offcodes[n].weight))
        .sum();
    let cross = p
        .flows
        .iter()
        .filter(|f| asg[f.a] != asg[f.b])
        .map(|f| f.bandwidth_bps)
        .sum();
    (w, cross)
}

/// Best (max weight, then min cross) over all assignments, or `None` if infeasible.
fn brute(p: &Problem) -> Option<(u64, f64)> {
    fn rec(p: &Problem, asg: &mut Vec<usize>, best: &mut Option<(u64, f64)>) {
        let n = asg.len();
        if n == p.offcodes.len() {
            if valid(p, asg) {
                let (w, c) = objectives(p, asg);
                let better = match *best {
                    None => true,
                    Some((bw, bc)) => w > bw || (w == bw && c < bc - 1e-9),
                };
                if better {
                    *best = Some((w, c));
                }
            }
            return;
        }
        for c in &p.offcodes[n].candidates {
            asg.push(c.pe);
            rec(p, asg, best);
            asg.pop();
        }
    }
    let mut best = None;
    rec(p, &mut Vec::new(), &mut best);
    best
}

/// The problem restricted to a conflict's items: constraints not named are dropped,
/// capacities not named are unlimited, and an offcode whose can-run row is not named
/// may run on every PE (no demand outside its row). A forced offcode loses the host.
fn restrict(p: &Problem, items: &[ConflictItem]) -> Problem {
    let mut q = p.clone();
    let mut keep_canrun = vec![false; p.offcodes.len()];
    let mut keep_cap = vec![[false; 3]; p.pes.len()];
    let mut keep_con = vec![false; p.constraints.len()];
    let mut keep_link = vec![false; p.links.len()];
    let mut forced = None;
    for it in items {
        match it {
            ConflictItem::CanRun { offcode, .. } => keep_canrun[*offcode] = true,
            ConflictItem::Capacity { pe, resource, .. } => {
                let r = match resource {
                    Resource::Cpu => 0,
                    Resource::Memory => 1,
                    Resource::Slots => 2,
                };
                keep_cap[*pe][r] = true;
            }
            ConflictItem::Constraint { index, .. } => keep_con[*index] = true,
            ConflictItem::ForcedOffload { offcode, .. } => forced = Some(*offcode),
            ConflictItem::LinkCap { index, .. } => keep_link[*index] = true,
        }
    }
    for (k, pe) in q.pes.iter_mut().enumerate() {
        if !keep_cap[k][0] {
            pe.cpu = 1e12;
        }
        if !keep_cap[k][1] {
            pe.memory_bytes = u64::MAX / 4;
        }
        if !keep_cap[k][2] {
            pe.slots = None;
        }
    }
    let host = p.pes.iter().position(|x| x.kind == PeKind::Host);
    for (n, oc) in q.offcodes.iter_mut().enumerate() {
        if !keep_canrun[n] {
            oc.candidates = (0..p.pes.len())
                .map(|k| {
                    p.offcodes[n]
                        .candidates
                        .iter()
                        .find(|c| c.pe == k)
                        .copied()
                        .unwrap_or(Candidate {
                            pe: k,
                            cpu: 0.0,
                            memory_bytes: 0,
                        })
                })
                .collect();
        }
        if forced == Some(n) {
            oc.candidates.retain(|c| Some(c.pe) != host);
        }
    }
    q.constraints = p
        .constraints
        .iter()
        .enumerate()
        .filter(|(i, _)| keep_con[*i])
        .map(|(_, c)| c.clone())
        .collect();
    // Indices stay (a conflict names links by index): an unnamed link is uncapped.
    for (l, keep) in q.links.iter_mut().zip(keep_link) {
        if !keep {
            l.bandwidth_bps = 1e12;
        }
    }
    q
}

/// The conflict is infeasible on its own and dropping any one item (other than the
/// forced offload) makes it feasible.
fn assert_irreducible(p: &Problem, conflict: &Conflict) {
    assert!(!conflict.items.is_empty(), "empty conflict");
    assert!(
        brute(&restrict(p, &conflict.items)).is_none(),
        "conflict is feasible on its own: {conflict}"
    );
    for i in 0..conflict.items.len() {
        if matches!(conflict.items[i], ConflictItem::ForcedOffload { .. }) {
            continue;
        }
        let mut fewer = conflict.items.clone();
        fewer.remove(i);
        assert!(
            brute(&restrict(p, &fewer)).is_some(),
            "conflict is not irreducible: dropping `{}` keeps it infeasible: {conflict}",
            conflict.items[i]
        );
    }
}

fn arb_problem() -> impl Strategy<Value = Problem> {
    (1usize..=4, 1usize..=6, prop::bool::weighted(0.75)).prop_flat_map(|(npe, n, has_host)| {
        let pe = (
            0usize..3,
            1u32..=8,
            0u64..=4,
            prop::option::weighted(0.3, 1u32..=3),
        );
        // (presence roll in percent, cpu in quarters, memory)
        let cand = (0u32..100, 0u32..=3, 0u64..=2);
        // The flag keeps most rows non-empty (an empty row is a one-line conflict).
        let oc = (
            0u32..=4,
            prop::collection::vec(cand, npe),
            prop::bool::weighted(0.9),
        );
        let con = (0usize..n, 0usize..n, 0usize..4);
        let flow = (0usize..n, 0usize..n, 1u32..=10);
        // Link caps between two PEs, in the flows' unit; 0 to 2 of them.
        let link = (0usize..npe, 0usize..npe, 0u32..=15);
        (
            prop::collection::vec(pe, npe),
            prop::collection::vec(oc, n),
            prop::collection::vec(con, 0..=4),
            prop::collection::vec(flow, 0..=5),
            prop::collection::vec(link, 0..=2),
        )
            .prop_map(move |(pes, ocs, cons, flows, links)| {
                let kinds = [PeKind::Core, PeKind::Wasm, PeKind::Kernel];
                let pes = pes
                    .into_iter()
                    .enumerate()
                    .map(|(k, (kind, cpu, mem, slots))| PeSpec {
                        id: format!("pe{k}"),
                        kind: if k == 0 && has_host {
                            PeKind::Host
                        } else {
                            kinds[kind]
                        },
                        cpu: f64::from(cpu) * 0.25,
                        memory_bytes: mem,
                        slots,
                    })
                    .collect();
                let offcodes = ocs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (weight, row, nonempty))| {
                        let mut candidates: Vec<Candidate> = row
                            .iter()
                            .enumerate()
                            .filter(|(k, (roll, _, _))| {
                                *roll < if *k == 0 && has_host { 85 } else { 55 }
                            })
                            .map(|(k, &(_, cpu, mem))| Candidate {
                                pe: k,
                                cpu: f64::from(cpu) * 0.25,
                                memory_bytes: mem,
                            })
                            .collect();
                        if candidates.is_empty() && nonempty {
                            let k = i % row.len();
                            candidates.push(Candidate {
                                pe: k,
                                cpu: f64::from(row[k].1) * 0.25,
                                memory_bytes: row[k].2,
                            });
                        }
                        OffcodeSpec {
                            name: format!("o{i}"),
                            weight,
                            candidates,
                        }
                    })
                    .collect();
                let kinds = [
                    ConstraintKind::Link,
                    ConstraintKind::Pull,
                    ConstraintKind::Gang,
                    ConstraintKind::AsymGang,
                ];
                let constraints = cons
                    .into_iter()
                    .filter(|(a, b, _)| a != b)
                    .enumerate()
                    .map(|(i, (a, b, k))| ConstraintSpec {
                        kind: kinds[k],
                        a,
                        b,
                        origin: format!("t.toml:{}:1", i + 1),
                    })
                    .collect();
                let flows = flows
                    .into_iter()
                    .filter(|(a, b, _)| a != b)
                    .map(|(a, b, bw)| Flow {
                        a,
                        b,
                        bandwidth_bps: f64::from(bw),
                        origin: String::new(),
                    })
                    .collect();
                let links = links
                    .into_iter()
                    .filter(|(a, b, _)| a != b)
                    .enumerate()
                    .map(|(i, (a, b, cap))| LinkCap {
                        a,
                        b,
                        bandwidth_bps: f64::from(cap),
                        origin: format!("links.toml:{}:1", i + 1),
                    })
                    .collect();
                Problem {
                    pes,
                    offcodes,
                    constraints,
                    flows,
                    links,
                }
            })
    })
}

/// Like `arb_problem`, but every non-host PE is identical (same capacities, and each
/// offcode can run on all of them or none, with one demand): exercises merging
/// identical PEs into classes and packing the aggregated solution back.
fn arb_symmetric_problem() -> impl Strategy<Value = Problem> {
    arb_problem().prop_map(|mut p| {
        let host = p.pes.iter().position(|x| x.kind == PeKind::Host);
        let twins: Vec<usize> = (0..p.pes.len()).filter(|&k| Some(k) != host).collect();
        let Some(&first) = twins.first() else {
            return p;
        };
        p.links.clear(); // caps tell PEs apart; this strategy is about twins
        let proto = p.pes[first].clone();
        for &k in &twins {
            p.pes[k].kind = proto.kind;
            p.pes[k].cpu = proto.cpu;
            p.pes[k].memory_bytes = proto.memory_bytes;
            p.pes[k].slots = proto.slots;
        }
        for oc in &mut p.offcodes {
            let proto = oc.candidates.iter().find(|c| Some(c.pe) != host).copied();
            oc.candidates.retain(|c| Some(c.pe) == host);
            if let Some(c) = proto {
                oc.candidates
                    .extend(twins.iter().map(|&k| Candidate { pe: k, ..c }));
            }
        }
        p
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn identical_pes_agree_with_brute_force(p in arb_symmetric_problem()) {
        let expect = brute(&p);
        for aggregate in [true, false] {
            let opts = SolveOptions { aggregate, explain: false, ..SolveOptions::default() };
            match solve(&p, &opts) {
                Ok(layout) => {
                    let (w, cross) = expect.expect("brute force finds a layout too");
                    prop_assert!(valid(&p, &layout.assignment));
                    prop_assert_eq!(layout.offloaded_weight, w);
                    prop_assert!((layout.cross_bandwidth - cross).abs() < 1e-6,
                        "aggregate={} cross {} vs brute {}", aggregate, layout.cross_bandwidth, cross);
                }
                Err(LayoutError::Infeasible(conflict)) => {
                    prop_assert!(expect.is_none());
                    assert_irreducible(&p, &conflict);
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn milp_agrees_with_brute_force(p in arb_problem()) {
        let expect = brute(&p);
        let opts = SolveOptions::default();
        match solve(&p, &opts) {
            Ok(layout) => {
                let (w, cross) = expect.expect("solver found a layout brute force says is impossible");
                prop_assert!(valid(&p, &layout.assignment), "invalid assignment {:?}", layout.assignment);
                let (lw, lc) = objectives(&p, &layout.assignment);
                prop_assert_eq!(lw, layout.offloaded_weight);
                prop_assert!((lc - layout.cross_bandwidth).abs() < 1e-9);
                prop_assert_eq!(layout.offloaded_weight, w);
                prop_assert!((layout.cross_bandwidth - cross).abs() < 1e-6,
                    "cross {} vs brute {}", layout.cross_bandwidth, cross);
                prop_assert_eq!(layout.reasons.len(), p.offcodes.len());
                for (n, r) in layout.reasons.iter().enumerate() {
                    prop_assert_eq!(&r.pe, &p.pes[layout.assignment[n]].id);
                    // Host offcodes: the reason agrees with brute force on the problem
                    // with that offcode forced off the host.
                    let host = p.pes.iter().position(|x| x.kind == PeKind::Host);
                    let mut forced = p.clone();
                    forced.offcodes[n].candidates.retain(|c| Some(c.pe) != host);
                    let f = brute(&forced);
                    match &r.why {
                        Why::Conflict { conflict } => {
                            prop_assert!(f.is_none());
                            assert_irreducible(&p, conflict);
                        }
                        Why::LessWeight { best, forced: fw } => {
                            prop_assert_eq!(*best, w);
                            prop_assert_eq!(f.map(|x| x.0), Some(*fw));
                            prop_assert!(*fw < w);
                        }
                        Why::MoreBandwidth { best, forced: fc } => {
                            let f = f.expect("forced layout exists");
                            prop_assert_eq!(f.0, w);
                            prop_assert!((f.1 - fc).abs() < 1e-6 && (best - cross).abs() < 1e-6 && *fc > cross);
                        }
                        Why::Tie => {
                            let f = f.expect("forced layout exists");
                            prop_assert_eq!(f.0, w);
                            prop_assert!((f.1 - cross).abs() < 1e-6);
                        }
                        Why::NoOffloadCandidate | Why::PulledToHost { .. } => prop_assert!(f.is_none()),
                        Why::Offloaded { .. } => prop_assert!(r.offloaded),
                        other => prop_assert!(false, "unexpected reason for a small problem: {other}"),
                    }
                    let offloaded_reason = matches!(r.why, Why::Offloaded { .. });
                    prop_assert_eq!(r.offloaded, offloaded_reason);
                }
            }
            Err(LayoutError::Infeasible(conflict)) => {
                prop_assert!(expect.is_none(), "solver says infeasible, brute force found {:?}", expect);
                assert_irreducible(&p, &conflict);
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }
}
