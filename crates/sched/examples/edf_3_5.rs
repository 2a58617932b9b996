//! Prints the §6.3.5 reproduction: plain EDF against `<EDF>++` (and the cyclic
//! executive and work-conserving EDF) on the documented twenty-task workload,
//! beside the dissertation's figures.
//!
//! `cargo run --release -p sidecore-sched --example edf_3_5 [-- SEED...]`
//! (default seed 1; with several seeds, one table per seed).

use std::process::ExitCode;

fn main() -> ExitCode {
    let seeds: Result<Vec<u64>, _> = std::env::args().skip(1).map(|a| a.parse::<u64>()).collect();
    let seeds = match seeds {
        Ok(s) if s.is_empty() => vec![1],
        Ok(s) => s,
        Err(e) => {
            eprintln!("edf_3_5: seeds must be unsigned integers: {e}");
            return ExitCode::FAILURE;
        }
    };
    for seed in seeds {
        match sidecore_sched::section_6_3_5(seed) {
            Ok(report) => println!("{report}"),
            Err(e) => {
                eprintln!("edf_3_5: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
