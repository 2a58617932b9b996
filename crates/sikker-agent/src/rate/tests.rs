//! Three agents' rate control in one deterministic simulation: a four-phase
//! load like RateSim's periods, then an agent lost. Messages between agents
//! take one step (50 µs); every sender sends 4 KiB messages as fast as its
//! bucket admits.

use super::sim::Sim;
use super::*;
use sidecore_sikker_policy::{parse_placement, parse_policy};

const STEP: f64 = 50_000.0;
const SIZE: usize = 4096;
/// 0.08 Gbps = 10 MB/s = 0.01 bytes per ns.
const LIMIT: f64 = 0.01;

fn nos() -> Nos {
    let policy = parse_policy(
        "p.toml",
        r#"
[[service]]
name = "src"
process_count = 3
[[service]]
name = "dst"
domains = ["In"]
[[service.process]]
id = 9
[[grant]]
from = "src"
to = "dst"
processes = [9]
domains = ["In"]
[[rate_limit]]
from = "src"
to = "dst"
gbps = 0.08
bucket_bytes = 65536
"#,
    )
    .unwrap();
    let placement = parse_placement(
        "h.toml",
        "[[host]]\nname = \"h0\"\nprocesses = [\"src:0\", \"dst:9\"]\n[[host]]\nname = \"h1\"\nprocesses = [\"src:1\"]\n[[host]]\nname = \"h2\"\nprocesses = [\"src:2\"]\n",
        &policy,
    )
    .unwrap();
    Nos::compile(policy, &placement).unwrap()
}

/// Runs `secs`; the aggregate over the last `measure` seconds as a fraction of the limit.
fn phase(sim: &mut Sim, active: [bool; 3], secs: f64, measure: f64) -> f64 {
    let per_step = sim.run(&active, secs);
    let n = (measure * 1e9 / STEP) as usize;
    let bytes: usize = per_step[per_step.len() - n..].iter().sum();
    bytes as f64 / (measure * 1e9) / LIMIT
}

fn sim() -> Sim {
    Sim::new(&nos(), 3, 0, SIZE, STEP)
}

#[test]
fn four_phases_hold_the_aggregate_within_one_percent() {
    let mut sim = sim();
    let phases = [
        [true, true, true],
        [true, false, false],
        [false, true, true],
        [true, true, true],
    ];
    for (i, active) in phases.into_iter().enumerate() {
        let r = phase(&mut sim, active, 2.0, 1.0);
        assert!(
            (r - 1.0).abs() <= 0.01,
            "phase {} ({active:?}): aggregate {r:.4} x the limit",
            i + 1
        );
        assert!(
            (sim.total_rate() - LIMIT).abs() < 1e-9,
            "rate is conserved: {} vs {LIMIT}",
            sim.total_rate()
        );
    }
}

#[test]
fn the_survivors_reclaim_a_lost_agents_share_and_a_returning_one_gets_one_back() {
    let mut sim = sim();
    phase(&mut sim, [true, true, true], 1.0, 0.5);
    // h2 dies: its messages vanish, the others see their links go.
    sim.kill(2);
    let r = phase(&mut sim, [true, true, false], 2.0, 1.0);
    assert!(
        (r - 1.0).abs() <= 0.01,
        "after the loss: {r:.4} x the limit"
    );
    assert!((sim.total_rate() - LIMIT).abs() < 1e-9);
    // h2 comes back, with a fresh rate control (nothing kept but the policy).
    sim.restart(2, &nos());
    let r = phase(&mut sim, [false, false, true], 2.0, 1.0);
    assert!(
        (r - 1.0).abs() <= 0.01,
        "after the return, all on h2: {r:.4}"
    );
}

#[test]
fn a_response_from_another_view_is_not_applied() {
    let mut sim = sim();
    // Drain h0's bucket so that it asks.
    phase(&mut sim, [true, false, false], 0.01, 0.005);
    let asked: Vec<RateExchange> = sim
        .wire
        .iter()
        .filter_map(|(_, m)| match m {
            sidecore_wire::Message::RateRequest(ex) => Some(*ex),
            _ => None,
        })
        .collect();
    assert!(!asked.is_empty(), "a low bucket asks its peers");
    let before = sim.total_rate();
    let old_view = sim.rc[0].as_ref().unwrap().view().1;
    let forged = RateExchange {
        from: asked[0].to,
        to: asked[0].from,
        view: old_view ^ 1,
        rate: 0.5,
        tokens: 100.0,
        ..asked[0]
    };
    let now = sim.now();
    let r0 = sim.rc[0].as_mut().unwrap();
    r0.on_response(&forged, now);
    assert_eq!(sim.total_rate(), before, "another view's rate is not added");
}

#[test]
fn a_message_larger_than_the_bucket_is_refused_and_re_is_named() {
    let mut r = RateControl::new(&nos(), "h0", 0.0).unwrap();
    let e = r.admit(0, 0, 70_000, 1.0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a 70000-byte message can never pass rate limit #0: its bucket holds 65536 bytes"
    );
    let policy = parse_policy(
        "p.toml",
        "[[service]]\nname = \"a\"\nprocess_count = 1\n[[service]]\nname = \"b\"\n[[rate_limit]]\nfrom = \"a\"\nto = \"b\"\ngbps = 1.0\nalgorithm = \"re\"\n",
    )
    .unwrap();
    let placement = parse_placement(
        "h.toml",
        "[[host]]\nname = \"h\"\nprocesses = [\"a:0\"]\n",
        &policy,
    )
    .unwrap();
    let n = Nos::compile(policy, &placement).unwrap();
    let e = RateControl::new(&n, "h", 0.0).err().unwrap();
    assert!(
        e.to_string()
            .contains("rate limit #0 (RE) cannot be run by the agent"),
        "{e}"
    );
}
