//! HYDRA's offloading layout (dissertation Chapter 7, constraints of Figure 4.7) as a
//! mixed-integer program, solved with HiGHS through `good_lp`.
//!
//! The model, with the seed's indexing errors fixed as the digest explains:
//! - one placement per offcode (7.1a, per offcode), variables only on can-run pairs (7.1b);
//! - pull: same PE (pull-connected offcodes are merged into one group first);
//!   gang: `O_a = O_b`; asymmetric gang `a -> b`: `O_a <= O_b`; link: nothing;
//!   `O_n` is the sum of `X_n^k` over the non-host PEs;
//! - per-PE capacity for CPU share, memory and (optional) slots;
//! - lexicographic objectives: maximise the priority-weighted offload, then minimise the
//!   cross-PE channel bandwidth with a same-PE indicator per flow and PE.
//!
//! An infeasible problem is explained by an irreducible set of conflicting constraints
//! found with a deletion filter; every offcode gets a reason for where it went.
//!
//! Sans-IO: nothing here touches files, sockets or the clock beyond timing the solve.

mod explain;
mod greedy;
mod model;
mod types;
mod validate;

pub use greedy::{check, greedy};
pub use types::*;

use std::time::Instant;

/// Solve the layout: validate, solve both objectives lexicographically and (if
/// `opts.explain`) give every offcode a reason. An infeasible problem gets a small,
/// irreducible conflict.
pub fn solve(problem: &Problem, opts: &SolveOptions) -> Result<Layout, LayoutError> {
    let start = Instant::now();
    validate::validate(problem)?;
    let mut layout = model::optimise(problem, opts, start)?;
    if opts.explain {
        let t = Instant::now();
        layout.reasons = explain::reasons(problem, opts, &layout)?;
        layout.stats.explain_time = t.elapsed();
    } else {
        layout.reasons = explain::brief_reasons(problem, &layout);
    }
    layout.stats.time = start.elapsed();
    Ok(layout)
}
