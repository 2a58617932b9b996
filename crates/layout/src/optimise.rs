//! The lexicographic optimisation on prepared groups, within a time budget: a greedy
//! warm start; stage 1 maximises the offloaded weight (first on the aggregated model
//! when PEs are interchangeable, then on the full model unless the aggregated bound
//! is already met or the budget is too small); stage 2 minimises the cross-PE
//! bandwidth with the weight held, by a neighbourhood search on large models and the
//! full model when there is time. Every stage records what it proved.

use std::time::Instant;

use crate::aggregate::{aggregate, flow_order, unpack};
use crate::greedy::{Rule, greedy_prep, improve_bandwidth};
use crate::milp::{BandwidthSpec, bandwidth_mip, offload_mip, useful_time};
use crate::prep::{Group, Prep, RESOURCES, SharedPair, assignment, saved, shared_pairs};
use crate::types::{LayoutError, Problem, SolveOptions, StageStats};

/// Above this many columns the bandwidth stage starts with a neighbourhood search,
/// which may use `LNS_SHARE` of its budget.
const LNS_COLUMNS: usize = 5_000;
const LNS_SHARE: f64 = 0.3;

/// Share of the offload stage's budget the aggregated model may use.
const AGG_SHARE: f64 = 0.5;

/// Share of the remaining time budget the offload stage may use when the bandwidth
/// stage follows.
const STAGE1_SHARE: f64 = 0.5;

/// Share of the remaining time budget each bandwidth model may use.
const STAGE2_SHARE: f64 = 0.8;

/// Slack when comparing a weight with a bound found in floating point.
const BOUND_SLACK: f64 = 1e-6;

/// The result of the lexicographic optimisation on groups.
pub(crate) struct Optimum {
    /// Group -> candidate index.
    pub choice: Vec<usize>,
    pub stages: Vec<StageStats>,
    pub vars: usize,
    pub rows: usize,
}

/// Seconds left before `deadline`, if there is one.
fn remaining(deadline: Option<Instant>) -> Option<f64> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64())
}

/// Solve both objectives on `prep` (the second only if `bandwidth`). `Ok(None)`
/// means infeasible.
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
    let bandwidth = bandwidth && opts.bandwidth_objective;
    // Stage 1: maximise the weighted offload. When the bandwidth stage will follow,
    // it keeps part of the budget.
    let stage2_follows = bandwidth && !p.flows.is_empty();
    let warm = warm_start(prep, opts);
    let stage1_limit =
        remaining(deadline).map(|r| if stage2_follows { r * STAGE1_SHARE } else { r });
    let Some(mut best) = offload_stage(p, prep, opts, stage1_limit, warm)? else {
        return Ok(None);
    };
    if bandwidth {
        improve_bandwidth(p, prep, &mut best.choice);
    }
    // Stage 2: minimise cross-PE bandwidth with the offload at its optimum.
    let any_choice = prep.groups.iter().any(|g| g.cands.len() > 1);
    let shared = shared_pairs(p, prep);
    if bandwidth && !shared.is_empty() && any_choice {
        let stage = bandwidth_stage(p, prep, opts, deadline, &shared, &mut best)?;
        best.stages.push(stage);
    }
    Ok(Some(best))
}

/// The better (by offloaded weight) of the two greedy rules, if asked for.
fn warm_start(prep: &Prep, opts: &SolveOptions) -> Option<Vec<usize>> {
    if !opts.warm_start {
        return None;
    }
    [Rule::DensityBestFit, Rule::FirstFit]
        .into_iter()
        .filter_map(|r| greedy_prep(prep, r))
        .max_by_key(|c| prep.offload_weight(c))
}

/// The outcome of the aggregated model: a bound on the offloaded weight and the
/// stage to report.
struct AggBound {
    bound: f64,
    stage: Option<StageStats>,
}

/// The offload stage from the greedy layout `warm`, within `stage1_limit` seconds:
/// the aggregated model (when PEs are interchangeable), then the full model unless
/// the aggregated bound is met or the budget is too small for it. Returns the layout
/// with the stages run and the numbers of variables and rows of the full model (0 if
/// it was not run); `Ok(None)` if infeasible.
fn offload_stage(
    p: &Problem,
    prep: &Prep,
    opts: &SolveOptions,
    stage1_limit: Option<f64>,
    mut warm: Option<Vec<usize>>,
) -> Result<Option<Optimum>, LayoutError> {
    let t1 = Instant::now();
    let any_choice = prep.groups.iter().any(|g| g.cands.len() > 1);
    // With identical PEs, first solve the aggregated model: a relaxation whose
    // optimum bounds the offload objective and whose packed solution is a strong
    // start (often provably optimal, then the full model is skipped).
    let agg = if opts.aggregate && any_choice {
        let limit = stage1_limit.map(|r| r * AGG_SHARE);
        match aggregated(p, prep, opts, limit, &mut warm) {
            Some(agg) => agg,
            None => return Ok(None), // the relaxation is infeasible
        }
    } else {
        AggBound {
            bound: f64::INFINITY,
            stage: None,
        }
    };
    let agg_bound = agg.bound;
    #[allow(clippy::cast_precision_loss)] // weights far below 2^53
    let proven_by_agg = warm
        .as_ref()
        .is_some_and(|w| prep.offload_weight(w) as f64 >= (agg_bound + BOUND_SLACK).floor());
    let x_cols: usize = prep.groups.iter().map(|g| g.cands.len()).sum();
    let limit1 = stage1_limit.map(|r| (r - t1.elapsed().as_secs_f64()).max(0.0));
    let rows1 = prep.groups.len() + prep.gangs.len() + RESOURCES * prep.caps.len();
    let too_big1 = warm.is_some() && limit1.is_some_and(|l| l < useful_time(x_cols, rows1));
    let solution = if proven_by_agg || too_big1 {
        heuristic(
            prep,
            warm.take().unwrap_or_default(),
            agg_bound,
            proven_by_agg,
        )
    } else {
        match full_offload(prep, opts, warm.as_deref(), limit1, agg_bound)? {
            None => return Ok(None),
            Some(s) => s,
        }
    };
    let status = if !any_choice {
        "trivial"
    } else if proven_by_agg {
        "optimal (aggregated bound met)"
    } else if too_big1 {
        "heuristic (budget too small for the full model)"
    } else if solution.optimal {
        "optimal"
    } else {
        "time-limit"
    };
    let mut stages: Vec<StageStats> = agg.stage.into_iter().collect();
    #[allow(clippy::cast_precision_loss)] // weights far below 2^53
    stages.push(StageStats {
        name: "offload".into(),
        vars: solution.vars,
        constraints: solution.rows,
        time: t1.elapsed(),
        objective: solution.weight as f64,
        gap: solution.gap,
        status: status.into(),
    });
    Ok(Some(Optimum {
        choice: solution.choice,
        stages,
        vars: solution.vars,
        rows: solution.rows,
    }))
}

/// The offload stage's layout.
struct Stage1 {
    choice: Vec<usize>,
    weight: u64,
    optimal: bool,
    gap: f64,
    vars: usize,
    rows: usize,
}

/// Stage 1 without the full model: the warm start, proved optimal if it meets the
/// aggregated bound.
#[allow(clippy::cast_precision_loss)] // weights far below 2^53
fn heuristic(prep: &Prep, warm: Vec<usize>, agg_bound: f64, proven: bool) -> Stage1 {
    let weight = prep.offload_weight(&warm);
    let gap = if proven {
        0.0
    } else {
        (agg_bound - weight as f64) / (weight as f64).max(1.0)
    };
    Stage1 {
        choice: warm,
        weight,
        optimal: proven,
        gap,
        vars: 0,
        rows: 0,
    }
}

/// Stage 1 on the full model; optimal if proved so or if it meets the best bound.
#[allow(clippy::cast_precision_loss)] // weights far below 2^53
fn full_offload(
    prep: &Prep,
    opts: &SolveOptions,
    warm: Option<&[usize]>,
    limit: Option<f64>,
    agg_bound: f64,
) -> Result<Option<Stage1>, LayoutError> {
    let Some(s) = offload_mip(prep, warm, limit, opts.solver_log)? else {
        return Ok(None);
    };
    let bound = agg_bound.min(if s.optimal { s.weight as f64 } else { s.bound });
    let optimal = s.optimal || s.weight as f64 >= (bound + BOUND_SLACK).floor();
    let gap = if optimal {
        0.0
    } else {
        (bound - s.weight as f64) / (s.weight as f64).max(1.0)
    };
    Ok(Some(Stage1 {
        choice: s.choice,
        weight: s.weight,
        optimal,
        gap,
        vars: s.vars,
        rows: s.rows,
    }))
}

/// Solve the aggregated model within `limit` seconds; its packed solution replaces
/// `warm` when it offloads more. `None` when the relaxation is infeasible. A solver
/// failure here (e.g. out of time) only loses the shortcut.
#[allow(clippy::cast_precision_loss)] // weights far below 2^53
fn aggregated(
    p: &Problem,
    prep: &Prep,
    opts: &SolveOptions,
    limit: Option<f64>,
    warm: &mut Option<Vec<usize>>,
) -> Option<AggBound> {
    let no_bound = AggBound {
        bound: f64::INFINITY,
        stage: None,
    };
    let Some(agg) = aggregate(prep) else {
        return Some(no_bound);
    };
    let ta = Instant::now();
    let lifted = warm.as_ref().and_then(|w| agg.lift(prep, w));
    let s = match offload_mip(&agg.prep, lifted.as_deref(), limit, opts.solver_log) {
        Err(_) => return Some(no_bound),
        Ok(None) => return None,
        Ok(Some(s)) => s,
    };
    let agg_bound = if s.optimal { s.weight as f64 } else { s.bound };
    // Pack largest first and in flow order; keep the better.
    let rank = flow_order(p, prep);
    let packed = [None, Some(rank.as_slice())]
        .into_iter()
        .filter_map(|r| unpack(prep, &agg, &s.choice, r))
        .max_by(|a, b| {
            let (wa, wb) = (prep.offload_weight(a), prep.offload_weight(b));
            let (ca, cb) = (assignment(p, prep, a).2, assignment(p, prep, b).2);
            wa.cmp(&wb).then(cb.total_cmp(&ca))
        });
    let packed_w = packed.as_ref().map(|c| prep.offload_weight(c));
    let stage = StageStats {
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
    };
    if let Some(c) = packed
        && warm
            .as_ref()
            .is_none_or(|w| prep.offload_weight(w) < prep.offload_weight(&c))
    {
        *warm = Some(c);
    }
    Some(AggBound {
        bound: agg_bound,
        stage: Some(stage),
    })
}

/// Stage 2 from `best` (stage 1's layout, improved in place): on large models first
/// search the neighbourhood, where every group keeps its side of the host line and
/// may only join the PE of one of its flow peers; it is small, and a far better start
/// for the full model, or all there is time for. Then the full model when there is
/// time for it.
fn bandwidth_stage(
    p: &Problem,
    prep: &Prep,
    opts: &SolveOptions,
    deadline: Option<Instant>,
    shared: &[SharedPair],
    best: &mut Optimum,
) -> Result<StageStats, LayoutError> {
    let t2 = Instant::now();
    let min_weight = prep.offload_weight(&best.choice);
    let x_cols: usize = prep.groups.iter().map(|g| g.cands.len()).sum();
    let rows1 = prep.groups.len() + prep.gangs.len() + RESOURCES * prep.caps.len();
    let z_cols: usize = shared.iter().map(|s| s.common.len()).sum();
    let limit2 = remaining(deadline).map(|r| r * STAGE2_SHARE);
    let too_big2 = limit2.is_some_and(|l| l < useful_time(x_cols + z_cols, rows1 + 2 * z_cols));
    let large = too_big2 || x_cols + z_cols > LNS_COLUMNS;
    let mut lns_vars = (0, 0);
    if large {
        let limit = limit2.map(|l| if too_big2 { l } else { l * LNS_SHARE });
        lns_vars =
            neighbourhood_search(p, prep, opts, shared, limit, min_weight, &mut best.choice)?;
    }
    let mut outcome = None;
    if !too_big2 {
        let start = best.choice.clone();
        let spec = BandwidthSpec {
            start: &start,
            min_weight,
            limit: remaining(deadline).map(|r| r * STAGE2_SHARE),
            rel_gap: opts.bandwidth_gap,
            log: opts.solver_log,
        };
        let r = bandwidth_mip(prep, shared, &spec)?;
        if let Some(mut choice) = r.choice.clone() {
            if !r.optimal {
                improve_bandwidth(p, prep, &mut choice);
            }
            accept(prep, shared, &mut best.choice, choice);
        }
        outcome = Some(r);
    }
    let (vars, rows) = outcome.as_ref().map_or(lns_vars, |r| (r.vars, r.rows));
    best.vars = best.vars.max(vars);
    best.rows = best.rows.max(rows);
    Ok(StageStats {
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
    })
}

/// The bandwidth model restricted to the neighbourhood of `choice` (see
/// `neighbourhood`); takes its solution when better. Returns the model's numbers of
/// variables and rows.
fn neighbourhood_search(
    p: &Problem,
    prep: &Prep,
    opts: &SolveOptions,
    shared: &[SharedPair],
    limit: Option<f64>,
    min_weight: u64,
    choice: &mut Vec<usize>,
) -> Result<(usize, usize), LayoutError> {
    let (sprep, back) = neighbourhood(p, prep, choice);
    let start: Vec<usize> = choice
        .iter()
        .enumerate()
        .map(|(g, &i)| back[g].iter().position(|&j| j == i).unwrap_or(0))
        .collect();
    let spec = BandwidthSpec {
        start: &start,
        min_weight,
        limit,
        rel_gap: opts.bandwidth_gap,
        log: opts.solver_log,
    };
    let r = bandwidth_mip(&sprep, &shared_pairs(p, &sprep), &spec)?;
    if let Some(c) = r.choice {
        let mut found: Vec<usize> = c.iter().enumerate().map(|(g, &i)| back[g][i]).collect();
        improve_bandwidth(p, prep, &mut found);
        accept(prep, shared, choice, found);
    }
    Ok((r.vars, r.rows))
}

/// Take `choice` if it is lexicographically better: more weight (possible when the
/// offload stage stopped early), then more bandwidth kept on one PE.
fn accept(prep: &Prep, shared: &[SharedPair], best: &mut Vec<usize>, choice: Vec<usize>) {
    let (w_new, w_old) = (prep.offload_weight(&choice), prep.offload_weight(best));
    if w_new > w_old
        || (w_new == w_old && saved(shared, &choice, prep) >= saved(shared, best, prep))
    {
        *best = choice;
    }
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
    let mut back = Vec::with_capacity(ng);
    let groups = prep
        .groups
        .iter()
        .enumerate()
        .map(|(g, grp)| {
            let mut keep = vec![choice[g]];
            if !prep.is_host(prep.pe_of(choice, g)) {
                for &h in &peers[g] {
                    let k = prep.pe_of(choice, h);
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
            links: prep.links.clone(),
        },
        back,
    )
}
