//! The integer program on prepared groups, solved with HiGHS: variables on can-run
//! pairs, the assignment, gang and capacity rows, and the two models the solver runs
//! (maximise the offloaded weight; then, with it held, maximise the flow bandwidth
//! kept on one PE), plus plain feasibility for the deletion filter.
//!
//! `good_lp` builds the model; the `highs` bindings underneath control the solver
//! (options, warm start, status and gap), which `good_lp`'s own `solve` hides.

use good_lp::solvers::highs::highs;
use good_lp::{
    Expression, IntoAffineExpression, ProblemVariables, SolverModel, Variable, variable,
};
use highs::{HighsModelStatus, HighsSolutionStatus};

use crate::prep::{Active, GCand, Prep, RESOURCES, SharedPair, fits, prepare};
use crate::types::{LayoutError, Problem};

/// Above this many columns HiGHS runs without presolve (see `run`).
pub(crate) const PRESOLVE_OFF_COLUMNS: usize = 20_000;

/// Seconds of HiGHS time per column and row below which a model is not worth
/// solving (see `useful_time`).
const SECONDS_PER_ENTRY: f64 = 3e-5;

/// The least time limit handed to HiGHS, in seconds.
const MIN_TIME_LIMIT_S: f64 = 0.001;

/// How far a row without variables may miss its bounds before it cannot hold.
const EMPTY_ROW_TOLERANCE: f64 = 1e-9;

/// Half a unit of weight: weights are integers, so `>= w - 0.5` holds `>= w`.
const HALF_WEIGHT: f64 = 0.5;

/// The least time worth giving HiGHS on a model of this size: below it, it would
/// not finish the root LP (measured on this machine: ~1.1 s for 37k columns and 1.2k
/// rows without presolve) and would return only the starting point it was given.
#[allow(clippy::cast_precision_loss)] // model sizes far below 2^53
pub(crate) fn useful_time(cols: usize, rows: usize) -> f64 {
    (cols + rows) as f64 * SECONDS_PER_ENTRY
}

/// A variable with its column index (good_lp keeps the index private; columns are
/// numbered in the order variables are added).
#[derive(Debug, Clone, Copy)]
struct V {
    v: Variable,
    i: usize,
}

fn add_var(vars: &mut ProblemVariables, def: good_lp::VariableDefinition) -> V {
    let i = vars.len();
    V {
        v: vars.add(def),
        i,
    }
}

/// A linear row `lo <= sum(terms) <= hi`.
struct Row {
    terms: Vec<(Variable, f64)>,
    lo: f64,
    hi: f64,
}

impl Row {
    /// A row without variables whose bounds exclude zero: no assignment satisfies it.
    fn cannot_hold(&self) -> bool {
        self.terms.is_empty() && (self.lo > EMPTY_ROW_TOLERANCE || self.hi < -EMPTY_ROW_TOLERANCE)
    }
}

/// A built model: variables per group candidate, optional flow variables, rows.
struct Mip {
    vars: ProblemVariables,
    x: Vec<Vec<V>>,
    /// Link-cap products `Y >= X_g^i + X_h^j - 1`: (Y, g, i, h, j).
    ys: Vec<(V, usize, usize, usize, usize)>,
    rows: Vec<Row>,
    /// A row without variables that cannot hold: the model is infeasible as built.
    trivially_infeasible: bool,
}

/// `sign` times `O_g`, the sum of group `g`'s variables on non-host PEs.
fn o_terms(prep: &Prep, x: &[Vec<V>], g: usize, sign: f64) -> Vec<(Variable, f64)> {
    prep.groups[g]
        .cands
        .iter()
        .zip(&x[g])
        .filter(|(c, _)| !prep.is_host(c.pe))
        .map(|(_, v)| (v.v, sign))
        .collect()
}

/// The model of HYDRA's Chapter 7 on groups: one binary per group candidate, the
/// assignment, gang and capacity rows.
fn build(prep: &Prep) -> Mip {
    let mut vars = ProblemVariables::new();
    let x: Vec<Vec<V>> = prep
        .groups
        .iter()
        .map(|g| {
            g.cands
                .iter()
                .map(|_| add_var(&mut vars, variable().binary()))
                .collect()
        })
        .collect();
    // (7.1a) per group; (7.1b) by construction: no variable off the can-run row.
    let trivially_infeasible = x.iter().any(Vec::is_empty);
    let mut rows: Vec<Row> = x
        .iter()
        .filter(|xs| !xs.is_empty())
        .map(|xs| Row {
            terms: xs.iter().map(|v| (v.v, 1.0)).collect(),
            lo: 1.0,
            hi: 1.0,
        })
        .collect();
    rows.extend(gang_rows(prep, &x));
    rows.extend(capacity_rows(prep, &x));
    let ys = link_rows(prep, &x, &mut vars, &mut rows);
    Mip {
        vars,
        x,
        ys,
        rows,
        trivially_infeasible,
    }
}

impl Mip {
    /// The column vector of a group choice (for a warm start), products included.
    fn start_cols(&self, choice: &[usize]) -> Vec<f64> {
        let mut cols = vec![0.0; self.vars.len()];
        for (g, &i) in choice.iter().enumerate() {
            cols[self.x[g][i].i] = 1.0;
        }
        for &(y, g, i, h, j) in &self.ys {
            if choice[g] == i && choice[h] == j {
                cols[y.i] = 1.0;
            }
        }
        cols
    }
}

/// Bus bandwidth (7.8)-(7.9), linearised: for each capped link (k, l) and each
/// flow (g, h, w) that could cross it, `Y >= X_g^k + X_h^l - 1` (and the other way
/// round); `sum w * Y <= B_kl`. `Y` is continuous in [0, 1]: the cap row pushes it
/// to the product of the binaries. Returns the products.
fn link_rows(
    prep: &Prep,
    x: &[Vec<V>],
    vars: &mut ProblemVariables,
    rows: &mut Vec<Row>,
) -> Vec<(V, usize, usize, usize, usize)> {
    let cand = |g: usize, pe: usize| prep.groups[g].cands.iter().position(|c| c.pe == pe);
    let mut ys = Vec::new();
    for l in &prep.links {
        let mut terms = Vec::new();
        let total: f64 = l.flows.iter().map(|f| f.2).sum();
        for &(g, h, w) in &l.flows {
            for (k, m) in [(l.a, l.b), (l.b, l.a)] {
                let (Some(i), Some(j)) = (cand(g, k), cand(h, m)) else {
                    continue;
                };
                let y = add_var(vars, variable().min(0.0).max(1.0));
                rows.push(Row {
                    terms: vec![(y.v, 1.0), (x[g][i].v, -1.0), (x[h][j].v, -1.0)],
                    lo: -1.0,
                    hi: f64::INFINITY,
                });
                terms.push((y.v, w));
                ys.push((y, g, i, h, j));
            }
        }
        if !terms.is_empty() && !fits(total, l.cap_bps) {
            let scale = l.cap_bps.max(1.0);
            rows.push(Row {
                terms: terms.into_iter().map(|(v, w)| (v, w / scale)).collect(),
                lo: f64::NEG_INFINITY,
                hi: l.cap_bps / scale,
            });
        }
    }
    ys
}

/// gang (7.3): `O_a - O_b = 0`; asym-gang a -> b (7.4, direction of Figure 4.7):
/// `O_a - O_b <= 0`.
fn gang_rows(prep: &Prep, x: &[Vec<V>]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &(a, b, sym) in &prep.gangs {
        let mut terms = o_terms(prep, x, a, 1.0);
        terms.extend(o_terms(prep, x, b, -1.0));
        // A group with only non-host candidates has O = 1 through (7.1a); one with
        // only the host has O = 0. The expression above is exact either way.
        let lo = if sym { 0.0 } else { f64::NEG_INFINITY };
        if terms.is_empty() {
            continue;
        }
        rows.push(Row { terms, lo, hi: 0.0 });
    }
    rows
}

/// Capacity rows (7.5)-(7.7), scaled by the capacity so all rows are O(1); rows
/// that can never bind are left out.
fn capacity_rows(prep: &Prep, x: &[Vec<V>]) -> Vec<Row> {
    let kk = prep.caps.len();
    let mut by_pe: Vec<Vec<(usize, usize)>> = vec![Vec::new(); kk];
    for (g, grp) in prep.groups.iter().enumerate() {
        for (i, c) in grp.cands.iter().enumerate() {
            by_pe[c.pe].push((g, i));
        }
    }
    let mut rows = Vec::new();
    for (k, list) in by_pe.iter().enumerate() {
        for r in 0..RESOURCES {
            let Some(cap) = prep.caps[k][r] else { continue };
            let total: f64 = list
                .iter()
                .map(|&(g, i)| prep.groups[g].cands[i].demand[r])
                .sum();
            if fits(total, cap) {
                continue; // can never bind
            }
            let scale = if cap > 0.0 { cap } else { 1.0 };
            let terms: Vec<(Variable, f64)> = list
                .iter()
                .filter_map(|&(g, i)| {
                    let d = prep.groups[g].cands[i].demand[r];
                    (d > 0.0).then(|| (x[g][i].v, d / scale))
                })
                .collect();
            rows.push(Row {
                terms,
                lo: f64::NEG_INFINITY,
                hi: cap / scale,
            });
        }
    }
    rows
}

/// The outcome of one HiGHS run.
enum Run {
    Solved {
        cols: Vec<f64>,
        optimal: bool,
        gap: f64,
        /// HiGHS's dual bound on the objective.
        bound: f64,
    },
    Infeasible,
}

struct RunSpec<'a> {
    log: bool,
    presolve_off: bool,
    objective: Expression,
    sense_max: bool,
    rel_gap: f64,
    /// In seconds.
    time_limit: Option<f64>,
    start: Option<&'a [f64]>,
}

/// A HiGHS call's error as a `LayoutError`, saying what was being done.
fn solver_error<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> LayoutError + '_ {
    move |e| LayoutError::Solver(format!("{what}: {e:?}"))
}

/// Solve `mip` with `extra_rows`; returns the outcome with the numbers of columns and
/// rows.
///
/// HiGHS's presolve can reduce a model to empty, call it optimal and then find the
/// solution it maps back violates a row; it then reports an error status instead of a
/// result (found by the property test, HiGHS 1.x). A run that errs with presolve on is
/// therefore run once more with presolve off, which solves the model as given.
fn run(
    mip: Mip,
    extra_rows: Vec<Row>,
    spec: RunSpec<'_>,
) -> Result<(Run, usize, usize), LayoutError> {
    let ncols = mip.vars.len();
    let objective = nonzero_objective(spec.objective.clone(), &mip);
    let rows: Vec<Row> = mip.rows.into_iter().chain(extra_rows).collect();
    if rows.iter().any(Row::cannot_hold) {
        return Ok((Run::Infeasible, ncols, 0));
    }
    let build = |presolve_off: bool| -> Result<(highs::Model, usize), LayoutError> {
        let unsolved = if spec.sense_max {
            mip.vars.clone().maximise(objective.clone())
        } else {
            mip.vars.clone().minimise(objective.clone())
        };
        let mut hp = unsolved.using(highs);
        let mut nrows = 0;
        for row in rows.iter().filter(|r| !r.terms.is_empty()) {
            let e: Expression = row.terms.iter().map(|&(v, c)| c * v).sum();
            if row.lo == row.hi {
                hp.add_constraint(e.eq(row.hi));
            } else {
                if row.lo.is_finite() {
                    hp.add_constraint(e.clone().geq(row.lo));
                }
                if row.hi.is_finite() {
                    hp.add_constraint(e.leq(row.hi));
                }
            }
            nrows += 1;
        }
        let mut model = hp
            .try_into_inner()
            .map_err(|e| LayoutError::Solver(format!("building the HiGHS model: {e}")))?;
        configure(&mut model, &spec, presolve_off, ncols)?;
        Ok((model, nrows))
    };
    let (model, nrows) = build(spec.presolve_off)?;
    let solved = match model.try_solve() {
        Ok(solved) => solved,
        Err(_) if !spec.presolve_off => build(true)?.0.try_solve().map_err(|e| {
            LayoutError::Solver(format!(
                "HiGHS failed ({e:?}) on a model of {ncols} columns and {nrows} rows, \
                 with presolve and without"
            ))
        })?,
        Err(e) => {
            return Err(LayoutError::Solver(format!(
                "HiGHS failed ({e:?}) on a model of {ncols} columns and {nrows} rows"
            )));
        }
    };
    Ok((outcome(&solved)?, ncols, nrows))
}

/// HiGHS 1.x returns an error status, not "infeasible", for some infeasible models
/// with an all-zero objective (found by the property test). One nonzero cost avoids
/// it; any solution was optimal anyway.
fn nonzero_objective(objective: Expression, mip: &Mip) -> Expression {
    if objective
        .clone()
        .linear_coefficients()
        .all(|(_, c)| c == 0.0)
        && let Some(v) = mip.x.iter().flatten().next()
    {
        return Expression::from(v.v);
    }
    objective
}

/// Quiet (the highs crate's default) and deterministic (one thread, fixed seed),
/// with the spec's gap, log, presolve, time limit and warm start.
fn configure(
    model: &mut highs::Model,
    spec: &RunSpec<'_>,
    presolve_off: bool,
    ncols: usize,
) -> Result<(), LayoutError> {
    model
        .try_set_option("threads", 1)
        .and_then(|()| model.try_set_option("random_seed", 0))
        .map_err(solver_error("setting HiGHS options"))?;
    model
        .try_set_option("mip_rel_gap", spec.rel_gap)
        .map_err(solver_error("setting HiGHS option mip_rel_gap"))?;
    if spec.log {
        model
            .try_set_option("output_flag", true)
            .and_then(|()| model.try_set_option("log_to_console", true))
            .map_err(solver_error("setting HiGHS options"))?;
    }
    if presolve_off {
        // Measured: at ~37k columns HiGHS's presolve spends 1.5 s to remove a dozen
        // columns, and without it the root LP and rounding come 4x sooner.
        model
            .try_set_option("presolve", "off")
            .map_err(solver_error("setting HiGHS options"))?;
    }
    if let Some(t) = spec.time_limit {
        model
            .try_set_option("time_limit", t.max(MIN_TIME_LIMIT_S))
            .map_err(solver_error("setting HiGHS option time_limit"))?;
    }
    // An infeasible start is discarded by HiGHS; a wrong length would be our bug.
    if let Some(start) = spec.start
        && start.len() == ncols
    {
        model
            .try_set_solution(Some(start), None, None, None)
            .map_err(solver_error("warm start"))?;
    }
    Ok(())
}

/// What a finished HiGHS run amounts to.
fn outcome(solved: &highs::SolvedModel) -> Result<Run, LayoutError> {
    let status = solved.status();
    let has_solution = solved.primal_solution_status() == HighsSolutionStatus::Feasible;
    let bound = || {
        solved
            .double_info_value(c"mip_dual_bound")
            .unwrap_or(f64::NAN)
    };
    match status {
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible => {
            Ok(Run::Infeasible)
        }
        HighsModelStatus::Optimal if has_solution => Ok(Run::Solved {
            cols: solved.get_solution().columns().to_vec(),
            optimal: true,
            gap: solved.mip_gap().max(0.0),
            bound: bound(),
        }),
        HighsModelStatus::ReachedTimeLimit
        | HighsModelStatus::ReachedIterationLimit
        | HighsModelStatus::ReachedSolutionLimit
        | HighsModelStatus::ReachedInterrupt
        | HighsModelStatus::ReachedMemoryLimit => {
            if has_solution {
                Ok(Run::Solved {
                    cols: solved.get_solution().columns().to_vec(),
                    optimal: false,
                    // NaN when no bound is known yet.
                    gap: if solved.mip_gap().is_nan() {
                        f64::INFINITY
                    } else {
                        solved.mip_gap()
                    },
                    bound: bound(),
                })
            } else {
                Err(LayoutError::Solver(format!(
                    "{status:?} before any layout was found"
                )))
            }
        }
        other => Err(LayoutError::Solver(format!(
            "HiGHS ended with status {other:?}"
        ))),
    }
}

/// Is the problem feasible with only the `active` constraint groups?
pub(crate) fn feasible(p: &Problem, active: &Active) -> Result<bool, LayoutError> {
    let prep = prepare(p, active);
    if prep.groups.iter().any(|g| g.cands.is_empty()) {
        return Ok(false);
    }
    let prep = drop_free_groups(prep);
    if prep.groups.is_empty() {
        return Ok(true);
    }
    let mip = build(&prep);
    if mip.trivially_infeasible {
        return Ok(false);
    }
    let spec = RunSpec {
        log: false,
        presolve_off: false,
        objective: Expression::default(),
        sense_max: true,
        rel_gap: 0.0,
        time_limit: None,
        start: None,
    };
    Ok(matches!(run(mip, Vec::new(), spec)?.0, Run::Solved { .. }))
}

/// For feasibility only: drop the groups that can never matter, those in no gang or
/// asym-gang row with a candidate PE on which they use no capacity that is checked.
/// They can always sit there. The deletion filter relaxes most of a large problem,
/// so this keeps its solver calls small.
fn drop_free_groups(prep: Prep) -> Prep {
    if !prep.links.is_empty() {
        return prep; // link rows name groups by index
    }
    let ng = prep.groups.len();
    let mut tied = vec![false; ng];
    for &(a, b, _) in &prep.gangs {
        tied[a] = true;
        tied[b] = true;
    }
    let harmless =
        |c: &GCand| (0..RESOURCES).all(|r| prep.caps[c.pe][r].is_none() || c.demand[r] == 0.0);
    let keep: Vec<bool> = (0..ng)
        .map(|g| tied[g] || !prep.groups[g].cands.iter().any(harmless))
        .collect();
    if keep.iter().all(|&k| k) {
        return prep;
    }
    let mut new_index = vec![usize::MAX; ng];
    let mut groups = Vec::new();
    for (g, grp) in prep.groups.into_iter().enumerate() {
        if keep[g] {
            new_index[g] = groups.len();
            groups.push(grp);
        }
    }
    Prep {
        groups,
        // Not used for feasibility; the offcodes of dropped groups map nowhere.
        group_of: prep.group_of.iter().map(|&g| new_index[g]).collect(),
        host: prep.host,
        caps: prep.caps,
        gangs: prep
            .gangs
            .iter()
            .map(|&(a, b, sym)| (new_index[a], new_index[b], sym))
            .collect(),
        links: Vec::new(), // none: see the guard above
    }
}

/// Group -> candidate index chosen in `cols`.
fn pick(x: &[Vec<V>], cols: &[f64]) -> Vec<usize> {
    x.iter()
        .map(|xs| {
            let mut best = 0;
            for (i, v) in xs.iter().enumerate() {
                if cols[v.i] > cols[xs[best].i] {
                    best = i;
                }
            }
            best
        })
        .collect()
}

/// The outcome of the offload model.
pub(crate) struct OffloadRun {
    /// Group -> candidate index.
    pub choice: Vec<usize>,
    pub weight: u64,
    pub optimal: bool,
    pub gap: f64,
    pub bound: f64,
    pub vars: usize,
    pub rows: usize,
}

/// Maximise the weighted offload on `prep`, starting from `warm` within `limit`
/// seconds; `Ok(None)` when infeasible.
#[allow(clippy::cast_precision_loss)] // weights far below 2^53
pub(crate) fn offload_mip(
    prep: &Prep,
    warm: Option<&[usize]>,
    limit: Option<f64>,
    log: bool,
) -> Result<Option<OffloadRun>, LayoutError> {
    let mip = build(prep);
    if mip.trivially_infeasible {
        return Ok(None);
    }
    let x = mip.x.clone();
    let ncols = mip.vars.len();
    let mut obj = Expression::default();
    for (g, grp) in prep.groups.iter().enumerate() {
        for (i, c) in grp.cands.iter().enumerate() {
            if !prep.is_host(c.pe) {
                obj.add_mul(grp.weight as f64, x[g][i].v);
            }
        }
    }
    let start = warm.map(|w| mip.start_cols(w));
    let spec = RunSpec {
        log,
        presolve_off: ncols > PRESOLVE_OFF_COLUMNS,
        objective: obj,
        sense_max: true,
        rel_gap: 0.0,
        time_limit: limit,
        start: start.as_deref(),
    };
    let (r, vars, rows) = run(mip, Vec::new(), spec)?;
    Ok(match r {
        Run::Infeasible => None,
        Run::Solved {
            cols,
            optimal,
            gap,
            bound,
        } => {
            let choice = pick(&x, &cols);
            let weight = prep.offload_weight(&choice);
            Some(OffloadRun {
                choice,
                weight,
                optimal,
                gap,
                bound: if bound.is_finite() {
                    bound
                } else {
                    f64::INFINITY
                },
                vars,
                rows,
            })
        }
    })
}

/// The bandwidth model's outcome.
pub(crate) struct BandwidthRun {
    /// Group -> candidate index; `None` when the solver did not improve on the start.
    pub choice: Option<Vec<usize>>,
    pub optimal: bool,
    pub gap: f64,
    pub vars: usize,
    pub rows: usize,
}

/// How to run the bandwidth model.
pub(crate) struct BandwidthSpec<'a> {
    /// A feasible group choice to start from.
    pub start: &'a [usize],
    /// The offloaded weight to hold.
    pub min_weight: u64,
    /// In seconds.
    pub limit: Option<f64>,
    pub rel_gap: f64,
    pub log: bool,
}

/// Maximise the flow bandwidth kept on one PE (so minimise cross-PE bandwidth) with
/// the offloaded weight held at `spec.min_weight`, starting from `spec.start`.
pub(crate) fn bandwidth_mip(
    prep: &Prep,
    shared: &[SharedPair],
    spec: &BandwidthSpec<'_>,
) -> Result<BandwidthRun, LayoutError> {
    let mut mip = build(prep);
    let x2 = mip.x.clone();
    let mut obj2 = Expression::default();
    let mut extra = Vec::new();
    let mut z_of: Vec<(V, usize, usize, usize, usize)> = Vec::new();
    for s in shared {
        let (a, b) = (s.a, s.b);
        for &(i, j) in &s.common {
            // Z <= X_a^k and Z <= X_b^k: Z can be 1 only if both are on PE k.
            let z = add_var(&mut mip.vars, variable().min(0.0).max(1.0));
            obj2.add_mul(s.bandwidth_bps, z.v);
            extra.push(Row {
                terms: vec![(z.v, 1.0), (x2[a][i].v, -1.0)],
                lo: f64::NEG_INFINITY,
                hi: 0.0,
            });
            extra.push(Row {
                terms: vec![(z.v, 1.0), (x2[b][j].v, -1.0)],
                lo: f64::NEG_INFINITY,
                hi: 0.0,
            });
            z_of.push((z, a, i, b, j));
        }
    }
    extra.extend(hold_weight(prep, &x2, spec.min_weight));
    let ncols = mip.vars.len();
    let mut start_cols = mip.start_cols(spec.start);
    for &(z, a, i, b, j) in &z_of {
        if spec.start[a] == i && spec.start[b] == j {
            start_cols[z.i] = 1.0;
        }
    }
    let run_spec = RunSpec {
        log: spec.log,
        presolve_off: ncols > PRESOLVE_OFF_COLUMNS,
        objective: obj2,
        sense_max: true,
        rel_gap: spec.rel_gap,
        time_limit: spec.limit,
        start: Some(&start_cols),
    };
    let (r, vars, rows) = run(mip, extra, run_spec)?;
    Ok(match r {
        Run::Solved {
            cols, optimal, gap, ..
        } => BandwidthRun {
            choice: Some(pick(&x2, &cols)),
            optimal,
            gap,
            vars,
            rows,
        },
        // Cannot happen (the start satisfies every row); keep the start.
        Run::Infeasible => BandwidthRun {
            choice: None,
            optimal: false,
            gap: f64::INFINITY,
            vars,
            rows,
        },
    })
}

/// Keep objective 1 at its optimum (weights are integers).
#[allow(clippy::cast_precision_loss)] // weights far below 2^53
fn hold_weight(prep: &Prep, x: &[Vec<V>], min_weight: u64) -> Option<Row> {
    let mut terms = Vec::new();
    for (g, grp) in prep.groups.iter().enumerate() {
        for (i, c) in grp.cands.iter().enumerate() {
            if !prep.is_host(c.pe) && grp.weight > 0 {
                terms.push((x[g][i].v, grp.weight as f64));
            }
        }
    }
    (!terms.is_empty()).then_some(Row {
        terms,
        lo: min_weight as f64 - HALF_WEIGHT,
        hi: f64::INFINITY,
    })
}
