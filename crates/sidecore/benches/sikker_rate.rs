//! SE-TRE on real time, measured: three `sidecore sikker agent`s in three
//! network namespaces, linked over mutual TLS, hold `src → dst` at 4 MB/s while
//! senders in three cgroups offer load in RateSim-like phases (all three, all
//! on one, on the other two, all three). The receiver counts bytes per 50 ms.
//! Per phase it reports the steady aggregate, the time until the aggregate
//! (over a sliding 250 ms) stays within 2% of the limit, and the overshoot
//! (the largest sliding 250 ms aggregate above the limit). Beside each, the
//! same code on simulated time (`sikker-agent::rate::sim`: the same agents'
//! rate control with a 50 µs network and no CPU noise) — the prediction.
//!
//! Run (as root): `cargo bench -p sidecore --bench sikker_rate`.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // benchmark code: a failed unwrap is a failed run

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::sikker::{Cluster, PLACEMENT, Proc, policy_text, unix_ms, windows};
use common::*;
use sidecore_sikker_agent::rate::sim::Sim;
use sidecore_sikker_policy::{Nos, parse_placement, parse_policy};

const LIMIT_BPS: f64 = 4_000_000.0;
const GBPS: f64 = 0.032;
const BUCKET: u64 = 32768;
const SIZE: usize = 8192;
const WIN_MS: u128 = 50;
const SLIDE: usize = 5; // 5 × 50 ms = 250 ms
const PHASE_MS: u64 = 3000;

/// (steady aggregate, convergence ms, overshoot) of one phase's 50-ms windows.
fn metrics(w: &[f64]) -> (f64, Option<u128>, f64) {
    let per_win = LIMIT_BPS * WIN_MS as f64 / 1000.0;
    let slide: Vec<f64> = w
        .windows(SLIDE)
        .map(|x| x.iter().sum::<f64>() / (per_win * SLIDE as f64))
        .collect();
    let steady_from = w.len() / 2;
    let steady = w[steady_from..].iter().sum::<f64>() / (per_win * (w.len() - steady_from) as f64);
    // The first sliding window from which every later one is within 2%.
    let conv = (0..slide.len())
        .find(|&i| slide[i..].iter().all(|r| (r - 1.0).abs() <= 0.02))
        .map(|i| (i + SLIDE) as u128 * WIN_MS);
    let over = slide.iter().copied().fold(0.0f64, f64::max) - 1.0;
    (steady, conv, over.max(0.0))
}

fn predicted(phases: &[[bool; 3]]) -> Vec<(f64, Option<u128>, f64)> {
    let policy = parse_policy(
        "p.toml",
        &policy_text(|s| format!("/none/{s}"), GBPS, BUCKET),
    )
    .unwrap();
    let placement = parse_placement("h.toml", PLACEMENT, &policy).unwrap();
    let nos = Nos::compile(policy, &placement).unwrap();
    let step = 50_000.0;
    let mut sim = Sim::new(&nos, 3, 0, SIZE, step);
    let per_win = (WIN_MS as f64 * 1e6 / step) as usize;
    phases
        .iter()
        .map(|a| {
            let bytes = sim.run(a, PHASE_MS as f64 / 1000.0);
            let w: Vec<f64> = bytes
                .chunks(per_win)
                .map(|c| c.iter().sum::<usize>() as f64)
                .collect();
            metrics(&w)
        })
        .collect()
}

fn main() {
    if !sidecore_testbed::testing::root() {
        println!("the Sikker rate benchmark needs root (namespaces and cgroups)");
        return;
    }
    let phases = [
        [true, true, true],
        [true, false, false],
        [false, true, true],
        [true, true, true],
    ];
    let c = Cluster::up("sikker-rate-bench", "10.208.0.0/16", "scsr", GBPS, BUCKET);
    let agents: Vec<Proc> = ["h0", "h1", "h2"]
        .iter()
        .map(|h| c.agent(h, &c.tls, "a"))
        .collect();
    let linked = |h: &str, n: usize| {
        std::fs::read_to_string(c.log(h, "a"))
            .is_ok_and(|s| s.matches("linked to host").count() >= n)
    };
    assert!(wait_for(
        || ["h0", "h1", "h2"].iter().all(|h| linked(h, 2)),
        10
    ));
    let total_ms = PHASE_MS * phases.len() as u64 + 2000;
    let meter = c.meter(WIN_MS, total_ms);
    std::thread::sleep(Duration::from_millis(300));
    let mut starts = Vec::new();
    let bar = sidecore_plot::progress::Progress::bar(phases.len() as u64, "phase 0");
    for (k, a) in phases.iter().enumerate() {
        bar.say(format!("phase {k}: {PHASE_MS} ms"));
        let t0 = unix_ms();
        starts.push(t0);
        let loads: Vec<Proc> = (0..3)
            .filter(|&i| a[i])
            .map(|i| c.load(i, SIZE, PHASE_MS))
            .collect();
        for mut l in loads {
            let _ = wait_exit(&mut l.0, 20);
        }
        bar.step("phase");
    }
    drop(bar);
    let out = meter.wait_with_output().unwrap();
    drop(agents);
    let windows: Vec<(u128, f64)> = windows(&String::from_utf8_lossy(&out.stdout))
        .into_iter()
        .map(|(t, b, _)| (t, b as f64))
        .collect();
    let pred = predicted(&phases);
    println!(
        "limit 4 MB/s, 8 KiB messages, phases of {PHASE_MS} ms; sliding {} ms",
        SLIDE as u128 * WIN_MS
    );
    println!(
        "| phase (senders) | steady x limit | converged after ms | overshoot | predicted steady | predicted converged ms | predicted overshoot |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let (mut groups, mut measured, mut predicted_steady) = (Vec::new(), Vec::new(), Vec::new());
    for (k, a) in phases.iter().enumerate() {
        // The first whole window after the phase starts, to its end.
        let t0 = starts[k];
        let w: Vec<f64> = windows
            .iter()
            .filter(|x| {
                x.0 >= t0.div_ceil(WIN_MS) * WIN_MS && x.0 + WIN_MS <= t0 + u128::from(PHASE_MS)
            })
            .map(|x| x.1)
            .collect();
        let (s, c, o) = metrics(&w);
        let (ps, pc, po) = pred[k];
        let who: Vec<String> = (0..3).filter(|&i| a[i]).map(|i| format!("s{i}")).collect();
        let ms = |c: Option<u128>| c.map_or_else(|| "never".to_string(), |c| c.to_string());
        groups.push(format!("{k} ({})", who.join(",")));
        measured.push(s);
        predicted_steady.push(ps);
        println!(
            "| {k} ({}) | {s:.4} | {} | {:.1}% | {ps:.4} | {} | {:.1}% |",
            who.join(","),
            ms(c),
            o * 100.0,
            ms(pc),
            po * 100.0
        );
    }
    let svg = sidecore_plot::out_dir().join("sikker-rate.svg");
    match sidecore_plot::grouped_bars(
        &svg,
        "SE-TRE on real time: steady rate per phase, as a multiple of the limit",
        "steady x limit",
        &groups,
        &[
            sidecore_plot::Series::new("three agents, measured", measured),
            sidecore_plot::Series::new("simulated prediction", predicted_steady),
        ],
    ) {
        Ok(()) => println!("plot: {}", svg.display()),
        Err(e) => eprintln!("plot not written: {e}"),
    }
}
