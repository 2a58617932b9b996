//! Prints a generated layout with every reason, as `sidecore layout` would show it,
//! and how long the explanations took.
//! `cargo run --release -p sidecore-layout --example explain [offcodes pes seed]`

#[path = "../benches/gen/mod.rs"]
mod generator;

use sidecore_layout::{SolveOptions, solve};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n, k, seed) = (
        args.first().copied().unwrap_or(12),
        args.get(1).copied().unwrap_or(4),
        args.get(2).copied().unwrap_or(1) as u64,
    );
    let mut p = generator::problem(n, k, seed);
    if std::env::var("SHRINK_CORES").is_ok() {
        // Make it infeasible: cores too small for the offcodes without a host build.
        for pe in p.pes.iter_mut().filter(|pe| pe.id.starts_with("core:")) {
            pe.cpu = 0.05;
        }
    }
    let t = std::time::Instant::now();
    match solve(&p, &SolveOptions::default()) {
        Ok(l) => {
            println!("{l}");
            println!("{}", l.stats);
            println!(
                "explanations took {:.3} s",
                l.stats.explain_time.as_secs_f64()
            );
        }
        Err(e) => println!("{e}\n(after {:.3} s)", t.elapsed().as_secs_f64()),
    }
}
