//! A benchmark-sized problem (1,000 offcodes on 64 PEs) under a tight budget: the
//! layout must be feasible, at least as good as the greedy baseline, and below the
//! reported bound, whatever the machine's speed.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

#[path = "../benches/gen/mod.rs"]
mod generator;

use std::time::Duration;

use sidecore_layout::{ConflictItem, Resource, SolveOptions, check, greedy, solve};

#[test]
fn large_problem_under_a_tight_budget() {
    let p = generator::problem(1000, 64, 7);
    let g = greedy(&p).unwrap().expect("greedy finds a layout");
    let (gw, _) = check(&p, &g).unwrap();
    let opts = SolveOptions {
        time_limit: Some(Duration::from_millis(500)),
        explain: false,
        ..Default::default()
    };
    let l = solve(&p, &opts).unwrap();
    let (w, cross) = check(&p, &l.assignment).expect("feasible layout");
    assert_eq!(w, l.offloaded_weight);
    assert!((cross - l.cross_bandwidth).abs() < 1e-6);
    assert!(w >= gw, "MILP layout {w} is worse than greedy {gw}");
    let offload = l.stats.stages.iter().find(|s| s.name == "offload").unwrap();
    assert!(offload.objective * (1.0 + offload.gap) >= w as f64 - 1e-9);
    assert_eq!(l.reasons.len(), 1000);
    // The cheap reasons name a PE for every offcode.
    assert!(l.reasons.iter().all(|r| !r.pe.is_empty()));
}

#[test]
fn large_infeasible_problem_gets_a_small_explanation() {
    let mut p = generator::problem(1000, 64, 1);
    let cores: Vec<usize> = (0..p.pes.len())
        .filter(|&k| p.pes[k].id.starts_with("core:"))
        .collect();
    for &k in &cores {
        p.pes[k].cpu = 0.005;
    }
    let Err(sidecore_layout::LayoutError::Infeasible(c)) = solve(&p, &SolveOptions::default())
    else {
        panic!("expected infeasible");
    };
    // One offcode without a host build, too big for every core it may use.
    let canrun: Vec<&ConflictItem> = c
        .items
        .iter()
        .filter(|i| matches!(i, ConflictItem::CanRun { .. }))
        .collect();
    assert_eq!(canrun.len(), 1, "{c}");
    let ConflictItem::CanRun { offcode, .. } = canrun[0] else {
        unreachable!()
    };
    let row: Vec<usize> = p.offcodes[*offcode]
        .candidates
        .iter()
        .map(|x| x.pe)
        .collect();
    assert!(row.iter().all(|k| cores.contains(k)), "{row:?}");
    let caps: Vec<usize> = c
        .items
        .iter()
        .filter_map(|i| match i {
            ConflictItem::Capacity {
                pe,
                resource: Resource::Cpu,
                ..
            } => Some(*pe),
            _ => None,
        })
        .collect();
    assert_eq!(caps, row, "{c}");
    assert_eq!(c.items.len(), 1 + row.len());
}
