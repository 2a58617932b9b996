//! The integer program: pull groups, variables on can-run pairs, constraint and
//! capacity rows, and the two lexicographic objectives, solved with HiGHS.
//!
//! `good_lp` builds the model; the `highs` bindings underneath control the solver
//! (options, warm start, status and gap), which `good_lp`'s own `solve` hides.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use good_lp::solvers::highs::highs;
use good_lp::{
    Expression, IntoAffineExpression, ProblemVariables, SolverModel, Variable, variable,
};
use highs::{HighsModelStatus, HighsSolutionStatus};
use sidecore_types::{ConstraintKind, PeKind};

use crate::{Layout, LayoutError, Problem, Resource, SolveOptions, SolveStats, StageStats};

/// Which constraint groups are switched on. The deletion filter switches them off one
/// by one; a switched-off can-run row lets the offcode run anywhere (with no demand
/// on PEs outside its row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Active {
    pub canrun: Vec<bool>,
    pub cap: Vec<[bool; 3]>,
    pub cons: Vec<bool>,
    /// An offcode forced off the host (for explaining why it stayed there).
    pub forced: Option<usize>,
}

impl Active {
    pub fn all(p: &Problem) -> Active {
        Active {
            canrun: vec![true; p.offcodes.len()],
            cap: vec![[true; 3]; p.pes.len()],
            cons: vec![true; p.constraints.len()],
            forced: None,
        }
    }
}

/// A candidate PE of a group, with the group's summed demand there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GCand {
    pub pe: usize,
    pub demand: [f64; 3],
}

/// Offcodes merged by pull constraints: they share one PE.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub members: Vec<usize>,
    pub weight: u64,
    pub cands: Vec<GCand>,
}

/// The problem reduced to groups.
#[derive(Debug, Clone)]
pub(crate) struct Prep {
    pub groups: Vec<Group>,
    pub group_of: Vec<usize>,
    pub host: Option<usize>,
    /// Capacity per PE and resource, `None` where the row is off or unlimited.
    pub caps: Vec<[Option<f64>; 3]>,
    /// Active gang (`sym = true`) and asym-gang edges between distinct groups.
    pub gangs: Vec<(usize, usize, bool)>,
}

impl Prep {
    pub fn is_host(&self, pe: usize) -> bool {
        self.host == Some(pe)
    }

    /// Whether `pe`, already using `used`, has room for `demand` more on every
    /// resource it caps.
    pub fn room(&self, pe: usize, used: &[f64; 3], demand: &[f64; 3]) -> bool {
        (0..3).all(|r| self.caps[pe][r].is_none_or(|cap| fits(used[r] + demand[r], cap)))
    }
}

/// Union-find with path halving (tiny; a crate would add nothing here).
pub(crate) struct Dsu(Vec<usize>);
impl Dsu {
    pub fn new(n: usize) -> Dsu {
        Dsu((0..n).collect())
    }
    pub fn find(&mut self, mut x: usize) -> usize {
        while self.0[x] != x {
            self.0[x] = self.0[self.0[x]];
            x = self.0[x];
        }
        x
    }
    pub fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra != rb {
            self.0[ra.max(rb)] = ra.min(rb);
        }
    }
}

pub(crate) fn host_of(p: &Problem) -> Option<usize> {
    p.pes.iter().position(|pe| pe.kind == PeKind::Host)
}

/// Merge pull groups and intersect their can-run rows under `active`.
pub(crate) fn prepare(p: &Problem, active: &Active) -> Prep {
    let n = p.offcodes.len();
    let kk = p.pes.len();
    let host = host_of(p);
    let mut dsu = Dsu::new(n);
    for (i, c) in p.constraints.iter().enumerate() {
        if active.cons[i] && c.kind == ConstraintKind::Pull {
            dsu.union(c.a, c.b);
        }
    }
    let mut root_group: HashMap<usize, usize> = HashMap::new();
    let mut group_of = vec![0; n];
    let mut members: Vec<Vec<usize>> = Vec::new();
    for (i, g) in group_of.iter_mut().enumerate() {
        let r = dsu.find(i);
        let gi = *root_group.entry(r).or_insert_with(|| {
            members.push(Vec::new());
            members.len() - 1
        });
        members[gi].push(i);
        *g = gi;
    }
    let mut count = vec![0usize; kk];
    let mut demand = vec![[0.0f64; 3]; kk];
    let groups = members
        .into_iter()
        .map(|m| {
            count.iter_mut().for_each(|c| *c = 0);
            demand.iter_mut().for_each(|d| *d = [0.0; 3]);
            let mut weight = 0u64;
            for &o in &m {
                let oc = &p.offcodes[o];
                weight += u64::from(oc.weight);
                for c in &oc.candidates {
                    if active.canrun[o] {
                        count[c.pe] += 1;
                    }
                    demand[c.pe][0] += c.cpu;
                    demand[c.pe][1] += c.memory as f64;
                }
                if !active.canrun[o] {
                    count.iter_mut().for_each(|c| *c += 1);
                }
            }
            let forced = active.forced.is_some_and(|f| m.contains(&f));
            let cands = (0..kk)
                .filter(|&k| count[k] == m.len() && !(forced && host == Some(k)))
                .map(|k| GCand {
                    pe: k,
                    demand: [demand[k][0], demand[k][1], m.len() as f64],
                })
                .collect();
            Group {
                members: m,
                weight,
                cands,
            }
        })
        .collect();
    let caps = p
        .pes
        .iter()
        .enumerate()
        .map(|(k, pe)| {
            let on = active.cap[k];
            [
                on[0].then_some(pe.cpu),
                on[1].then_some(pe.memory as f64),
                if on[2] { pe.slots.map(f64::from) } else { None },
            ]
        })
        .collect();
    let mut gangs = Vec::new();
    for (i, c) in p.constraints.iter().enumerate() {
        if !active.cons[i] {
            continue;
        }
        let (ga, gb) = (group_of[c.a], group_of[c.b]);
        match c.kind {
            ConstraintKind::Gang if ga != gb => gangs.push((ga, gb, true)),
            ConstraintKind::AsymGang if ga != gb => gangs.push((ga, gb, false)),
            _ => {}
        }
    }
    Prep {
        groups,
        group_of,
        host,
        caps,
        gangs,
    }
}

/// Resource index in `GCand::demand` and `Prep::caps`.
pub(crate) fn res_index(r: Resource) -> usize {
    match r {
        Resource::Cpu => 0,
        Resource::Memory => 1,
        Resource::Slots => 2,
    }
}

/// Tolerance used when checking capacities: HiGHS's feasibility tolerance on rows
/// scaled by their capacity.
pub(crate) fn fits(used: f64, cap: f64) -> bool {
    used <= cap + 1e-6 * cap.max(1.0)
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

/// Add a candidate's demand to a PE's use.
pub(crate) fn add_demand(used: &mut [f64; 3], d: &[f64; 3]) {
    used.iter_mut().zip(d).for_each(|(u, x)| *u += x);
}

/// Remove a candidate's demand from a PE's use.
pub(crate) fn sub_demand(used: &mut [f64; 3], d: &[f64; 3]) {
    used.iter_mut().zip(d).for_each(|(u, x)| *u -= x);
}

/// A linear row `lo <= sum(terms) <= hi`.
struct Row {
    terms: Vec<(Variable, f64)>,
    lo: f64,
    hi: f64,
}

/// A built model: variables per group candidate, optional flow variables, rows.
struct Mip {
    vars: ProblemVariables,
    x: Vec<Vec<V>>,
    rows: Vec<Row>,
    /// A row without variables that cannot hold: the model is infeasible as built.
    trivially_infeasible: bool,
}

fn o_terms(prep: &Prep, x: &[Vec<V>], g: usize, sign: f64) -> Vec<(Variable, f64)> {
    prep.groups[g]
        .cands
        .iter()
        .zip(&x[g])
        .filter(|(c, _)| !prep.is_host(c.pe))
        .map(|(_, v)| (v.v, sign))
        .collect()
}

fn build(prep: &Prep) -> Mip {
    let mut vars = ProblemVariables::new();
    let mut rows = Vec::new();
    let mut trivially_infeasible = false;
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
    for (g, xs) in x.iter().enumerate() {
        if xs.is_empty() {
            trivially_infeasible = true;
            continue;
        }
        // (7.1a) per group; (7.1b) by construction: no variable off the can-run row.
        let _ = g;
        rows.push(Row {
            terms: xs.iter().map(|v| (v.v, 1.0)).collect(),
            lo: 1.0,
            hi: 1.0,
        });
    }
    for &(a, b, sym) in &prep.gangs {
        // gang (7.3): O_a - O_b = 0; asym-gang a -> b (7.4, direction of Figure 4.7): O_a - O_b <= 0.
        let mut terms = o_terms(prep, &x, a, 1.0);
        terms.extend(o_terms(prep, &x, b, -1.0));
        // A group with only non-host candidates has O = 1 through (7.1a); one with
        // only the host has O = 0. The expression above is exact either way.
        let lo = if sym { 0.0 } else { f64::NEG_INFINITY };
        if terms.is_empty() {
            continue;
        }
        rows.push(Row { terms, lo, hi: 0.0 });
    }
    // Capacity rows (7.5)-(7.7), scaled by the capacity so all rows are O(1).
    let kk = prep.caps.len();
    let mut by_pe: Vec<Vec<(usize, usize)>> = vec![Vec::new(); kk];
    for (g, grp) in prep.groups.iter().enumerate() {
        for (i, c) in grp.cands.iter().enumerate() {
            by_pe[c.pe].push((g, i));
        }
    }
    for (k, list) in by_pe.iter().enumerate() {
        for r in 0..3 {
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
    Mip {
        vars,
        x,
        rows,
        trivially_infeasible,
    }
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
    time_limit: Option<f64>,
    start: Option<&'a [f64]>,
}

fn run(
    mip: Mip,
    extra_rows: Vec<Row>,
    spec: RunSpec<'_>,
) -> Result<(Run, usize, usize), LayoutError> {
    let ncols = mip.vars.len();
    let mut objective = spec.objective;
    if objective
        .clone()
        .linear_coefficients()
        .all(|(_, c)| c == 0.0)
    {
        // HiGHS 1.x returns an error status, not "infeasible", for some infeasible
        // models with an all-zero objective (found by the property test). One
        // nonzero cost avoids it; any solution was optimal anyway.
        if let Some(v) = mip.x.iter().flatten().next() {
            objective = Expression::from(v.v);
        }
    }
    let unsolved = if spec.sense_max {
        mip.vars.maximise(objective)
    } else {
        mip.vars.minimise(objective)
    };
    let mut hp = unsolved.using(highs);
    let mut nrows = 0;
    for row in mip.rows.into_iter().chain(extra_rows) {
        if row.terms.is_empty() {
            if row.lo > 1e-9 || row.hi < -1e-9 {
                return Ok((Run::Infeasible, ncols, nrows));
            }
            continue;
        }
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
    let set = |m: &mut highs::Model, k: &str, v: f64| {
        m.try_set_option(k, v)
            .map_err(|e| LayoutError::Solver(format!("setting HiGHS option {k}: {e:?}")))
    };
    // Quiet (the highs crate's default) and deterministic: one thread, fixed seed.
    model
        .try_set_option("threads", 1)
        .and_then(|_| model.try_set_option("random_seed", 0))
        .map_err(|e| LayoutError::Solver(format!("setting HiGHS options: {e:?}")))?;
    set(&mut model, "mip_rel_gap", spec.rel_gap)?;
    if spec.log {
        model
            .try_set_option("output_flag", true)
            .and_then(|_| model.try_set_option("log_to_console", true))
            .map_err(|e| LayoutError::Solver(format!("setting HiGHS options: {e:?}")))?;
    }
    if spec.presolve_off {
        // Measured: at ~37k columns HiGHS's presolve spends 1.5 s to remove a dozen
        // columns, and without it the root LP and rounding come 4x sooner.
        model
            .try_set_option("presolve", "off")
            .map_err(|e| LayoutError::Solver(format!("setting HiGHS options: {e:?}")))?;
    }
    if let Some(t) = spec.time_limit {
        set(&mut model, "time_limit", t.max(0.001))?;
    }
    // An infeasible start is discarded by HiGHS; a wrong length would be our bug.
    if let Some(start) = spec.start
        && start.len() == ncols
    {
        model
            .try_set_solution(Some(start), None, None, None)
            .map_err(|e| LayoutError::Solver(format!("warm start: {e:?}")))?;
    }
    let solved = model.try_solve().map_err(|e| {
        LayoutError::Solver(format!(
            "HiGHS failed ({e:?}) on a model of {ncols} columns and {nrows} rows"
        ))
    })?;
    let status = solved.status();
    let has_solution = solved.primal_solution_status() == HighsSolutionStatus::Feasible;
    let run = match status {
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible => Run::Infeasible,
        HighsModelStatus::Optimal if has_solution => Run::Solved {
            cols: solved.get_solution().columns().to_vec(),
            optimal: true,
            gap: solved.mip_gap().max(0.0),
            bound: solved
                .double_info_value(c"mip_dual_bound")
                .unwrap_or(f64::NAN),
        },
        HighsModelStatus::ReachedTimeLimit
        | HighsModelStatus::ReachedIterationLimit
        | HighsModelStatus::ReachedSolutionLimit
        | HighsModelStatus::ReachedInterrupt
        | HighsModelStatus::ReachedMemoryLimit => {
            if has_solution {
                Run::Solved {
                    cols: solved.get_solution().columns().to_vec(),
                    optimal: false,
                    // NaN when no bound is known yet.
                    gap: if solved.mip_gap().is_nan() {
                        f64::INFINITY
                    } else {
                        solved.mip_gap()
                    },
                    bound: solved
                        .double_info_value(c"mip_dual_bound")
                        .unwrap_or(f64::NAN),
                }
            } else {
                return Err(LayoutError::Solver(format!(
                    "{status:?} before any layout was found"
                )));
            }
        }
        other => {
            return Err(LayoutError::Solver(format!(
                "HiGHS ended with status {other:?}"
            )));
        }
    };
    Ok((run, ncols, nrows))
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
    let ng = prep.groups.len();
    let mut tied = vec![false; ng];
    for &(a, b, _) in &prep.gangs {
        tied[a] = true;
        tied[b] = true;
    }
    let harmless = |c: &GCand| (0..3).all(|r| prep.caps[c.pe][r].is_none() || c.demand[r] == 0.0);
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

/// Above this many columns HiGHS runs without presolve (see `run`).
const PRESOLVE_OFF_COLUMNS: usize = 20_000;

/// The least time worth giving HiGHS on a model of this size: below it, it would
/// not finish the root LP (measured on this machine: ~1.1 s for 37k columns and 1.2k
/// rows without presolve) and would return only the starting point it was given.
fn useful_time(cols: usize, rows: usize) -> f64 {
    (cols + rows) as f64 * 3e-5
}

/// Above this many columns the bandwidth stage starts with a neighbourhood search,
/// which may use this share of its budget.
const LNS_COLUMNS: usize = 5_000;
const LNS_SHARE: f64 = 0.3;

/// Share of the offload stage's budget the aggregated model may use.
const AGG_SHARE: f64 = 0.5;

/// Share of the remaining time budget the offload stage may use when the bandwidth
/// stage follows.
const STAGE1_SHARE: f64 = 0.5;

/// The outcome of the offload stage on one model.
struct S1 {
    choice: Vec<usize>,
    weight: u64,
    optimal: bool,
    gap: f64,
    bound: f64,
    vars: usize,
    rows: usize,
}

/// Maximise the weighted offload on `prep`; `Ok(None)` when infeasible.
fn stage1(
    prep: &Prep,
    warm: Option<&[usize]>,
    limit: Option<f64>,
    log: bool,
) -> Result<Option<S1>, LayoutError> {
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
    let start = warm.map(|w| {
        let mut cols = vec![0.0; ncols];
        for (g, &i) in w.iter().enumerate() {
            cols[x[g][i].i] = 1.0;
        }
        cols
    });
    let (r, vars, rows) = run(
        mip,
        Vec::new(),
        RunSpec {
            log,
            presolve_off: ncols > PRESOLVE_OFF_COLUMNS,
            objective: obj,
            sense_max: true,
            rel_gap: 0.0,
            time_limit: limit,
            start: start.as_deref(),
        },
    )?;
    Ok(match r {
        Run::Infeasible => None,
        Run::Solved {
            cols,
            optimal,
            gap,
            bound,
        } => {
            let choice = pick(&x, &cols);
            let weight = offload_weight(prep, &choice);
            Some(S1 {
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

/// The problem with identical PEs merged into classes.
struct Aggregate {
    prep: Prep,
    /// Class -> its PEs.
    members: Vec<Vec<usize>>,
    /// PE -> its class.
    class_of: Vec<usize>,
}

impl Aggregate {
    /// A layout of the real PEs as a layout of the classes (for a warm start).
    fn lift(&self, prep: &Prep, choice: &[usize]) -> Option<Vec<usize>> {
        choice
            .iter()
            .enumerate()
            .map(|(g, &i)| {
                let cl = self.class_of[prep.groups[g].cands[i].pe];
                self.prep.groups[g].cands.iter().position(|c| c.pe == cl)
            })
            .collect()
    }
}

/// Merge identical PEs: same capacities and, for every group, the same candidacy and
/// demand. A class of m PEs gets m times the capacity; a group's candidate is
/// dropped where it cannot fit one PE of the class. The result is a relaxation
/// (bin packing ignored) with far fewer variables. `None` if no two PEs are identical.
fn aggregate(prep: &Prep) -> Option<Aggregate> {
    let kk = prep.caps.len();
    let mut sig: Vec<Vec<(usize, [u64; 3])>> = vec![Vec::new(); kk];
    for (g, grp) in prep.groups.iter().enumerate() {
        for c in &grp.cands {
            sig[c.pe].push((g, c.demand.map(f64::to_bits)));
        }
    }
    let mut class_of = vec![0usize; kk];
    let mut members: Vec<Vec<usize>> = Vec::new();
    // Key: capacities (as bits) and the PE's column (group, demand bits).
    type Key<'a> = (Vec<Option<u64>>, &'a Vec<(usize, [u64; 3])>);
    let mut seen: HashMap<Key<'_>, usize> = HashMap::new();
    for k in 0..kk {
        let caps: Vec<Option<u64>> = prep.caps[k].iter().map(|c| c.map(f64::to_bits)).collect();
        let key = (caps, &sig[k]);
        let c = if prep.is_host(k) {
            None
        } else {
            seen.get(&key).copied()
        };
        match c {
            Some(c) => {
                class_of[k] = c;
                members[c].push(k);
            }
            None => {
                members.push(vec![k]);
                class_of[k] = members.len() - 1;
                if !prep.is_host(k) {
                    seen.insert(key, members.len() - 1);
                }
            }
        }
    }
    if members.len() == kk {
        return None;
    }
    let caps: Vec<[Option<f64>; 3]> = members
        .iter()
        .map(|m| prep.caps[m[0]].map(|c| c.map(|v| v * m.len() as f64)))
        .collect();
    let groups = prep
        .groups
        .iter()
        .map(|grp| {
            let mut cands: Vec<GCand> = Vec::new();
            for c in &grp.cands {
                let cl = class_of[c.pe];
                let fits_one =
                    (0..3).all(|r| prep.caps[c.pe][r].is_none_or(|cap| fits(c.demand[r], cap)));
                if fits_one && !cands.iter().any(|x| x.pe == cl) {
                    cands.push(GCand {
                        pe: cl,
                        demand: c.demand,
                    });
                }
            }
            Group {
                members: grp.members.clone(),
                weight: grp.weight,
                cands,
            }
        })
        .collect();
    Some(Aggregate {
        prep: Prep {
            groups,
            group_of: prep.group_of.clone(),
            host: prep.host.map(|h| class_of[h]),
            caps,
            gangs: prep.gangs.clone(),
        },
        members,
        class_of,
    })
}

/// Turn an aggregated solution into a real layout: pack each class's groups into its
/// PEs (largest first, fullest PE that fits), try other candidates for the rest, and
/// send what still does not fit to the host together with everything gang or
/// asym-gang ties to it. `None` if that needs a group without a host candidate or
/// overflows the host.
///
/// `flow_rank`, when given, packs in that order (flow neighbours next to each other,
/// so they tend to share a PE) instead of largest first.
fn unpack(
    prep: &Prep,
    agg: &Aggregate,
    agg_choice: &[usize],
    flow_rank: Option<&[usize]>,
) -> Option<Vec<usize>> {
    let ng = prep.groups.len();
    let kk = prep.caps.len();
    let mut used = vec![[0.0f64; 3]; kk];
    let mut choice: Vec<Option<usize>> = vec![None; ng];
    let share = |pe: usize, d: &[f64; 3]| -> f64 {
        (0..3)
            .map(|r| match prep.caps[pe][r] {
                Some(cap) if cap > 0.0 => d[r] / cap,
                _ => 0.0,
            })
            .fold(0.0, f64::max)
    };
    let room = |used: &[[f64; 3]], pe: usize, d: &[f64; 3]| prep.room(pe, &used[pe], d);
    // Groups that cannot go home: no host candidate, or going home would force one
    // of those home through gang / asym-gang (home(b) forces home(a) for a -> b).
    let mut pinned: Vec<bool> = (0..ng)
        .map(|g| !prep.groups[g].cands.iter().any(|c| prep.is_host(c.pe)))
        .collect();
    let mut stack: Vec<usize> = (0..ng).filter(|&g| pinned[g]).collect();
    while let Some(y) = stack.pop() {
        for &(a, b, sym) in &prep.gangs {
            // Edges x -> y meaning home(x) forces home(y): b -> a always, a -> b if gang.
            let x = if a == y {
                Some(b)
            } else if sym && b == y {
                Some(a)
            } else {
                None
            };
            if let Some(x) = x
                && !pinned[x]
            {
                pinned[x] = true;
                stack.push(x);
            }
        }
    }
    // Per class, the groups the aggregated model put there: pinned ones first, then
    // largest first.
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); agg.members.len()];
    for g in 0..ng {
        by_class[agg.prep.groups[g].cands[agg_choice[g]].pe].push(g);
    }
    let mut unplaced = Vec::new();
    for (cl, gs) in by_class.iter_mut().enumerate() {
        let size = |g: usize| {
            let c = prep.groups[g]
                .cands
                .iter()
                .find(|c| agg.members[cl].contains(&c.pe));
            c.map_or(0.0, |c| share(c.pe, &c.demand))
        };
        gs.sort_by(|&a, &b| {
            let by = match flow_rank {
                Some(rank) => rank[a].cmp(&rank[b]),
                None => size(b).total_cmp(&size(a)),
            };
            pinned[b].cmp(&pinned[a]).then(by).then(a.cmp(&b))
        });
        for &g in gs.iter() {
            let best = prep.groups[g]
                .cands
                .iter()
                .enumerate()
                .filter(|(_, c)| agg.members[cl].contains(&c.pe) && room(&used, c.pe, &c.demand))
                .max_by(|(_, a), (_, b)| {
                    share(a.pe, &used[a.pe])
                        .total_cmp(&share(b.pe, &used[b.pe]))
                        .then(b.pe.cmp(&a.pe))
                });
            match best {
                Some((i, c)) => {
                    add_demand(&mut used[c.pe], &c.demand);
                    choice[g] = Some(i);
                }
                None => unplaced.push(g),
            }
        }
    }
    // Any other non-host candidate with room.
    let mut to_host = Vec::new();
    for g in unplaced {
        let spot = prep.groups[g]
            .cands
            .iter()
            .enumerate()
            .find(|(_, c)| !prep.is_host(c.pe) && room(&used, c.pe, &c.demand));
        match spot {
            Some((i, c)) => {
                add_demand(&mut used[c.pe], &c.demand);
                choice[g] = Some(i);
            }
            None => to_host.push(g),
        }
    }
    // Close the host set under gang (both ways) and asym-gang (a -> b: b home => a home).
    let mut home = vec![false; ng];
    let mut stack = to_host;
    while let Some(g) = stack.pop() {
        if home[g] {
            continue;
        }
        home[g] = true;
        for &(a, b, sym) in &prep.gangs {
            if b == g && !home[a] {
                stack.push(a);
            }
            if sym && a == g && !home[b] {
                stack.push(b);
            }
        }
    }
    for g in 0..ng {
        let on_host = choice[g].is_some_and(|i| prep.is_host(prep.groups[g].cands[i].pe));
        if !home[g] || on_host {
            continue;
        }
        if let Some(i) = choice[g] {
            let c = prep.groups[g].cands[i];
            sub_demand(&mut used[c.pe], &c.demand);
        }
        let (i, c) = prep.groups[g]
            .cands
            .iter()
            .enumerate()
            .find(|(_, c)| prep.is_host(c.pe))?;
        add_demand(&mut used[c.pe], &c.demand);
        choice[g] = Some(i);
    }
    let choice: Vec<usize> = choice.into_iter().collect::<Option<_>>()?;
    if !feasible_choice(prep, &choice) {
        return None;
    }
    // Fill: offload more of what went home where room is left.
    crate::greedy::greedy_from(prep, crate::greedy::Rule::DensityBestFit, Some(&choice))
        .filter(|c| feasible_choice(prep, c))
        .or(Some(choice))
}

/// A rank per group that walks each flow-connected component breadth first,
/// components in order of their first group.
fn flow_order(p: &Problem, prep: &Prep) -> Vec<usize> {
    let ng = prep.groups.len();
    let mut adj: Vec<Vec<usize>> = vec![Vec::new(); ng];
    for f in &p.flows {
        let (a, b) = (prep.group_of[f.a], prep.group_of[f.b]);
        if a != b {
            adj[a].push(b);
            adj[b].push(a);
        }
    }
    let mut rank = vec![usize::MAX; ng];
    let mut next = 0;
    let mut queue = std::collections::VecDeque::new();
    for s in 0..ng {
        if rank[s] != usize::MAX {
            continue;
        }
        rank[s] = next;
        next += 1;
        queue.push_back(s);
        while let Some(g) = queue.pop_front() {
            for &h in &adj[g] {
                if rank[h] == usize::MAX {
                    rank[h] = next;
                    next += 1;
                    queue.push_back(h);
                }
            }
        }
    }
    rank
}

/// Does a group choice satisfy every capacity, gang and asym-gang row?
fn feasible_choice(prep: &Prep, choice: &[usize]) -> bool {
    let mut used = vec![[0.0f64; 3]; prep.caps.len()];
    for (g, &i) in choice.iter().enumerate() {
        let c = prep.groups[g].cands[i];
        add_demand(&mut used[c.pe], &c.demand);
    }
    let caps_ok = (0..prep.caps.len()).all(|k| prep.room(k, &used[k], &[0.0; 3]));
    let off = |g: usize| !prep.is_host(prep.groups[g].cands[choice[g]].pe);
    caps_ok
        && prep.gangs.iter().all(|&(a, b, sym)| {
            if sym {
                off(a) == off(b)
            } else {
                !off(a) || off(b)
            }
        })
}

/// The result of the lexicographic optimisation on groups.
pub(crate) struct Optimum {
    /// Group -> candidate index.
    pub choice: Vec<usize>,
    pub stages: Vec<StageStats>,
    pub vars: usize,
    pub rows: usize,
}

fn offload_weight(prep: &Prep, choice: &[usize]) -> u64 {
    prep.groups
        .iter()
        .zip(choice)
        .filter(|(g, c)| !prep.is_host(g.cands[**c].pe))
        .map(|(g, _)| g.weight)
        .sum()
}

/// Solve both objectives on `prep`. `Ok(None)` means infeasible.
pub(crate) fn optimise_prep(
    p: &Problem,
    prep: &Prep,
    opts: &SolveOptions,
    deadline: Option<Instant>,
    bandwidth: bool,
) -> Result<Option<Optimum>, LayoutError> {
    if prep.groups.iter().any(|g| g.cands.is_empty()) {
        return Ok(None);
    }
    if prep.groups.is_empty() {
        return Ok(Some(Optimum {
            choice: Vec::new(),
            stages: Vec::new(),
            vars: 0,
            rows: 0,
        }));
    }
    let remaining = || deadline.map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64());
    let mut stages = Vec::new();
    let warm = if opts.warm_start {
        // The better of the two greedy rules.
        let rules = [
            crate::greedy::Rule::DensityBestFit,
            crate::greedy::Rule::FirstFit,
        ];
        rules
            .into_iter()
            .filter_map(|r| crate::greedy::greedy_prep(prep, r))
            .max_by_key(|c| offload_weight(prep, c))
    } else {
        None
    };

    // Stage 1: maximise the weighted offload. When the bandwidth stage will follow,
    // it keeps part of the budget.
    let stage2_follows = bandwidth && opts.bandwidth_objective && !p.flows.is_empty();
    let stage1_limit = remaining().map(|r| if stage2_follows { r * STAGE1_SHARE } else { r });
    let t1 = Instant::now();
    let any_choice = prep.groups.iter().any(|g| g.cands.len() > 1);
    let mut warm = warm;
    // With identical PEs, first solve the aggregated model: a relaxation whose
    // optimum bounds the offload objective and whose packed solution is a strong
    // start (often provably optimal, then the full model is skipped).
    let mut agg_bound = f64::INFINITY;
    let mut agg_stage = None;
    if opts.aggregate
        && any_choice
        && let Some(agg) = aggregate(prep)
    {
        let limit = stage1_limit.map(|r| r * AGG_SHARE);
        let ta = Instant::now();
        // A solver failure here (e.g. out of time) only loses the shortcut.
        let lifted = warm.as_ref().and_then(|w| agg.lift(prep, w));
        match stage1(&agg.prep, lifted.as_deref(), limit, opts.solver_log) {
            Err(_) => {}
            Ok(None) => return Ok(None), // the relaxation is infeasible
            Ok(Some(s)) => {
                agg_bound = if s.optimal { s.weight as f64 } else { s.bound };
                // Pack largest first and in flow order; keep the better.
                let rank = flow_order(p, prep);
                let packed = [None, Some(rank.as_slice())]
                    .into_iter()
                    .filter_map(|r| unpack(prep, &agg, &s.choice, r))
                    .max_by(|a, b| {
                        let (wa, wb) = (offload_weight(prep, a), offload_weight(prep, b));
                        let (ca, cb) = (assignment(p, prep, a).2, assignment(p, prep, b).2);
                        wa.cmp(&wb).then(cb.total_cmp(&ca))
                    });
                let packed_w = packed.as_ref().map(|c| offload_weight(prep, c));
                agg_stage = Some(StageStats {
                    name: "offload-aggregated".into(),
                    vars: s.vars,
                    constraints: s.rows,
                    time: ta.elapsed(),
                    objective: packed_w.map_or(f64::NAN, |w| w as f64),
                    gap: s.gap,
                    status: format!(
                        "{} ({} PE classes, bound {})",
                        if s.optimal { "optimal" } else { "time-limit" },
                        agg.prep.caps.len(),
                        agg_bound
                    ),
                });
                if let Some(c) = packed
                    && warm
                        .as_ref()
                        .is_none_or(|w| offload_weight(prep, w) < offload_weight(prep, &c))
                {
                    warm = Some(c);
                }
            }
        }
    }
    let proven_by_agg = warm
        .as_ref()
        .is_some_and(|w| offload_weight(prep, w) as f64 >= (agg_bound + 1e-6).floor());
    let x_cols: usize = prep.groups.iter().map(|g| g.cands.len()).sum();
    let limit1 = stage1_limit.map(|r| (r - t1.elapsed().as_secs_f64()).max(0.0));
    let rows1 = prep.groups.len() + prep.gangs.len() + 3 * prep.caps.len();
    let too_big1 = warm.is_some() && limit1.is_some_and(|l| l < useful_time(x_cols, rows1));
    let (choice1, opt1, optimal1, gap1, v1, n1) = if proven_by_agg || too_big1 {
        let w = warm.take().unwrap_or_default();
        let wt = offload_weight(prep, &w);
        let optimal = proven_by_agg;
        let gap = if optimal {
            0.0
        } else {
            (agg_bound - wt as f64) / (wt as f64).max(1.0)
        };
        (w, wt, optimal, gap, 0, 0)
    } else {
        match stage1(prep, warm.as_deref(), limit1, opts.solver_log)? {
            None => return Ok(None),
            Some(s) => {
                let bound = agg_bound.min(if s.optimal { s.weight as f64 } else { s.bound });
                let optimal = s.optimal || s.weight as f64 >= (bound + 1e-6).floor();
                let gap = if optimal {
                    0.0
                } else {
                    (bound - s.weight as f64) / (s.weight as f64).max(1.0)
                };
                (s.choice, s.weight, optimal, gap, s.vars, s.rows)
            }
        }
    };
    stages.extend(agg_stage);
    stages.push(StageStats {
        name: "offload".into(),
        vars: v1,
        constraints: n1,
        time: t1.elapsed(),
        objective: opt1 as f64,
        gap: gap1,
        status: if !any_choice {
            "trivial".into()
        } else if proven_by_agg {
            "optimal (aggregated bound met)".into()
        } else if too_big1 {
            "heuristic (budget too small for the full model)".into()
        } else if optimal1 {
            "optimal".into()
        } else {
            "time-limit".into()
        },
    });
    let mut choice1 = choice1;
    if bandwidth && opts.bandwidth_objective {
        crate::greedy::improve_bandwidth(p, prep, &mut choice1);
    }
    let mut best = Optimum {
        choice: choice1,
        stages: Vec::new(),
        vars: v1,
        rows: n1,
    };

    // Stage 2: minimise cross-PE bandwidth with the offload at its optimum.
    let shared = shared_pairs(p, prep);
    let z_cols: usize = shared.iter().map(|s| s.3.len()).sum();
    let limit2 = remaining().map(|r| r * 0.8);
    let too_big2 = limit2.is_some_and(|l| l < useful_time(x_cols + z_cols, rows1 + 2 * z_cols));
    if bandwidth && opts.bandwidth_objective && !shared.is_empty() && any_choice {
        let t2 = Instant::now();
        // Large models: first search the neighbourhood, where every group keeps its
        // side of the host line and may only join the PE of one of its flow peers.
        // It is small, and a far better start for the full model, or all there is
        // time for.
        let large = too_big2 || x_cols + z_cols > LNS_COLUMNS;
        let mut lns_vars = (0, 0);
        if large {
            let limit = limit2.map(|l| if too_big2 { l } else { l * LNS_SHARE });
            let (sprep, back) = neighbourhood(p, prep, &best.choice);
            let start: Vec<usize> = best
                .choice
                .iter()
                .enumerate()
                .map(|(g, &i)| back[g].iter().position(|&j| j == i).unwrap_or(0))
                .collect();
            let r = bandwidth_mip(&sprep, &shared_pairs(p, &sprep), &start, opt1, limit, opts)?;
            lns_vars = (r.vars, r.rows);
            if let Some(c) = r.choice {
                let mut choice: Vec<usize> =
                    c.iter().enumerate().map(|(g, &i)| back[g][i]).collect();
                crate::greedy::improve_bandwidth(p, prep, &mut choice);
                accept(prep, &shared, &mut best.choice, choice);
            }
        }
        let mut outcome = None;
        if !too_big2 {
            let limit = remaining().map(|r| r * 0.8);
            let start = best.choice.clone();
            let r = bandwidth_mip(prep, &shared, &start, opt1, limit, opts)?;
            if let Some(mut choice) = r.choice.clone() {
                if !r.optimal {
                    crate::greedy::improve_bandwidth(p, prep, &mut choice);
                }
                accept(prep, &shared, &mut best.choice, choice);
            }
            outcome = Some(r);
        }
        let (vars, rows) = outcome.as_ref().map_or(lns_vars, |r| (r.vars, r.rows));
        best.vars = best.vars.max(vars);
        best.rows = best.rows.max(rows);
        stages.push(StageStats {
            name: "bandwidth".into(),
            vars,
            constraints: rows,
            time: t2.elapsed(),
            objective: assignment(p, prep, &best.choice).2,
            gap: outcome.as_ref().map_or(f64::INFINITY, |r| r.gap),
            status: match &outcome {
                None => "neighbourhood (budget too small for the full model)".into(),
                Some(r) if r.optimal => "optimal".into(),
                Some(_) => "time-limit".into(),
            },
        });
    }
    best.stages = stages;
    Ok(Some(best))
}

/// Take `choice` if it is lexicographically better: more weight (possible when the
/// offload stage stopped early), then more bandwidth kept on one PE.
fn accept(prep: &Prep, shared: &[SharedPair], best: &mut Vec<usize>, choice: Vec<usize>) {
    let (w_new, w_old) = (offload_weight(prep, &choice), offload_weight(prep, best));
    if w_new > w_old
        || (w_new == w_old && saved(shared, &choice, prep) >= saved(shared, best, prep))
    {
        *best = choice;
    }
}

/// Flow pairs between distinct groups (bandwidth summed) that could share a PE.
fn shared_pairs(p: &Problem, prep: &Prep) -> Vec<SharedPair> {
    let mut pairs: HashMap<(usize, usize), f64> = HashMap::new();
    for f in &p.flows {
        let (ga, gb) = (prep.group_of[f.a], prep.group_of[f.b]);
        if ga != gb && f.bandwidth > 0.0 {
            *pairs.entry((ga.min(gb), ga.max(gb))).or_insert(0.0) += f.bandwidth;
        }
    }
    let mut pairs: Vec<((usize, usize), f64)> = pairs.into_iter().collect();
    pairs.sort_by_key(|a| a.0);
    pairs
        .into_iter()
        .filter_map(|((a, b), bw)| {
            let mut common = Vec::new();
            for (i, ca) in prep.groups[a].cands.iter().enumerate() {
                if let Some(j) = prep.groups[b].cands.iter().position(|cb| cb.pe == ca.pe) {
                    common.push((i, j));
                }
            }
            (!common.is_empty()).then_some((a, b, bw, common))
        })
        .collect()
}

/// The restricted problem for the neighbourhood search around `choice`: a group on
/// the host keeps only the host; an offloaded group keeps its PE plus the non-host
/// PEs its flow peers are on. Returns it with, per group, the original candidate
/// index of each restricted candidate. `choice` is feasible in it.
fn neighbourhood(p: &Problem, prep: &Prep, choice: &[usize]) -> (Prep, Vec<Vec<usize>>) {
    let ng = prep.groups.len();
    let mut peers: Vec<Vec<usize>> = vec![Vec::new(); ng];
    for f in &p.flows {
        let (a, b) = (prep.group_of[f.a], prep.group_of[f.b]);
        if a != b {
            peers[a].push(b);
            peers[b].push(a);
        }
    }
    let pe_of = |g: usize| prep.groups[g].cands[choice[g]].pe;
    let mut back = Vec::with_capacity(ng);
    let groups = prep
        .groups
        .iter()
        .enumerate()
        .map(|(g, grp)| {
            let mut keep = vec![choice[g]];
            if !prep.is_host(pe_of(g)) {
                for &h in &peers[g] {
                    let k = pe_of(h);
                    if prep.is_host(k) {
                        continue;
                    }
                    if let Some(i) = grp.cands.iter().position(|c| c.pe == k)
                        && !keep.contains(&i)
                    {
                        keep.push(i);
                    }
                }
            }
            let g2 = Group {
                members: grp.members.clone(),
                weight: grp.weight,
                cands: keep.iter().map(|&i| grp.cands[i]).collect(),
            };
            back.push(keep);
            g2
        })
        .collect();
    (
        Prep {
            groups,
            group_of: prep.group_of.clone(),
            host: prep.host,
            caps: prep.caps.clone(),
            gangs: prep.gangs.clone(),
        },
        back,
    )
}

/// The bandwidth stage's outcome.
struct Bw {
    choice: Option<Vec<usize>>,
    optimal: bool,
    gap: f64,
    vars: usize,
    rows: usize,
}

/// Maximise the flow bandwidth kept on one PE (so minimise cross-PE bandwidth) with
/// the offloaded weight held at `min_weight`, starting from `start`.
fn bandwidth_mip(
    prep: &Prep,
    shared: &[SharedPair],
    start: &[usize],
    min_weight: u64,
    limit: Option<f64>,
    opts: &SolveOptions,
) -> Result<Bw, LayoutError> {
    let mut mip = build(prep);
    let x2 = mip.x.clone();
    let mut obj2 = Expression::default();
    let mut extra = Vec::new();
    let mut z_of: Vec<(V, usize, usize, usize, usize)> = Vec::new();
    for &(a, b, bw, ref common) in shared {
        for &(i, j) in common {
            // Z <= X_a^k and Z <= X_b^k: Z can be 1 only if both are on PE k.
            let z = add_var(&mut mip.vars, variable().min(0.0).max(1.0));
            obj2.add_mul(bw, z.v);
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
    // Keep objective 1 at its optimum (weights are integers).
    let mut terms = Vec::new();
    for (g, grp) in prep.groups.iter().enumerate() {
        for (i, c) in grp.cands.iter().enumerate() {
            if !prep.is_host(c.pe) && grp.weight > 0 {
                terms.push((x2[g][i].v, grp.weight as f64));
            }
        }
    }
    if !terms.is_empty() {
        extra.push(Row {
            terms,
            lo: min_weight as f64 - 0.5,
            hi: f64::INFINITY,
        });
    }
    let ncols = mip.vars.len();
    let mut start_cols = vec![0.0; ncols];
    for (g, &i) in start.iter().enumerate() {
        start_cols[x2[g][i].i] = 1.0;
    }
    for &(z, a, i, b, j) in &z_of {
        if start[a] == i && start[b] == j {
            start_cols[z.i] = 1.0;
        }
    }
    let (r, vars, rows) = run(
        mip,
        extra,
        RunSpec {
            log: opts.solver_log,
            presolve_off: ncols > PRESOLVE_OFF_COLUMNS,
            objective: obj2,
            sense_max: true,
            rel_gap: opts.bandwidth_gap,
            time_limit: limit,
            start: Some(&start_cols),
        },
    )?;
    Ok(match r {
        Run::Solved {
            cols, optimal, gap, ..
        } => Bw {
            choice: Some(pick(&x2, &cols)),
            optimal,
            gap,
            vars,
            rows,
        },
        // Cannot happen (the start satisfies every row); keep the start.
        Run::Infeasible => Bw {
            choice: None,
            optimal: false,
            gap: f64::INFINITY,
            vars,
            rows,
        },
    })
}

/// Two groups joined by flows (summed bandwidth) and the candidate index pairs on
/// which they would share a PE.
type SharedPair = (usize, usize, f64, Vec<(usize, usize)>);

/// Bandwidth kept on-PE by `choice` among the pairs that could share a PE.
fn saved(shared: &[SharedPair], choice: &[usize], prep: &Prep) -> f64 {
    shared
        .iter()
        .filter(|(a, b, _, _)| {
            prep.groups[*a].cands[choice[*a]].pe == prep.groups[*b].cands[choice[*b]].pe
        })
        .map(|s| s.2)
        .sum()
}

/// Offcode assignment, offloaded weight and cross-PE bandwidth of a group choice.
pub(crate) fn assignment(p: &Problem, prep: &Prep, choice: &[usize]) -> (Vec<usize>, u64, f64) {
    let mut asg = vec![0; p.offcodes.len()];
    for (g, grp) in prep.groups.iter().enumerate() {
        for &m in &grp.members {
            asg[m] = grp.cands[choice[g]].pe;
        }
    }
    let (w, cross) = objectives(p, &asg, prep.host);
    (asg, w, cross)
}

/// The two objectives of an offcode assignment: offloaded weight (offcodes off the
/// `host` PE) and cross-PE flow bandwidth.
pub(crate) fn objectives(p: &Problem, asg: &[usize], host: Option<usize>) -> (u64, f64) {
    let weight = p
        .offcodes
        .iter()
        .zip(asg)
        .filter(|(_, k)| Some(**k) != host)
        .map(|(o, _)| u64::from(o.weight))
        .sum();
    let cross = p
        .flows
        .iter()
        .filter(|f| asg[f.a] != asg[f.b])
        .map(|f| f.bandwidth)
        .fold(0.0, |a, b| a + b); // not `sum`: an empty f64 sum is -0.0
    (weight, cross)
}

/// The whole solve (validated problem): optimum or an explained infeasibility.
pub(crate) fn optimise(
    p: &Problem,
    opts: &SolveOptions,
    start: Instant,
) -> Result<Layout, LayoutError> {
    let deadline = opts.time_limit.map(|t| start + t);
    let active = Active::all(p);
    let prep = prepare(p, &active);
    let Some(opt) = optimise_prep(p, &prep, opts, deadline, true)? else {
        let conflict = crate::explain::conflict(p, &active)?;
        return Err(LayoutError::Infeasible(conflict));
    };
    let (assignment, offloaded_weight, cross_bandwidth) = assignment(p, &prep, &opt.choice);
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
