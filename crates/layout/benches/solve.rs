//! Layout solve time for 10, 100 and 1,000 offcodes on 4, 16 and 64 PEs, with the
//! greedy first-fit placement (deployment in priority order, as HYDRA's runtime does)
//! and the offload-objective-only MILP measured side by side as baselines. Before
//! timing, one solve per size prints the quality reached (weights, bandwidth, status
//! and gap of each stage) so time can be read together with what it bought.
//!
//! `cargo bench -p sidecore-layout --bench solve`
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

#[path = "gen/mod.rs"]
mod generator;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sidecore_layout::{SolveOptions, check, greedy, solve};

const SIZES: [usize; 3] = [10, 100, 1000];
const PES: [usize; 3] = [4, 16, 64];
/// The target budget: 1,000 offcodes on 64 PEs in under 1 s. `LAYOUT_BUDGET=10`
/// (seconds) changes it, e.g. to see what a longer solve buys.
fn budget() -> Duration {
    std::env::var("LAYOUT_BUDGET")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs_f64)
}

fn opts(bandwidth: bool) -> SolveOptions {
    SolveOptions {
        time_limit: Some(budget()),
        explain: false,
        bandwidth_objective: bandwidth,
        ..Default::default()
    }
}

fn quality() {
    eprintln!("quality with a {:?} budget", budget());
    eprintln!(
        "| size | greedy weight | milp weight | ratio | weight bound | offload stage | greedy cross | milp cross | bandwidth stage | solve time |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|");
    let bar = sidecore_plot::progress::Progress::bar((SIZES.len() * PES.len()) as u64, "quality");
    for n in SIZES {
        for k in PES {
            bar.say(format!("quality: {n} offcodes on {k} PEs"));
            let p = generator::problem(n, k, 1);
            let g = greedy(&p)
                .expect("valid problem")
                .expect("greedy finds a layout");
            let (gw, gc) = check(&p, &g).expect("greedy layout is feasible");
            let l = solve(&p, &opts(true)).expect("solvable");
            check(&p, &l.assignment).expect("layout is feasible");
            let stage = |name: &str| {
                l.stats
                    .stages
                    .iter()
                    .find(|s| s.name == name)
                    .map_or("-".to_string(), |s| {
                        let status = s.status.split(" (").next().unwrap_or("");
                        if s.gap == 0.0 {
                            status.to_string()
                        } else {
                            format!("{status}, gap {:.2}%", 100.0 * s.gap)
                        }
                    })
            };
            // The offload objective's upper bound (from the aggregated relaxation when
            // it ran): objective * (1 + gap).
            let bound = l
                .stats
                .stages
                .iter()
                .find(|s| s.name == "offload")
                .map_or(f64::NAN, |s| s.objective * (1.0 + s.gap));
            bar.suspend(|| {
                eprintln!(
                    "| {n}x{k} | {gw} | {} | {:.3} | {bound:.0} | {} | {gc} | {} | {} | {:.3} s |",
                    l.offloaded_weight,
                    l.offloaded_weight as f64 / gw.max(1) as f64,
                    stage("offload"),
                    l.cross_bandwidth,
                    stage("bandwidth"),
                    l.stats.time.as_secs_f64(),
                );
            });
            bar.step("quality");
        }
    }
}

fn bench(c: &mut Criterion) {
    quality();
    let mut group = c.benchmark_group("solve");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for n in SIZES {
        for k in PES {
            let p = generator::problem(n, k, 1);
            let id = format!("{n}x{k}");
            group.bench_with_input(BenchmarkId::new("greedy-first-fit", &id), &p, |b, p| {
                b.iter(|| black_box(greedy(p).expect("valid")));
            });
            let o1 = opts(false);
            group.bench_with_input(BenchmarkId::new("milp-offload-only", &id), &p, |b, p| {
                b.iter(|| black_box(solve(p, &o1).expect("solvable")));
            });
            let o2 = opts(true);
            group.bench_with_input(BenchmarkId::new("milp-lexicographic", &id), &p, |b, p| {
                b.iter(|| black_box(solve(p, &o2).expect("solvable")));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
