//! Layout solve time for 10, 100 and 1,000 offcodes on 4, 16 and 64 PEs, with the
//! greedy first-fit placement (deployment in priority order, as HYDRA's runtime does)
//! and the offload-objective-only MILP measured side by side as baselines. Before
//! timing, one solve per size prints the quality reached (weights, bandwidth, status
//! and gap of each stage) so time can be read together with what it bought.
//!
//! `cargo bench -p sidecore-layout --bench solve`

#[path = "gen/mod.rs"]
mod generator;

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sidecore_layout::{SolveOptions, check, greedy, solve};

const SIZES: [usize; 3] = [10, 100, 1000];
const PES: [usize; 3] = [4, 16, 64];
/// The target budget: 1,000 offcodes on 64 PEs in under 1 s.
const BUDGET: Duration = Duration::from_secs(1);

fn opts(bandwidth: bool) -> SolveOptions {
    SolveOptions {
        time_limit: Some(BUDGET),
        explain: false,
        bandwidth_objective: bandwidth,
        ..Default::default()
    }
}

fn quality() {
    eprintln!(
        "size        | greedy weight | milp weight | weight ratio | offload stage         | greedy cross | milp cross | bandwidth stage"
    );
    for n in SIZES {
        for k in PES {
            let p = generator::problem(n, k, 1);
            let g = greedy(&p)
                .expect("valid problem")
                .expect("greedy finds a layout");
            let (gw, gc) = check(&p, &g).expect("greedy layout is feasible");
            let l = solve(&p, &opts(true)).expect("solvable");
            check(&p, &l.assignment).expect("layout is feasible");
            let stage = |i: usize| {
                l.stats.stages.get(i).map_or("-".to_string(), |s| {
                    format!(
                        "{} gap {:.4} in {:.2}s",
                        s.status,
                        s.gap,
                        s.time.as_secs_f64()
                    )
                })
            };
            eprintln!(
                "{n:4} x {k:2}   | {gw:13} | {:11} | {:12.3} | {:21} | {gc:12} | {:10} | {}",
                l.offloaded_weight,
                l.offloaded_weight as f64 / gw.max(1) as f64,
                stage(0),
                l.cross_bandwidth,
                stage(1),
            );
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
                b.iter(|| black_box(greedy(p).expect("valid")))
            });
            let o1 = opts(false);
            group.bench_with_input(BenchmarkId::new("milp-offload-only", &id), &p, |b, p| {
                b.iter(|| black_box(solve(p, &o1).expect("solvable")))
            });
            let o2 = opts(true);
            group.bench_with_input(BenchmarkId::new("milp-lexicographic", &id), &p, |b, p| {
                b.iter(|| black_box(solve(p, &o2).expect("solvable")))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
