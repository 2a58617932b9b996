//! Three agents' rate control in one deterministic simulation: a four-phase
//! load like RateSim's periods, then an agent lost. Messages between agents
//! take one step (50 µs); every sender sends 4 KiB messages as fast as its
//! bucket admits.

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

struct Sim {
    rc: Vec<Option<RateControl>>,
    wire: Vec<(usize, sidecore_wire::Message)>,
    now: f64,
}

fn idx(h: &str) -> usize {
    h[1..].parse().unwrap()
}

impl Sim {
    fn new() -> Sim {
        let n = nos();
        let mut rc: Vec<Option<RateControl>> = (0..3)
            .map(|i| Some(RateControl::new(&n, &format!("h{i}"), 0.0).unwrap()))
            .collect();
        let all: BTreeSet<String> = (0..3).map(|i| format!("h{i}")).collect();
        for r in rc.iter_mut().flatten() {
            r.set_view(all.clone(), 0.0);
        }
        Sim {
            rc,
            wire: Vec::new(),
            now: 0.0,
        }
    }

    /// One step: deliver last step's messages, let `active` senders send as
    /// much as they may; the bytes each sent.
    fn step(&mut self, active: &[bool; 3]) -> [usize; 3] {
        self.now += STEP;
        let now = self.now;
        for (to, m) in std::mem::take(&mut self.wire) {
            let Some(r) = self.rc[to].as_mut() else {
                continue;
            };
            match m {
                sidecore_wire::Message::RateRequest(ex) => {
                    let resp = r.on_request(&ex, now);
                    let back = r.limits[&ex.slot]
                        .procs
                        .iter()
                        .find(|x| x.0 == ex.from)
                        .unwrap()
                        .1
                        .clone();
                    self.wire
                        .push((idx(&back), sidecore_wire::Message::RateResponse(resp)));
                }
                sidecore_wire::Message::RateResponse(ex) => r.on_response(&ex, now),
                other => panic!("unexpected {other:?}"),
            }
        }
        let mut sent = [0; 3];
        for i in 0..3 {
            let Some(r) = self.rc[i].as_mut() else {
                continue;
            };
            r.tick(now);
            if active[i] {
                loop {
                    match r.admit(0, i as u32, SIZE, now).unwrap() {
                        Admit::Now => sent[i] += SIZE,
                        Admit::Later(t) => {
                            assert!(t > now, "later must be later");
                            break;
                        }
                    }
                }
            }
            for (h, m) in r.take_out() {
                self.wire.push((idx(&h), m));
            }
        }
        sent
    }

    /// Runs `secs`; the aggregate rate over the last `measure` seconds,
    /// as a fraction of the limit.
    fn phase(&mut self, active: [bool; 3], secs: f64, measure: f64) -> f64 {
        let steps = (secs * 1e9 / STEP) as usize;
        let from = steps - (measure * 1e9 / STEP) as usize;
        let mut bytes = 0usize;
        for k in 0..steps {
            let s = self.step(&active);
            if k >= from {
                bytes += s.iter().sum::<usize>();
            }
        }
        bytes as f64 / (measure * 1e9) / LIMIT
    }

    fn total_rate(&self) -> f64 {
        self.rc
            .iter()
            .flatten()
            .map(|r| r.local_rates().get(&0).copied().unwrap_or(0.0))
            .sum::<f64>()
            / 1e9
    }
}

#[test]
fn four_phases_hold_the_aggregate_within_one_percent() {
    let mut sim = Sim::new();
    let phases = [
        [true, true, true],
        [true, false, false],
        [false, true, true],
        [true, true, true],
    ];
    for (i, active) in phases.into_iter().enumerate() {
        let r = sim.phase(active, 2.0, 1.0);
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
    let mut sim = Sim::new();
    sim.phase([true, true, true], 1.0, 0.5);
    // h2 dies: its messages vanish, the others see their links go.
    sim.rc[2] = None;
    sim.wire.retain(|(to, _)| *to != 2);
    let two: BTreeSet<String> = ["h0", "h1"].iter().map(ToString::to_string).collect();
    for r in sim.rc.iter_mut().flatten() {
        r.set_view(two.clone(), sim.now);
    }
    let r = sim.phase([true, true, false], 2.0, 1.0);
    assert!(
        (r - 1.0).abs() <= 0.01,
        "after the loss: {r:.4} x the limit"
    );
    assert!((sim.total_rate() - LIMIT).abs() < 1e-9);
    // h2 comes back, with a fresh rate control (nothing kept but the policy).
    let mut back = RateControl::new(&nos(), "h2", sim.now).unwrap();
    let all: BTreeSet<String> = (0..3).map(|i| format!("h{i}")).collect();
    back.set_view(all.clone(), sim.now);
    sim.rc[2] = Some(back);
    for r in sim.rc.iter_mut().flatten() {
        r.set_view(all.clone(), sim.now);
    }
    let r = sim.phase([false, false, true], 2.0, 1.0);
    assert!(
        (r - 1.0).abs() <= 0.01,
        "after the return, all on h2: {r:.4}"
    );
}

#[test]
fn a_response_from_another_view_is_not_applied() {
    let mut sim = Sim::new();
    // Drain h0's bucket so that it asks.
    sim.phase([true, false, false], 0.01, 0.005);
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
    let r0 = sim.rc[0].as_mut().unwrap();
    let old_view = r0.view().1;
    let forged = RateExchange {
        from: asked[0].to,
        to: asked[0].from,
        view: old_view ^ 1,
        rate: 0.5,
        tokens: 100.0,
        ..asked[0]
    };
    r0.on_response(&forged, sim.now);
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
