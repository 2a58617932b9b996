//! Explanations: an irreducible infeasible subset of constraint groups (a deletion
//! filter after Chinneck, deleting blocks first), and a reason for every offcode.

use sidecore_types::ConstraintKind;

use crate::milp::feasible;
use crate::optimise::optimise_prep;
use crate::prep::{Active, Prep, fits, host_of, prepare, res_index};
use crate::{
    Conflict, ConflictItem, Layout, LayoutError, Peer, Problem, Reason, Resource, SolveOptions, Why,
};

/// One switchable group of constraints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    CanRun(usize),
    Cap(usize, Resource),
    Con(usize),
    Link(usize),
}

fn active_of(p: &Problem, items: &[Item], forced: Option<usize>) -> Active {
    let mut a = Active {
        canrun: vec![false; p.offcodes.len()],
        cap: vec![[false; 3]; p.pes.len()],
        cons: vec![false; p.constraints.len()],
        links: vec![false; p.links.len()],
        forced,
    };
    for it in items {
        match *it {
            Item::CanRun(n) => a.canrun[n] = true,
            Item::Cap(k, r) => a.cap[k][res_index(r)] = true,
            Item::Con(i) => a.cons[i] = true,
            Item::Link(i) => a.links[i] = true,
        }
    }
    a
}

/// Every item that can matter: link caps and capacities first (so the filter tries
/// dropping them first), then pull/gang/asym-gang constraints, then can-run rows.
fn all_items(p: &Problem) -> Vec<Item> {
    let mut v: Vec<Item> = (0..p.links.len()).map(Item::Link).collect();
    for (k, pe) in p.pes.iter().enumerate() {
        v.push(Item::Cap(k, Resource::Cpu));
        v.push(Item::Cap(k, Resource::Memory));
        if pe.slots.is_some() {
            v.push(Item::Cap(k, Resource::Slots));
        }
    }
    for (i, c) in p.constraints.iter().enumerate() {
        if c.kind != ConstraintKind::Link {
            v.push(Item::Con(i));
        }
    }
    v.extend((0..p.offcodes.len()).map(Item::CanRun));
    v
}

/// Quick direct checks that find a small infeasible starting set without the solver.
fn quick_start(p: &Problem, active: &Active) -> Option<Vec<Item>> {
    if let Some(n) = (0..p.offcodes.len()).find(|&n| p.offcodes[n].candidates.is_empty()) {
        return Some(vec![Item::CanRun(n)]);
    }
    let prep = prepare(p, active);
    if let Some(g) = prep.groups.iter().find(|g| g.cands.is_empty()) {
        // A pull group whose can-run rows do not intersect (or, when explaining, whose
        // only common PE is the host).
        let mut v: Vec<Item> = p
            .constraints
            .iter()
            .enumerate()
            .filter(|(i, c)| {
                active.cons[*i] && c.kind == ConstraintKind::Pull && g.members.contains(&c.a)
            })
            .map(|(i, _)| Item::Con(i))
            .collect();
        v.extend(g.members.iter().map(|&m| Item::CanRun(m)));
        return Some(v);
    }
    // A group too big for every one of its candidates on some resource.
    for g in &prep.groups {
        let mut v = Vec::new();
        let mut all_over = true;
        for c in &g.cands {
            let over: Vec<Resource> = Resource::ALL
                .into_iter()
                .filter(|&r| {
                    prep.caps[c.pe][res_index(r)]
                        .is_some_and(|cap| !fits(c.demand[res_index(r)], cap))
                })
                .collect();
            match over.first() {
                Some(&r) => v.push(Item::Cap(c.pe, r)),
                None => {
                    all_over = false;
                    break;
                }
            }
        }
        if all_over {
            v.extend(p.constraints.iter().enumerate().filter_map(|(i, c)| {
                (c.kind == ConstraintKind::Pull && g.members.contains(&c.a)).then_some(Item::Con(i))
            }));
            v.extend(g.members.iter().map(|&m| Item::CanRun(m)));
            return Some(v);
        }
    }
    None
}

/// Deletion filter: shrink an infeasible set to an irreducible one. Blocks are tried
/// first (halving down to single items), so large sets need few solver calls. Every
/// item kept was found necessary against a superset of the final set, which makes
/// the result irreducible (dropping constraints can only keep a problem feasible).
fn deletion_filter(
    p: &Problem,
    mut s: Vec<Item>,
    forced: Option<usize>,
) -> Result<Vec<Item>, LayoutError> {
    let infeasible = |set: &[Item]| -> Result<bool, LayoutError> {
        Ok(!feasible(p, &active_of(p, set, forced))?)
    };
    let mut i = 0;
    let mut b = (s.len() / 2).max(1);
    while i < s.len() {
        let end = (i + b).min(s.len());
        let trial: Vec<Item> = s[..i].iter().chain(&s[end..]).copied().collect();
        if infeasible(&trial)? {
            s = trial;
        } else if end - i > 1 {
            b = ((end - i) / 2).max(1);
        } else {
            i += 1;
            b = ((s.len() - i) / 2).max(1);
        }
    }
    Ok(s)
}

fn to_conflict(p: &Problem, items: &[Item], forced: Option<usize>) -> Conflict {
    let pe_id = |k: usize| p.pes[k].id.clone();
    let name = |n: usize| p.offcodes[n].name.clone();
    let mut out: Vec<ConflictItem> = Vec::new();
    if let Some(n) = forced {
        out.push(ConflictItem::ForcedOffload {
            offcode: n,
            name: name(n),
        });
    }
    for it in items {
        out.push(match *it {
            Item::CanRun(n) => ConflictItem::CanRun {
                offcode: n,
                name: name(n),
                candidates: p.offcodes[n]
                    .candidates
                    .iter()
                    .map(|c| pe_id(c.pe))
                    .collect(),
            },
            Item::Cap(k, r) => ConflictItem::Capacity {
                pe: k,
                pe_id: pe_id(k),
                resource: r,
                capacity: match r {
                    Resource::Cpu => p.pes[k].cpu,
                    Resource::Memory => p.pes[k].memory_bytes as f64,
                    Resource::Slots => p.pes[k].slots.map_or(f64::INFINITY, f64::from),
                },
            },
            Item::Link(i) => {
                let l = &p.links[i];
                ConflictItem::LinkCap {
                    index: i,
                    a_id: pe_id(l.a),
                    b_id: pe_id(l.b),
                    bandwidth_bps: l.bandwidth_bps,
                    origin: l.origin.clone(),
                }
            }
            Item::Con(i) => {
                let c = &p.constraints[i];
                ConflictItem::Constraint {
                    index: i,
                    constraint: c.kind,
                    a: name(c.a),
                    b: name(c.b),
                    origin: c.origin.clone(),
                }
            }
        });
    }
    Conflict { items: out }
}

/// An irreducible conflict for a problem that is infeasible under `active`.
pub(crate) fn conflict(p: &Problem, active: &Active) -> Result<Conflict, LayoutError> {
    let forced = active.forced;
    let full = all_items(p);
    let start = match quick_start(p, active) {
        Some(s) if !feasible(p, &active_of(p, &s, forced))? => s,
        _ => full,
    };
    let items = deletion_filter(p, start, forced)?;
    Ok(to_conflict(p, &items, forced))
}

fn pull_peers(p: &Problem, n: usize) -> Vec<Peer> {
    p.constraints
        .iter()
        .filter(|c| c.kind == ConstraintKind::Pull && (c.a == n || c.b == n))
        .map(|c| Peer {
            offcode: p.offcodes[if c.a == n { c.b } else { c.a }].name.clone(),
            origin: c.origin.clone(),
        })
        .collect()
}

/// The reason that needs no extra solve, or `None` if a host offcode needs one.
/// What each PE's assigned offcodes use, per resource (cpu, memory, slots).
fn usage(p: &Problem, layout: &Layout) -> Vec<[f64; 3]> {
    let mut used = vec![[0.0f64; 3]; p.pes.len()];
    for (m, &pe) in layout.assignment.iter().enumerate() {
        if let Some(c) = p.offcodes[m].candidates.iter().find(|c| c.pe == pe) {
            used[pe][0] += c.cpu;
            used[pe][1] += c.memory_bytes as f64;
            used[pe][2] += 1.0;
        }
    }
    used
}

/// `used` is [`usage`] of `layout`.
fn cheap_reason(
    p: &Problem,
    prep: &Prep,
    layout: &Layout,
    used: &[[f64; 3]],
    n: usize,
    allow_none: bool,
) -> Option<Why> {
    let k = layout.assignment[n];
    let host = prep.host;
    let g = &prep.groups[prep.group_of[n]];
    if Some(k) != host {
        let mut colocated: Vec<Peer> = Vec::new();
        for f in p
            .flows
            .iter()
            .filter(|f| (f.a == n || f.b == n) && layout.assignment[f.a] == layout.assignment[f.b])
        {
            let peer = Peer {
                offcode: p.offcodes[if f.a == n { f.b } else { f.a }].name.clone(),
                origin: f.origin.clone(),
            };
            // Two flows between the same pair from one declaration (a call
            // binding's requests and replies) name the peer once.
            if !colocated.contains(&peer) {
                colocated.push(peer);
            }
        }
        return Some(Why::Offloaded {
            weight: p.offcodes[n].weight,
            pulled_with: pull_peers(p, n),
            colocated,
            only_candidate: g.cands.len() == 1,
        });
    }
    if p.offcodes[n].candidates.iter().all(|c| Some(c.pe) == host) {
        return Some(Why::NoOffloadCandidate);
    }
    if g.cands.iter().all(|c| Some(c.pe) == host) {
        return Some(Why::PulledToHost {
            pulled_with: pull_peers(p, n),
        });
    }
    if allow_none {
        return None;
    }
    // Cheap reason: is there room for its group on a non-host candidate?
    let mut full = Vec::new();
    let mut room = false;
    for c in g.cands.iter().filter(|c| Some(c.pe) != host) {
        let over: Vec<String> = (0..3)
            .filter_map(|r| {
                let cap = prep.caps[c.pe][r]?;
                (!fits(used[c.pe][r] + c.demand[r], cap)).then(|| {
                    format!(
                        "{} {} ({} of {} used, needs {})",
                        p.pes[c.pe].id,
                        Resource::ALL[r],
                        used[c.pe][r],
                        cap,
                        c.demand[r]
                    )
                })
            })
            .collect();
        if over.is_empty() {
            room = true;
        } else {
            full.extend(over);
        }
    }
    if !room {
        return Some(Why::NoRoom { full });
    }
    let constraints = p
        .constraints
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            matches!(c.kind, ConstraintKind::Gang | ConstraintKind::AsymGang)
                && g.members.iter().any(|&m| m == c.a || m == c.b)
        })
        .map(|(i, c)| {
            ConflictItem::Constraint {
                index: i,
                constraint: c.kind,
                a: p.offcodes[c.a].name.clone(),
                b: p.offcodes[c.b].name.clone(),
                origin: c.origin.clone(),
            }
            .to_string()
        })
        .collect();
    Some(Why::Constrained { constraints })
}

/// Were all stages proved optimal (or trivial)?
fn proven(stages: &[crate::StageStats]) -> bool {
    stages
        .iter()
        .all(|s| s.status.starts_with("optimal") || s.status == "trivial")
}

/// Re-solve with offcode `n` forced off the host and compare. `None` when that
/// cannot be decided within `budget` (or the comparison would not be sound).
fn forced_reason(
    p: &Problem,
    opts: &SolveOptions,
    layout: &Layout,
    n: usize,
    budget: Option<std::time::Duration>,
) -> Option<Why> {
    let mut active = Active::all(p);
    active.forced = Some(n);
    let fprep = prepare(p, &active);
    let sub_opts = SolveOptions {
        time_limit: budget,
        ..opts.clone()
    };
    let deadline = budget.map(|t| std::time::Instant::now() + t);
    match optimise_prep(p, &fprep, &sub_opts, deadline, true).ok()? {
        None => Some(Why::Conflict {
            conflict: conflict(p, &active).ok()?,
        }),
        Some(opt) => {
            if !proven(&opt.stages) {
                return None;
            }
            let (_, w, cross) = crate::prep::assignment(p, &fprep, &opt.choice);
            let eps = 1e-9 * layout.cross_bandwidth.max(1.0);
            if w < layout.offloaded_weight {
                Some(Why::LessWeight {
                    best: layout.offloaded_weight,
                    forced: w,
                })
            } else if w > layout.offloaded_weight {
                None
            } else if cross > layout.cross_bandwidth + eps {
                Some(Why::MoreBandwidth {
                    best: layout.cross_bandwidth,
                    forced: cross,
                })
            } else if cross < layout.cross_bandwidth - eps {
                None
            } else {
                Some(Why::Tie)
            }
        }
    }
}

fn reason(p: &Problem, layout: &Layout, n: usize, why: Why) -> Reason {
    let k = layout.assignment[n];
    Reason {
        offcode: p.offcodes[n].name.clone(),
        pe: p.pes[k].id.clone(),
        offloaded: Some(k) != host_of(p),
        why,
    }
}

/// Reasons without re-solving (used when explanations are off or the problem is big).
pub(crate) fn brief_reasons(p: &Problem, layout: &Layout) -> Vec<Reason> {
    let prep = prepare(p, &Active::all(p));
    let used = usage(p, layout);
    (0..p.offcodes.len())
        .map(|n| {
            // With `allow_none` false every branch returns a reason.
            let why = cheap_reason(p, &prep, layout, &used, n, false).unwrap_or(Why::Tie);
            reason(p, layout, n, why)
        })
        .collect()
}

/// Full reasons: an offcode left on the host is forced off it and the problem
/// re-solved; the outcome (a conflict, a loss of weight, more bandwidth or a tie) is
/// the reason.
pub(crate) fn reasons(
    p: &Problem,
    opts: &SolveOptions,
    layout: &Layout,
) -> Result<Vec<Reason>, LayoutError> {
    // Comparing against a layout only makes sense if it is proved optimal.
    if p.offcodes.len() > opts.explain_max_offcodes || !proven(&layout.stats.stages) {
        return Ok(brief_reasons(p, layout));
    }
    let prep = prepare(p, &Active::all(p));
    let used = usage(p, layout);
    let mut out = Vec::with_capacity(p.offcodes.len());
    let start = std::time::Instant::now();
    let deadline = opts.explain_time_limit.map(|t| start + t);
    let cheap: Vec<Option<Why>> = (0..p.offcodes.len())
        .map(|n| cheap_reason(p, &prep, layout, &used, n, true))
        .collect();
    let mut left = cheap.iter().filter(|w| w.is_none()).count();
    for (n, cheap) in cheap.into_iter().enumerate() {
        let why = match cheap {
            Some(w) => w,
            None => {
                // Share what is left of the explanation budget among the offcodes
                // still to explain; any failure falls back to the cheap reason.
                let now = std::time::Instant::now();
                let share = deadline.map(|d| d.saturating_duration_since(now) / left.max(1) as u32);
                left = left.saturating_sub(1);
                let forced = match share {
                    Some(t) if t.is_zero() => None,
                    _ => forced_reason(p, opts, layout, n, share),
                };
                forced.unwrap_or_else(|| {
                    cheap_reason(p, &prep, layout, &used, n, false).unwrap_or(Why::Tie)
                })
            }
        };
        out.push(reason(p, layout, n, why));
    }
    Ok(out)
}
