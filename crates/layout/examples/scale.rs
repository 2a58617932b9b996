//! Solves the benchmark's generated problems once each and prints sizes, times,
//! objective values and the greedy baseline: a quick look without criterion.
//! `cargo run --release -p sidecore-layout --example scale [offcodes pes seed]`

#[path = "../benches/gen/mod.rs"]
mod generator;

use std::time::Instant;

use sidecore_layout::{SolveOptions, check, greedy, solve};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes: Vec<(usize, usize)> = if args.len() >= 2 {
        vec![(args[0], args[1])]
    } else {
        [10, 100, 1000]
            .iter()
            .flat_map(|&n| [4, 16, 64].map(move |k| (n, k)))
            .collect()
    };
    let seed = args.get(2).copied().unwrap_or(1) as u64;
    for (n, k) in sizes {
        let p = generator::problem(n, k, seed);
        let t = Instant::now();
        let g = greedy(&p).expect("valid");
        let tg = t.elapsed();
        let gq = g.as_ref().map(|a| check(&p, a).expect("greedy feasible"));
        let opts = SolveOptions {
            explain: false,
            bandwidth_objective: std::env::var("NO_BW").is_err(),
            solver_log: std::env::var("LOG").is_ok(),
            aggregate: std::env::var("NO_AGG").is_err(),
            time_limit: std::env::var("TL")
                .ok()
                .and_then(|t| t.parse().ok())
                .map(std::time::Duration::from_secs_f64),
            ..Default::default()
        };
        let t = Instant::now();
        match solve(&p, &opts) {
            Ok(l) => {
                let dt = t.elapsed();
                check(&p, &l.assignment).expect("solution feasible");
                println!(
                    "{n:5} x {k:3}: {:8.3} ms  w={} cross={}  greedy {:.3} ms {:?}  | {}",
                    dt.as_secs_f64() * 1e3,
                    l.offloaded_weight,
                    l.cross_bandwidth,
                    tg.as_secs_f64() * 1e3,
                    gq,
                    l.stats
                );
            }
            Err(e) => println!("{n:5} x {k:3}: {e}"),
        }
    }
}
