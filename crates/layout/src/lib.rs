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
//! Large problems: PEs that are interchangeable (same capacities, same candidacy and
//! demand for every offcode) are first merged into classes. That aggregated model is a
//! relaxation: its optimum bounds the offloaded weight, and its solution, packed back
//! onto the real PEs, is the starting point (and is optimal whenever it meets the
//! bound). Within `SolveOptions::time_limit` the best layout found is returned and
//! `SolveStats::stages` says, per stage, whether it was proved optimal and the gap.
//!
//! Sans-IO: nothing here touches files, sockets or the clock beyond timing the solve.
//!
//! ```
//! use sidecore_layout::{Candidate, ConstraintSpec, OffcodeSpec, PeSpec, Problem, SolveOptions, solve};
//! use sidecore_types::{ConstraintKind, PeKind};
//!
//! let pe = |id: &str, kind| PeSpec { id: id.into(), kind, cpu: 1.0, memory_bytes: 1 << 30, slots: None };
//! let oc = |name: &str, pes: &[usize]| OffcodeSpec {
//!     name: name.into(),
//!     weight: 2,
//!     candidates: pes.iter().map(|&pe| Candidate { pe, cpu: 0.4, memory_bytes: 1 << 20 }).collect(),
//! };
//! let problem = Problem {
//!     pes: vec![pe("host", PeKind::Host), pe("core:1", PeKind::Core)],
//!     offcodes: vec![oc("socket", &[0, 1]), oc("checksum", &[0, 1])],
//!     constraints: vec![ConstraintSpec {
//!         kind: ConstraintKind::Pull,
//!         a: 0,
//!         b: 1,
//!         origin: "examples/socket.toml:30:1".into(),
//!     }],
//!     flows: vec![],
//!     links: vec![],
//! };
//! let layout = solve(&problem, &SolveOptions::default()).unwrap();
//! assert_eq!(layout.assignment, vec![1, 1]);
//! assert_eq!(
//!     layout.reasons[0].to_string(),
//!     "`socket` offloaded to core:1: offloading it adds weight 2; \
//!      pulled with `checksum` (examples/socket.toml:30:1)"
//! );
//! ```

mod aggregate;
mod explain;
mod greedy;
mod milp;
mod optimise;
mod prep;
mod types;
mod validate;
mod verify;

pub use greedy::greedy;
pub use types::*;
pub use verify::{Violation, check};

use std::time::{Duration, Instant};

use prep::{Active, assignment, prepare};

/// Solve the layout: validate, solve both objectives lexicographically and (if
/// `opts.explain`) give every offcode a reason. An infeasible problem gets a small,
/// irreducible conflict.
pub fn solve(problem: &Problem, opts: &SolveOptions) -> Result<Layout, LayoutError> {
    let start = Instant::now();
    validate::validate(problem)?;
    let mut layout = optimum(problem, opts, start)?;
    if opts.explain {
        let t = Instant::now();
        layout.reasons = explain::reasons(problem, opts, &layout)?;
        layout.stats.explain_time = t.elapsed();
    } else {
        layout.reasons = explain::brief_reasons(problem, &layout);
    }
    Ok(layout)
}

/// Both objectives on the validated problem: the optimum (or the best found within
/// the budget), or an explained infeasibility.
fn optimum(p: &Problem, opts: &SolveOptions, start: Instant) -> Result<Layout, LayoutError> {
    let deadline = opts.time_limit.map(|t| start + t);
    let active = Active::all(p);
    let prep = prepare(p, &active);
    let Some(opt) = optimise::optimise_prep(p, &prep, opts, deadline, true)? else {
        return Err(LayoutError::Infeasible(explain::conflict(p, &active)?));
    };
    let (assignment, offloaded_weight, cross_bandwidth) = assignment(p, &prep, &opt.choice);
    verify::assert_feasible(p, &assignment, "the MILP");
    Ok(Layout {
        assignment,
        offloaded_weight,
        cross_bandwidth,
        reasons: Vec::new(),
        stats: SolveStats {
            groups: prep.groups.len(),
            vars: opt.vars,
            constraints: opt.rows,
            time: start.elapsed(),
            explain_time: Duration::ZERO,
            stages: opt.stages,
        },
    })
}
