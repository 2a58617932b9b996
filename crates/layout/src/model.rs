//! The integer program: pull groups, variables on can-run pairs, constraint and
//! capacity rows, and the two lexicographic objectives, solved with HiGHS.
//!
//! `good_lp` builds the model; the `highs` bindings underneath control the solver
//! (options, warm start, status and gap), which `good_lp`'s own `solve` hides.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use good_lp::solvers::highs::highs;
use good_lp::{Expression, ProblemVariables, SolverModel, Variable, variable};
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
    },
    Infeasible,
}

struct RunSpec<'a> {
    log: bool,
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
    let unsolved = if spec.sense_max {
        mip.vars.maximise(spec.objective)
    } else {
        mip.vars.minimise(spec.objective)
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
    if let Some(t) = spec.time_limit {
        set(&mut model, "time_limit", t.max(0.001))?;
    }
    if let Some(start) = spec.start {
        if start.len() == ncols {
            // An infeasible start is discarded by HiGHS; a wrong length is our bug.
            model
                .try_set_solution(Some(start), None, None, None)
                .map_err(|e| LayoutError::Solver(format!("warm start: {e:?}")))?;
        }
    }
    let solved = model
        .try_solve()
        .map_err(|e| LayoutError::Solver(format!("HiGHS failed: {e:?}")))?;
    let status = solved.status();
    let has_solution = solved.primal_solution_status() == HighsSolutionStatus::Feasible;
    let run = match status {
        HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible => Run::Infeasible,
        HighsModelStatus::Optimal if has_solution => Run::Solved {
            cols: solved.get_solution().columns().to_vec(),
            optimal: true,
            gap: solved.mip_gap().max(0.0),
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
                    gap: solved.mip_gap(),
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
    if prep.groups.is_empty() {
        return Ok(true);
    }
    let mip = build(&prep);
    if mip.trivially_infeasible {
        return Ok(false);
    }
    let spec = RunSpec {
        log: false,
        objective: Expression::default(),
        sense_max: true,
        rel_gap: 0.0,
        time_limit: None,
        start: None,
    };
    Ok(matches!(run(mip, Vec::new(), spec)?.0, Run::Solved { .. }))
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
        crate::greedy::greedy_prep(prep)
    } else {
        None
    };

    // Stage 1: maximise the weighted offload.
    let t1 = Instant::now();
    let mip = build(prep);
    if mip.trivially_infeasible {
        return Ok(None);
    }
    let x1 = mip.x.clone();
    let ncols1 = mip.vars.len();
    let mut obj1 = Expression::default();
    let mut any_choice = false;
    for (g, grp) in prep.groups.iter().enumerate() {
        any_choice |= grp.cands.len() > 1;
        for (i, c) in grp.cands.iter().enumerate() {
            if !prep.is_host(c.pe) {
                obj1.add_mul(grp.weight as f64, x1[g][i].v);
            }
        }
    }
    let start1 = warm.as_ref().map(|w| {
        let mut cols = vec![0.0; ncols1];
        for (g, &i) in w.iter().enumerate() {
            cols[x1[g][i].i] = 1.0;
        }
        cols
    });
    let (r1, v1, n1) = run(
        mip,
        Vec::new(),
        RunSpec {
            log: opts.solver_log,
            objective: obj1,
            sense_max: true,
            rel_gap: 0.0,
            time_limit: remaining(),
            start: start1.as_deref(),
        },
    )?;
    let (choice1, opt1, optimal1, gap1) = match r1 {
        Run::Infeasible => return Ok(None),
        Run::Solved {
            cols, optimal, gap, ..
        } => {
            let choice = pick(&x1, &cols);
            let w = offload_weight(prep, &choice);
            (choice, w, optimal, gap)
        }
    };
    stages.push(StageStats {
        name: "offload".into(),
        vars: v1,
        constraints: n1,
        time: t1.elapsed(),
        objective: opt1 as f64,
        gap: gap1,
        status: if !any_choice {
            "trivial".into()
        } else if optimal1 {
            "optimal".into()
        } else {
            "time-limit".into()
        },
    });
    let mut best = Optimum {
        choice: choice1,
        stages: Vec::new(),
        vars: v1,
        rows: n1,
    };

    // Stage 2: minimise cross-PE bandwidth with the offload at its optimum.
    let mut pairs: HashMap<(usize, usize), f64> = HashMap::new();
    for f in &p.flows {
        let (ga, gb) = (prep.group_of[f.a], prep.group_of[f.b]);
        if ga != gb && f.bandwidth > 0.0 {
            *pairs.entry((ga.min(gb), ga.max(gb))).or_insert(0.0) += f.bandwidth;
        }
    }
    let mut pairs: Vec<((usize, usize), f64)> = pairs.into_iter().collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    // Only pairs that could share a PE matter.
    let shared: Vec<(usize, usize, f64, Vec<(usize, usize)>)> = pairs
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
        .collect();
    if bandwidth && opts.bandwidth_objective && !shared.is_empty() && any_choice {
        let t2 = Instant::now();
        let mut mip = build(prep);
        let x2 = mip.x.clone();
        let mut obj2 = Expression::default();
        let mut extra = Vec::new();
        let mut z_of: Vec<(V, usize, usize, usize, usize)> = Vec::new();
        for &(a, b, bw, ref common) in &shared {
            for &(i, j) in common {
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
                lo: opt1 as f64 - 0.5,
                hi: f64::INFINITY,
            });
        }
        let ncols2 = mip.vars.len();
        let mut start2 = vec![0.0; ncols2];
        for (g, &i) in best.choice.iter().enumerate() {
            start2[x2[g][i].i] = 1.0;
        }
        for &(z, a, i, b, j) in &z_of {
            if best.choice[a] == i && best.choice[b] == j {
                start2[z.i] = 1.0;
            }
        }
        let (r2, v2, n2) = run(
            mip,
            extra,
            RunSpec {
                log: opts.solver_log,
                objective: obj2,
                sense_max: true,
                rel_gap: opts.bandwidth_gap,
                time_limit: remaining(),
                start: Some(&start2),
            },
        )?;
        best.vars = best.vars.max(v2);
        best.rows = best.rows.max(n2);
        let total_shared: f64 = shared.iter().map(|s| s.2).sum();
        match r2 {
            Run::Solved {
                cols, optimal, gap, ..
            } => {
                let choice = pick(&x2, &cols);
                if offload_weight(prep, &choice) >= opt1 {
                    best.choice = choice;
                }
                let kept = saved(&shared, &best.choice, prep);
                stages.push(StageStats {
                    name: "bandwidth".into(),
                    vars: v2,
                    constraints: n2,
                    time: t2.elapsed(),
                    objective: total_shared - kept,
                    gap,
                    status: if optimal { "optimal" } else { "time-limit" }.into(),
                });
            }
            Run::Infeasible => {
                // Cannot happen: the stage-1 solution satisfies every row. Keep it.
                stages.push(StageStats {
                    name: "bandwidth".into(),
                    vars: v2,
                    constraints: n2,
                    time: t2.elapsed(),
                    objective: total_shared - saved(&shared, &best.choice, prep),
                    gap: f64::INFINITY,
                    status: "warm-start".into(),
                });
            }
        }
    }
    best.stages = stages;
    Ok(Some(best))
}

/// Bandwidth kept on-PE by `choice` among the pairs that could share a PE.
fn saved(
    shared: &[(usize, usize, f64, Vec<(usize, usize)>)],
    choice: &[usize],
    prep: &Prep,
) -> f64 {
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
    let w = p
        .offcodes
        .iter()
        .zip(&asg)
        .filter(|(_, k)| !prep.is_host(**k))
        .map(|(o, _)| u64::from(o.weight))
        .sum();
    let cross = p
        .flows
        .iter()
        .filter(|f| asg[f.a] != asg[f.b])
        .map(|f| f.bandwidth)
        .fold(0.0, |a, b| a + b); // not `sum`: an empty f64 sum is -0.0
    (asg, w, cross)
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
