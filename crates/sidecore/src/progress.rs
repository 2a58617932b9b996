//! Progress on long work (solves, sweeps, calibration, demo runs): the
//! indicatif bar or spinner the benchmarks use too (`sidecore_plot::progress`),
//! shown only when stdout is a terminal.

pub use sidecore_plot::progress::Progress;
