//! A benchmark-sized problem (1,000 offcodes on 64 PEs) under a tight budget: the
//! layout must be feasible, at least as good as the greedy baseline, and below the
//! reported bound, whatever the machine's speed.

#[path = "../benches/gen/mod.rs"]
mod generator;

use std::time::Duration;

use sidecore_layout::{SolveOptions, check, greedy, solve};

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
