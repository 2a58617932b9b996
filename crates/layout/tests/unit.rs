//! Unit tests of the layout: each constraint kind, each capacity, both objectives,
//! infeasibility explanations (the exact items named), reasons, bad input messages
//! and the JSON form.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use sidecore_layout::{
    Candidate, ConflictItem, ConstraintSpec, Flow, LayoutError, LinkCap, OffcodeSpec, PeSpec,
    Problem, Resource, SolveOptions, Violation, Why, check, greedy, solve,
};
use sidecore_types::{ConstraintKind, PeKind};

fn pe(id: &str, kind: PeKind, cpu: f64) -> PeSpec {
    PeSpec {
        id: id.into(),
        kind,
        cpu,
        memory_bytes: 1 << 30,
        slots: None,
    }
}

/// host, core:1, core:2
fn pes() -> Vec<PeSpec> {
    vec![
        pe("host", PeKind::Host, 8.0),
        pe("core:1", PeKind::Core, 1.0),
        pe("core:2", PeKind::Core, 1.0),
    ]
}

fn oc(name: &str, weight: u32, cands: &[(usize, f64)]) -> OffcodeSpec {
    OffcodeSpec {
        name: name.into(),
        weight,
        candidates: cands
            .iter()
            .map(|&(pe, cpu)| Candidate {
                pe,
                cpu,
                memory_bytes: 1 << 20,
            })
            .collect(),
    }
}

fn con(kind: ConstraintKind, a: usize, b: usize, line: u32) -> ConstraintSpec {
    ConstraintSpec {
        kind,
        a,
        b,
        origin: format!("examples/x.toml:{line}:1"),
    }
}

fn solved(p: &Problem) -> sidecore_layout::Layout {
    let l = solve(p, &SolveOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    check(p, &l.assignment).expect("the layout satisfies every constraint");
    l
}

fn conflict(p: &Problem) -> Vec<String> {
    match solve(p, &SolveOptions::default()) {
        Err(LayoutError::Infeasible(c)) => {
            let mut v: Vec<String> = c
                .items
                .iter()
                .map(std::string::ToString::to_string)
                .collect();
            v.sort();
            v
        }
        other => panic!("expected infeasible, got {other:?}"),
    }
}

#[test]
fn everything_offloads_when_it_fits() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![
            oc("a", 2, &[(0, 0.5), (1, 0.5)]),
            oc("b", 1, &[(0, 0.5), (2, 0.5)]),
        ],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.assignment, vec![1, 2]);
    assert_eq!(l.offloaded_weight, 3);
    assert!(l.reasons.iter().all(|r| r.offloaded));
    assert!(
        l.reasons[0]
            .to_string()
            .starts_with("`a` offloaded to core:1"),
        "{}",
        l.reasons[0]
    );
}

#[test]
fn pull_puts_both_on_the_same_pe() {
    // a can use core:1 or core:2, b only core:2: pulled together they both take core:2.
    let p = Problem {
        pes: pes(),
        offcodes: vec![
            oc("a", 1, &[(0, 0.3), (1, 0.3), (2, 0.3)]),
            oc("b", 1, &[(0, 0.3), (2, 0.3)]),
        ],
        constraints: vec![con(ConstraintKind::Pull, 0, 1, 30)],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.assignment, vec![2, 2]);
    assert_eq!(l.stats.groups, 1);
    let r = l.reasons[0].to_string();
    assert!(r.contains("pulled with `b` (examples/x.toml:30:1)"), "{r}");
}

#[test]
fn pull_whose_rows_do_not_intersect_is_explained() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![
            oc("a", 1, &[(1, 0.3)]),
            oc("b", 1, &[(2, 0.3)]),
            oc("c", 1, &[(0, 0.1)]),
        ],
        constraints: vec![con(ConstraintKind::Pull, 0, 1, 7)],
        ..Default::default()
    };
    assert_eq!(
        conflict(&p),
        vec![
            "`a` can only run on core:1",
            "`b` can only run on core:2",
            "pull(`a`, `b`) at examples/x.toml:7:1",
        ]
    );
}

#[test]
fn pull_to_a_host_only_offcode_keeps_both_home() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![oc("a", 4, &[(0, 0.3), (1, 0.3)]), oc("b", 1, &[(0, 0.3)])],
        constraints: vec![con(ConstraintKind::Pull, 0, 1, 3)],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.assignment, vec![0, 0]);
    assert!(matches!(l.reasons[0].why, Why::PulledToHost { .. }));
    assert!(matches!(l.reasons[1].why, Why::NoOffloadCandidate));
    assert_eq!(
        l.reasons[1].to_string(),
        "`b` on host: no non-host candidate"
    );
}

#[test]
fn gang_offloads_both_or_neither() {
    // b cannot leave the host, so gang keeps a home too.
    let mut p = Problem {
        pes: pes(),
        offcodes: vec![oc("a", 4, &[(0, 0.3), (1, 0.3)]), oc("b", 1, &[(0, 0.3)])],
        constraints: vec![con(ConstraintKind::Gang, 0, 1, 12)],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.assignment, vec![0, 0]);
    assert_eq!(l.offloaded_weight, 0);
    let r = l.reasons[0].to_string();
    assert_eq!(
        r,
        "`a` on host: offloading it conflicts with: `a` placed off the host; \
         gang(`a`, `b`) at examples/x.toml:12:1; `b` can only run on host"
    );
    // Give b a core and both go.
    p.offcodes[1] = oc("b", 1, &[(0, 0.3), (2, 0.3)]);
    let l = solved(&p);
    assert_eq!(l.offloaded_weight, 5);
    assert!(l.assignment.iter().all(|&k| k != 0));
}

#[test]
fn asym_gang_is_one_way() {
    // a -> b: offloading a needs b offloaded. b is host-only, so a stays home ...
    let p = Problem {
        pes: pes(),
        offcodes: vec![oc("a", 4, &[(0, 0.3), (1, 0.3)]), oc("b", 1, &[(0, 0.3)])],
        constraints: vec![con(ConstraintKind::AsymGang, 0, 1, 5)],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.assignment, vec![0, 0]);
    let Why::Conflict { conflict } = &l.reasons[0].why else {
        panic!("{}", l.reasons[0])
    };
    assert!(
        conflict
            .to_string()
            .contains("asym-gang(`a` -> `b`) at examples/x.toml:5:1"),
        "{conflict}"
    );
    // ... but the reverse direction does not bind: b -> a lets a go alone.
    let mut q = p.clone();
    q.constraints = vec![con(ConstraintKind::AsymGang, 1, 0, 5)];
    let l = solved(&q);
    assert_eq!(l.assignment, vec![1, 0]);
    assert_eq!(l.offloaded_weight, 4);
}

#[test]
fn link_constrains_nothing() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![oc("a", 4, &[(0, 0.3), (1, 0.3)]), oc("b", 1, &[(0, 0.3)])],
        constraints: vec![con(ConstraintKind::Link, 0, 1, 5)],
        ..Default::default()
    };
    assert_eq!(solved(&p).assignment, vec![1, 0]);
}

#[test]
fn cpu_capacity_keeps_the_heaviest() {
    // One core of 1.0; three offcodes of 0.5: the two heaviest fit.
    let p = Problem {
        pes: vec![
            pe("host", PeKind::Host, 8.0),
            pe("core:1", PeKind::Core, 1.0),
        ],
        offcodes: vec![
            oc("low", 1, &[(0, 0.5), (1, 0.5)]),
            oc("high", 4, &[(0, 0.5), (1, 0.5)]),
            oc("normal", 2, &[(0, 0.5), (1, 0.5)]),
        ],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.assignment, vec![0, 1, 1]);
    assert_eq!(l.offloaded_weight, 6);
    let r = l.reasons[0].to_string();
    assert_eq!(
        r,
        "`low` on host: offloading it would lower the offloaded weight from 6 to 5"
    );
}

#[test]
fn explanation_budget_falls_back_to_cheap_reasons() {
    let p = Problem {
        pes: vec![
            pe("host", PeKind::Host, 8.0),
            pe("core:1", PeKind::Core, 1.0),
        ],
        offcodes: vec![
            oc("low", 1, &[(0, 0.5), (1, 0.5)]),
            oc("high", 4, &[(0, 0.5), (1, 0.5)]),
            oc("normal", 2, &[(0, 0.5), (1, 0.5)]),
        ],
        ..Default::default()
    };
    let opts = SolveOptions {
        explain_time_limit: Some(std::time::Duration::ZERO),
        ..Default::default()
    };
    let l = solve(&p, &opts).unwrap();
    assert_eq!(
        l.reasons[0].to_string(),
        "`low` on host: no room on its non-host candidates: core:1 cpu (1 of 1 used, needs 0.5)"
    );
}

#[test]
fn memory_and_slot_capacity() {
    let mut pes = vec![
        pe("host", PeKind::Host, 8.0),
        pe("wasm:0", PeKind::Wasm, 4.0),
    ];
    pes[1].memory_bytes = 100;
    pes[1].slots = Some(2);
    let mk = |name: &str, mem: u64| OffcodeSpec {
        name: name.into(),
        weight: 1,
        candidates: vec![
            Candidate {
                pe: 0,
                cpu: 0.1,
                memory_bytes: mem,
            },
            Candidate {
                pe: 1,
                cpu: 0.1,
                memory_bytes: mem,
            },
        ],
    };
    // Memory: 60 + 60 > 100, so only one of the two big ones; slots: at most two.
    let p = Problem {
        pes,
        offcodes: vec![
            mk("big1", 60),
            mk("big2", 60),
            mk("small1", 10),
            mk("small2", 10),
        ],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.offloaded_weight, 2);
    let on_wasm = l.assignment.iter().filter(|&&k| k == 1).count();
    assert_eq!(on_wasm, 2);
}

#[test]
fn bandwidth_objective_colocates_flows_after_offload() {
    // Two cores, each fits both; the flow should keep them on one core.
    let p = Problem {
        pes: pes(),
        offcodes: vec![
            oc("a", 1, &[(0, 0.4), (1, 0.4), (2, 0.4)]),
            oc("b", 1, &[(0, 0.4), (2, 0.4)]),
            oc("c", 1, &[(0, 0.4), (1, 0.4)]),
        ],
        flows: vec![
            Flow {
                a: 0,
                b: 1,
                bandwidth_bps: 100.0,
                origin: "f1".into(),
            },
            Flow {
                a: 0,
                b: 2,
                bandwidth_bps: 10.0,
                origin: "f2".into(),
            },
        ],
        ..Default::default()
    };
    let l = solved(&p);
    // All three offloaded (weight first), a with b (the bigger flow).
    assert_eq!(l.offloaded_weight, 3);
    assert_eq!(l.assignment, vec![2, 2, 1]);
    assert_eq!(l.cross_bandwidth, 10.0);
    assert_eq!(l.stats.stages.len(), 2);
    assert!(
        l.reasons[0]
            .to_string()
            .contains("shares the PE with flow peers `b` (f1)")
    );
}

#[test]
fn offload_weight_beats_bandwidth() {
    // Keeping a and b together would need both on the host; offloading wins.
    let p = Problem {
        pes: pes(),
        offcodes: vec![
            oc("a", 1, &[(0, 0.4), (1, 0.4)]),
            oc("b", 1, &[(0, 0.4), (2, 0.4)]),
        ],
        flows: vec![Flow {
            a: 0,
            b: 1,
            bandwidth_bps: 1e6,
            origin: String::new(),
        }],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.assignment, vec![1, 2]);
    assert_eq!(l.cross_bandwidth, 1e6);
}

#[test]
fn capacity_conflict_names_the_pe_and_offcodes() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![
            oc("a", 1, &[(1, 0.8)]),
            oc("b", 1, &[(1, 0.5)]),
            oc("c", 1, &[(0, 0.1), (2, 0.1)]),
        ],
        ..Default::default()
    };
    assert_eq!(
        conflict(&p),
        vec![
            "`a` can only run on core:1",
            "`b` can only run on core:1",
            "cpu capacity of core:1 (1)",
        ]
    );
}

#[test]
fn gang_conflict_names_the_constraint_with_its_origin() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![
            oc("x", 1, &[(0, 0.1)]),
            oc("a", 1, &[(1, 0.1)]),
            oc("b", 1, &[(0, 0.1)]),
        ],
        constraints: vec![
            con(ConstraintKind::Link, 0, 1, 1),
            con(ConstraintKind::Gang, 1, 2, 9),
        ],
        ..Default::default()
    };
    assert_eq!(
        conflict(&p),
        vec![
            "`a` can only run on core:1",
            "`b` can only run on host",
            "gang(`a`, `b`) at examples/x.toml:9:1",
        ]
    );
}

#[test]
fn slot_conflict() {
    let mut ps = pes();
    ps[1].slots = Some(1);
    let p = Problem {
        pes: ps,
        offcodes: vec![oc("a", 1, &[(1, 0.1)]), oc("b", 1, &[(1, 0.1)])],
        ..Default::default()
    };
    match solve(&p, &SolveOptions::default()) {
        Err(LayoutError::Infeasible(c)) => {
            assert_eq!(c.items.len(), 3, "{c}");
            assert!(c.items.contains(&ConflictItem::Capacity {
                pe: 1,
                pe_id: "core:1".into(),
                resource: Resource::Slots,
                capacity: 1.0
            }));
            let json = serde_json::to_value(&c).unwrap();
            assert_eq!(json["items"].as_array().unwrap().len(), 3);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn offcode_without_candidates() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![oc("a", 1, &[(0, 0.1)]), oc("lost", 1, &[])],
        ..Default::default()
    };
    assert_eq!(conflict(&p), vec!["`lost` can run on no PE"]);
    let e = solve(&p, &SolveOptions::default()).unwrap_err().to_string();
    assert_eq!(
        e,
        "no layout satisfies all constraints; these conflict: `lost` can run on no PE"
    );
}

#[test]
fn too_big_for_every_candidate() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![oc("huge", 1, &[(1, 1.5), (2, 1.2)])],
        ..Default::default()
    };
    assert_eq!(
        conflict(&p),
        vec![
            "`huge` can only run on core:1, core:2",
            "cpu capacity of core:1 (1)",
            "cpu capacity of core:2 (1)",
        ]
    );
}

#[test]
fn no_host_pe_means_everything_is_offloaded() {
    let p = Problem {
        pes: vec![
            pe("core:1", PeKind::Core, 1.0),
            pe("core:2", PeKind::Core, 1.0),
        ],
        offcodes: vec![
            oc("a", 1, &[(0, 0.6), (1, 0.6)]),
            oc("b", 2, &[(0, 0.6), (1, 0.6)]),
        ],
        constraints: vec![con(ConstraintKind::Gang, 0, 1, 2)],
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.offloaded_weight, 3);
    assert_ne!(l.assignment[0], l.assignment[1]);
}

#[test]
fn empty_problem() {
    let l = solved(&Problem::default());
    assert!(l.assignment.is_empty());
    assert_eq!(l.offloaded_weight, 0);
}

#[test]
fn large_problems_get_cheap_reasons() {
    let n = 70;
    let offcodes: Vec<OffcodeSpec> = (0..n)
        .map(|i| oc(&format!("o{i}"), 1, &[(0, 0.1), (1, 0.1)]))
        .collect();
    let p = Problem {
        pes: pes(),
        offcodes,
        ..Default::default()
    };
    let l = solved(&p);
    assert_eq!(l.offloaded_weight, 10);
    let host = l.reasons.iter().find(|r| !r.offloaded).unwrap();
    assert!(matches!(host.why, Why::NoRoom { .. }), "{host}");
    assert!(host.to_string().contains("core:1 cpu"), "{host}");
}

#[test]
fn greedy_baseline_is_feasible_and_not_better_than_milp() {
    let p = Problem {
        pes: vec![
            pe("host", PeKind::Host, 8.0),
            pe("core:1", PeKind::Core, 1.0),
        ],
        offcodes: vec![
            oc("a", 2, &[(0, 0.6), (1, 0.6)]),
            oc("b", 2, &[(0, 0.5), (1, 0.5)]),
            oc("c", 2, &[(0, 0.5), (1, 0.5)]),
        ],
        ..Default::default()
    };
    let g = greedy(&p).unwrap().expect("greedy finds a layout");
    let (gw, _) = check(&p, &g).unwrap();
    let l = solved(&p);
    // First-fit takes a (0.6) and then nothing fits; the optimum takes b and c.
    assert_eq!(gw, 2);
    assert_eq!(l.offloaded_weight, 4);
}

fn invalid(p: &Problem) -> String {
    match solve(p, &SolveOptions::default()) {
        Err(LayoutError::Invalid(m)) => m,
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[test]
fn bad_input_is_rejected_with_a_message_naming_it() {
    let base = Problem {
        pes: pes(),
        offcodes: vec![oc("a", 1, &[(0, 0.1), (1, 0.1)]), oc("b", 1, &[(0, 0.1)])],
        ..Default::default()
    };
    let mut p = base.clone();
    p.offcodes[0].candidates[1].pe = 7;
    assert_eq!(
        invalid(&p),
        "offcode `a`: candidate 1 names PE index 7, but there are only 3 PEs"
    );
    let mut p = base.clone();
    p.offcodes[1].candidates[0].cpu = f64::NAN;
    assert_eq!(
        invalid(&p),
        "offcode `b`: cpu demand NaN on PE `host` is not a finite non-negative number"
    );
    let mut p = base.clone();
    p.pes[2].cpu = -1.0;
    assert_eq!(
        invalid(&p),
        "PE `core:2`: cpu capacity -1 is not a finite non-negative number"
    );
    let mut p = base.clone();
    p.pes.push(pe("host2", PeKind::Host, 1.0));
    assert_eq!(invalid(&p), "more than one host PE: `host` and `host2`");
    let mut p = base.clone();
    p.constraints.push(con(ConstraintKind::Gang, 1, 1, 4));
    assert_eq!(
        invalid(&p),
        "constraint 0 at examples/x.toml:4:1: gang of offcode `b` with itself"
    );
    let mut p = base.clone();
    p.constraints.push(con(ConstraintKind::Pull, 0, 5, 4));
    assert_eq!(
        invalid(&p),
        "constraint 0 at examples/x.toml:4:1 (pull): offcode index b = 5 is out of range (2 offcodes)"
    );
    let mut p = base.clone();
    p.flows.push(Flow {
        a: 0,
        b: 1,
        bandwidth_bps: f64::INFINITY,
        origin: "c.toml:3:1".into(),
    });
    assert_eq!(
        invalid(&p),
        "flow 0 at c.toml:3:1 (`a` - `b`): bandwidth inf is not a finite non-negative number"
    );
    let mut p = base.clone();
    p.flows.push(Flow {
        a: 1,
        b: 1,
        bandwidth_bps: 1.0,
        origin: String::new(),
    });
    assert_eq!(
        invalid(&p),
        "flow 1: flow from `b` to itself".replace("flow 1", "flow 0")
    );
    let mut p = base.clone();
    p.offcodes[0].candidates.push(Candidate {
        pe: 1,
        cpu: 0.1,
        memory_bytes: 0,
    });
    assert_eq!(
        invalid(&p),
        "offcode `a`: PE `core:1` is listed twice among its candidates"
    );
    let mut p = base.clone();
    p.offcodes[1].name = "a".into();
    assert_eq!(
        invalid(&p),
        "offcode name `a` is used twice (offcodes 0 and 1)"
    );
    let mut p = base.clone();
    p.pes[1].id = "host".into();
    assert_eq!(invalid(&p), "PE id `host` is used twice (PEs 0 and 1)");
    let mut p = base.clone();
    p.pes.clear();
    assert_eq!(invalid(&p), "2 offcodes but no PE to place them on");
    let e = solve(&p, &SolveOptions::default()).unwrap_err().to_string();
    assert!(e.starts_with("invalid layout problem: "), "{e}");
}

#[test]
fn layout_serialises_to_json() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![oc("a", 2, &[(0, 0.5), (1, 0.5)])],
        ..Default::default()
    };
    let l = solved(&p);
    let v = serde_json::to_value(&l).unwrap();
    assert_eq!(v["assignment"][0], 1);
    assert_eq!(v["reasons"][0]["why"]["kind"], "offloaded");
    assert_eq!(v["stats"]["stages"][0]["name"], "offload");
    let text = l.to_string();
    assert!(
        text.ends_with("offloaded weight 2; cross-PE bandwidth 0"),
        "{text}"
    );
}

#[test]
fn time_limit_still_returns_a_layout() {
    let offcodes: Vec<OffcodeSpec> = (0..40)
        .map(|i| {
            oc(
                &format!("o{i}"),
                1 + i % 3,
                &[(0, 0.1), (1, 0.05 + 0.01 * f64::from(i % 7)), (2, 0.3)],
            )
        })
        .collect();
    let p = Problem {
        pes: pes(),
        offcodes,
        ..Default::default()
    };
    let opts = SolveOptions {
        time_limit: Some(std::time::Duration::from_secs(30)),
        explain: false,
        ..Default::default()
    };
    let l = solve(&p, &opts).unwrap();
    check(&p, &l.assignment).unwrap();
    assert!(!l.stats.stages.is_empty());
}

/// Found by the property test: HiGHS reported an error, not infeasibility, for this
/// problem's feasibility model when its objective was all zero.
#[test]
fn infeasible_memory_and_asym_gang_is_explained() {
    let pe = |id: &str, kind, cpu| PeSpec {
        id: id.into(),
        kind,
        cpu,
        memory_bytes: 2,
        slots: None,
    };
    let oc = |name: &str, m: [u64; 3]| OffcodeSpec {
        name: name.into(),
        weight: 1,
        candidates: (0..3)
            .map(|k| Candidate {
                pe: k,
                cpu: 0.0,
                memory_bytes: m[k],
            })
            .collect(),
    };
    let p = Problem {
        pes: vec![
            pe("pe0", PeKind::Host, 0.25),
            pe("pe1", PeKind::Core, 0.75),
            pe("pe2", PeKind::Core, 0.75),
        ],
        offcodes: vec![
            oc("o0", [1, 1, 1]),
            oc("o1", [2, 2, 2]),
            oc("o2", [0, 2, 2]),
            oc("o3", [0, 0, 0]),
            oc("o4", [1, 1, 1]),
        ],
        constraints: vec![
            con(ConstraintKind::Pull, 2, 0, 1),
            con(ConstraintKind::AsymGang, 1, 2, 2),
            con(ConstraintKind::AsymGang, 0, 1, 3),
        ],
        flows: vec![],
        links: Vec::new(),
    };
    // o0+o2 (pulled, 3 bytes off the host, 1 on it) and o1 (2 bytes) cannot share
    // any PE of 2 bytes, and o1 -> o2 ties them: every placement overflows memory.
    assert_eq!(
        conflict(&p),
        vec![
            "asym-gang(`o1` -> `o2`) at examples/x.toml:2:1",
            "memory capacity of pe0 (2 bytes)",
            "memory capacity of pe1 (2 bytes)",
            "memory capacity of pe2 (2 bytes)",
            "pull(`o2`, `o0`) at examples/x.toml:1:1",
        ]
    );
}

fn flow(a: usize, b: usize, bps: f64) -> Flow {
    Flow {
        a,
        b,
        bandwidth_bps: bps,
        origin: String::new(),
    }
}

fn link(a: usize, b: usize, bps: f64) -> LinkCap {
    LinkCap {
        a,
        b,
        bandwidth_bps: bps,
        origin: "nodes.toml:3:1".into(),
    }
}

/// HYDRA's B_kl (7.8-7.9): the bandwidth cap alone makes the placement infeasible,
/// and the explanation names the link.
#[test]
fn a_link_cap_alone_can_make_a_layout_infeasible_and_is_named() {
    let p = Problem {
        pes: pes(),
        // `nic` only runs on core:1, `app` only on the host; 100 bit/s between them.
        offcodes: vec![oc("nic", 1, &[(1, 0.5)]), oc("app", 1, &[(0, 0.5)])],
        constraints: vec![],
        flows: vec![flow(0, 1, 100.0)],
        links: vec![link(0, 1, 50.0)],
    };
    assert_eq!(
        conflict(&p),
        vec![
            "`app` can only run on host",
            "`nic` can only run on core:1",
            "bandwidth cap of the link host—core:1 (50 bit/s) at nodes.toml:3:1",
        ]
    );
    // With the cap raised to the flow, it fits.
    let mut ok = p.clone();
    ok.links[0].bandwidth_bps = 100.0;
    assert_eq!(solved(&ok).assignment, vec![1, 0]);
    // Without it, too (the cap is the only reason).
    let mut free = p.clone();
    free.links.clear();
    assert_eq!(solved(&free).assignment, vec![1, 0]);
}

/// A cap changes where offcodes go: both would be offloaded to different cores,
/// but the link between those cores cannot carry their flow, so they share one.
#[test]
fn a_link_cap_moves_offcodes_and_check_enforces_it() {
    let p = Problem {
        pes: pes(),
        offcodes: vec![
            oc("a", 2, &[(0, 0.6), (1, 0.6), (2, 0.6)]),
            oc("b", 2, &[(0, 0.6), (1, 0.6), (2, 0.6)]),
        ],
        constraints: vec![],
        flows: vec![flow(0, 1, 10.0)],
        links: vec![link(1, 2, 5.0), link(0, 1, 5.0), link(0, 2, 5.0)],
    };
    // Each core fits only one (0.6 + 0.6 > 1.0), so offloading both puts them on
    // two cores joined by a 5 bit/s link, and offloading one crosses a 5 bit/s
    // link to the host: only both on the host keeps the 10 bit/s flow inside one
    // PE.
    let l = solved(&p);
    assert_eq!(l.assignment, vec![0, 0], "{:?}", l.assignment);
    assert_eq!(l.offloaded_weight, 0);
    // Without the caps both go off the host, on different cores.
    let mut free = p.clone();
    free.links.clear();
    let l = solved(&free);
    assert_eq!(l.offloaded_weight, 4);
    // `check` refuses the uncapped layout under the caps, naming the link.
    let e = check(&p, &l.assignment).unwrap_err();
    assert!(matches!(e, Violation::LinkCap { .. }), "{e}");
    assert!(
        e.to_string().contains("> cap 5 bit/s at nodes.toml:3:1"),
        "{e}"
    );
    // The greedy never hands out a layout that breaks a cap.
    if let Some(g) = greedy(&p).unwrap() {
        check(&p, &g).unwrap();
    }
}

#[test]
fn bad_link_caps_are_refused_with_their_origin() {
    let mut p = Problem {
        pes: pes(),
        offcodes: vec![oc("a", 1, &[(0, 0.5)])],
        constraints: vec![],
        flows: vec![],
        links: vec![link(0, 7, 1.0)],
    };
    let e = solve(&p, &SolveOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("link cap 0 at nodes.toml:3:1: PE index b = 7 is out of range"),
        "{e}"
    );
    p.links = vec![link(1, 1, 1.0)];
    let e = solve(&p, &SolveOptions::default()).unwrap_err().to_string();
    assert!(e.contains("a link from `core:1` to itself"), "{e}");
    p.links = vec![link(0, 1, f64::NAN)];
    let e = solve(&p, &SolveOptions::default()).unwrap_err().to_string();
    assert!(e.contains("is not a finite non-negative number"), "{e}");
}

/// A case proptest found in CI (seed 0439ec95…): twin cores, an asymmetric gang and a
/// gang chained through o1, zero weights. Infeasible; HiGHS's presolve mis-solved one
/// feasibility check of the explanation and returned an error status. The solve must
/// succeed or explain, never fail.
#[test]
fn twin_cores_with_chained_gangs_solve() {
    let small = |id: &str, kind, cpu, memory_bytes| PeSpec {
        id: String::from(id),
        kind,
        cpu,
        memory_bytes,
        slots: None,
    };
    let cand = |pe, cpu, memory_bytes| Candidate {
        pe,
        cpu,
        memory_bytes,
    };
    let off = |name: &str, candidates| OffcodeSpec {
        name: name.into(),
        weight: 0,
        candidates,
    };
    let p = Problem {
        pes: vec![
            small("pe0", PeKind::Host, 0.25, 0),
            small("pe1", PeKind::Core, 0.75, 2),
            small("pe2", PeKind::Core, 0.75, 2),
        ],
        offcodes: vec![
            off("o0", vec![cand(1, 0.25, 1), cand(2, 0.25, 1)]),
            off(
                "o1",
                vec![cand(0, 0.0, 0), cand(1, 0.25, 2), cand(2, 0.25, 2)],
            ),
            off(
                "o2",
                vec![cand(0, 0.0, 0), cand(1, 0.25, 0), cand(2, 0.25, 0)],
            ),
            off(
                "o3",
                vec![cand(0, 0.0, 1), cand(1, 0.75, 0), cand(2, 0.75, 0)],
            ),
            off(
                "o4",
                vec![cand(0, 0.0, 0), cand(1, 0.25, 1), cand(2, 0.25, 1)],
            ),
        ],
        constraints: vec![
            con(ConstraintKind::AsymGang, 1, 4, 1),
            con(ConstraintKind::Gang, 3, 1, 2),
        ],
        flows: vec![],
        links: vec![],
    };
    for aggregate in [true, false] {
        let opts = SolveOptions {
            aggregate,
            explain: false,
            ..SolveOptions::default()
        };
        match solve(&p, &opts) {
            Ok(l) => {
                check(&p, &l.assignment).expect("a valid layout");
            }
            Err(LayoutError::Infeasible(_)) => {}
            Err(e) => panic!("aggregate={aggregate}: {e}"),
        }
    }
}
