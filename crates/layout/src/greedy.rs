//! A greedy first-fit layout (the warm start for HiGHS and the benchmark's baseline)
//! and `check`, which verifies any assignment against every constraint and capacity.

use sidecore_types::ConstraintKind;

use crate::model::{Active, Dsu, Prep, add_demand, fits, host_of, prepare, sub_demand};
use crate::{LayoutError, Problem};

/// How the greedy orders its work and picks a PE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Heaviest (priority weight) first, first non-host candidate with room: what a
    /// runtime deploying in `OFFLOAD_PRIORITY` order does. The benchmark baseline.
    FirstFit,
    /// Best weight per unit of (normalised) demand first, onto the fullest candidate
    /// that still has room: a better start for the solver.
    DensityBestFit,
}

/// Greedy on pull groups: gang components (closed under asym-gang) are offloaded in
/// the rule's order onto a non-host candidate with room; the rest stay on the host.
/// `None` when this simple rule finds no feasible layout.
pub(crate) fn greedy_prep(prep: &Prep, rule: Rule) -> Option<Vec<usize>> {
    greedy_from(prep, rule, None)
}

/// The greedy, optionally starting from a feasible layout `init` whose offloaded
/// groups stay where they are: then it only tries to offload more ("fill").
pub(crate) fn greedy_from(prep: &Prep, rule: Rule, init: Option<&[usize]>) -> Option<Vec<usize>> {
    let ng = prep.groups.len();
    let kk = prep.caps.len();
    let mut dsu = Dsu::new(ng);
    for &(a, b, sym) in &prep.gangs {
        if sym {
            dsu.union(a, b);
        }
    }
    let comp: Vec<usize> = (0..ng).map(|g| dsu.find(g)).collect();
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); ng];
    for g in 0..ng {
        members[comp[g]].push(g);
    }
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); ng];
    for &(a, b, sym) in &prep.gangs {
        if !sym && comp[a] != comp[b] {
            succ[comp[a]].push(comp[b]);
        }
    }
    let has_host = |g: usize| prep.groups[g].cands.iter().any(|c| prep.is_host(c.pe));
    let has_off = |g: usize| prep.groups[g].cands.iter().any(|c| !prep.is_host(c.pe));
    let roots: Vec<usize> = (0..ng).filter(|&g| comp[g] == g).collect();
    let must_off = |c: usize| members[c].iter().any(|&g| !has_host(g));
    let weight = |c: usize| {
        members[c]
            .iter()
            .map(|&g| prep.groups[g].weight)
            .sum::<u64>()
    };
    let mut order = roots.clone();
    // Normalised size of a group: its smallest max-over-resources share of a candidate.
    let share = |pe: usize, d: &[f64; 3]| -> f64 {
        (0..3)
            .map(|r| match prep.caps[pe][r] {
                Some(cap) if cap > 0.0 => d[r] / cap,
                Some(_) if d[r] > 0.0 => f64::INFINITY,
                _ => 0.0,
            })
            .fold(0.0, f64::max)
    };
    let size = |c: usize| -> f64 {
        members[c]
            .iter()
            .map(|&g| {
                prep.groups[g]
                    .cands
                    .iter()
                    .filter(|cd| !prep.is_host(cd.pe))
                    .map(|cd| share(cd.pe, &cd.demand))
                    .fold(f64::INFINITY, f64::min)
            })
            .sum()
    };
    match rule {
        Rule::FirstFit => {
            order.sort_by_key(|&c| (!must_off(c), std::cmp::Reverse(weight(c)), c));
        }
        Rule::DensityBestFit => {
            let key: Vec<f64> = (0..ng)
                .map(|c| {
                    if comp[c] == c {
                        weight(c) as f64 / size(c).max(1e-9)
                    } else {
                        0.0
                    }
                })
                .collect();
            order.sort_by(|&a, &b| {
                (!must_off(a))
                    .cmp(&!must_off(b))
                    .then(key[b].total_cmp(&key[a]))
                    .then(a.cmp(&b))
            });
        }
    }

    let mut used = vec![[0.0f64; 3]; kk];
    let mut choice: Vec<Option<usize>> = vec![None; ng];
    // 0 = undecided, 1 = offloaded, 2 = host.
    let mut state = vec![0u8; ng];
    if let Some(init) = init {
        for (g, &i) in init.iter().enumerate() {
            let cd = prep.groups[g].cands[i];
            if !prep.is_host(cd.pe) {
                add_demand(&mut used[cd.pe], &cd.demand);
                choice[g] = Some(i);
                state[comp[g]] = 1;
            }
        }
    }
    for &c in &order {
        if state[c] != 0 {
            continue;
        }
        // Forward closure over asym-gang among components not yet offloaded.
        let mut closure = vec![c];
        let mut seen = vec![false; ng];
        seen[c] = true;
        let mut i = 0;
        let mut ok = true;
        while i < closure.len() {
            let x = closure[i];
            i += 1;
            if state[x] == 2 || members[x].iter().any(|&g| !has_off(g)) {
                ok = false;
                break;
            }
            for &y in &succ[x] {
                if !seen[y] && state[y] != 1 {
                    seen[y] = true;
                    closure.push(y);
                }
            }
        }
        let saved = used.clone();
        let mut placed = Vec::new();
        if ok {
            'place: for &x in &closure {
                for &g in &members[x] {
                    let grp = &prep.groups[g];
                    let fitting = grp.cands.iter().enumerate().filter(|(_, cd)| {
                        !prep.is_host(cd.pe) && prep.room(cd.pe, &used[cd.pe], &cd.demand)
                    });
                    let slot = match rule {
                        Rule::FirstFit => fitting.into_iter().next(),
                        Rule::DensityBestFit => fitting.max_by(|(_, x), (_, y)| {
                            share(x.pe, &used[x.pe])
                                .total_cmp(&share(y.pe, &used[y.pe]))
                                .then(y.pe.cmp(&x.pe))
                        }),
                    };
                    match slot {
                        Some((i, cd)) => {
                            add_demand(&mut used[cd.pe], &cd.demand);
                            placed.push((g, i));
                        }
                        None => {
                            ok = false;
                            break 'place;
                        }
                    }
                }
            }
        }
        if ok {
            for &x in &closure {
                state[x] = 1;
            }
            for (g, i) in placed {
                choice[g] = Some(i);
            }
        } else {
            used = saved;
            state[c] = 2;
        }
    }
    // Everything not offloaded goes to the host, if it can and there is room.
    for (g, slot) in choice.iter_mut().enumerate() {
        if slot.is_some() {
            continue;
        }
        let (i, cd) = prep.groups[g]
            .cands
            .iter()
            .enumerate()
            .find(|(_, cd)| prep.is_host(cd.pe))?;
        add_demand(&mut used[cd.pe], &cd.demand);
        if !prep.room(cd.pe, &used[cd.pe], &[0.0; 3]) {
            return None;
        }
        *slot = Some(i);
    }
    // Asym-gang a -> b with a offloaded and b on the host cannot arise (closures), nor
    // can a split gang component; the result is feasible by construction.
    choice.into_iter().collect()
}

/// The greedy first-fit layout of a problem (offcode -> PE), or `None` if the greedy
/// rule finds no feasible one. Used as a baseline and as HiGHS's warm start.
pub fn greedy(problem: &Problem) -> Result<Option<Vec<usize>>, LayoutError> {
    crate::validate::validate(problem)?;
    let prep = prepare(problem, &Active::all(problem));
    Ok(greedy_prep(&prep, Rule::FirstFit)
        .map(|choice| crate::model::assignment(problem, &prep, &choice).0))
}

/// Check an assignment (offcode -> PE index) against every constraint and capacity.
/// Returns (offloaded weight, cross-PE bandwidth), or what is violated.
pub fn check(problem: &Problem, assignment: &[usize]) -> Result<(u64, f64), String> {
    let p = problem;
    if assignment.len() != p.offcodes.len() {
        return Err(format!(
            "assignment has {} entries for {} offcodes",
            assignment.len(),
            p.offcodes.len()
        ));
    }
    let host = host_of(p);
    let mut used = vec![[0.0f64; 3]; p.pes.len()];
    for (n, (oc, &k)) in p.offcodes.iter().zip(assignment).enumerate() {
        let Some(c) = oc.candidates.iter().find(|c| c.pe == k) else {
            return Err(format!(
                "offcode {n} `{}` is on PE {k}, not a candidate",
                oc.name
            ));
        };
        used[k][0] += c.cpu;
        used[k][1] += c.memory as f64;
        used[k][2] += 1.0;
    }
    for (k, pe) in p.pes.iter().enumerate() {
        let caps = [
            Some(pe.cpu),
            Some(pe.memory as f64),
            pe.slots.map(f64::from),
        ];
        for ((cap, u), r) in caps.iter().zip(&used[k]).zip(crate::Resource::ALL) {
            if let Some(cap) = cap
                && !fits(*u, *cap)
            {
                return Err(format!("PE `{}`: {r} used {u} > capacity {cap}", pe.id));
            }
        }
    }
    let off = |n: usize| Some(assignment[n]) != host;
    for (i, c) in p.constraints.iter().enumerate() {
        let ok = match c.kind {
            ConstraintKind::Link => true,
            ConstraintKind::Pull => assignment[c.a] == assignment[c.b],
            ConstraintKind::Gang => off(c.a) == off(c.b),
            ConstraintKind::AsymGang => !off(c.a) || off(c.b),
        };
        if !ok {
            return Err(format!("constraint {i} ({}) violated", c.kind));
        }
    }
    Ok(crate::model::objectives(p, assignment, host))
}

/// Local search for the bandwidth objective: move an offloaded group to another
/// non-host candidate with room when that keeps more flow traffic on one PE. Moves
/// between non-host PEs leave every `O` unchanged, so the offloaded weight, gang and
/// asym-gang constraints hold; capacities are checked. Used to polish the solver's
/// starting point and any layout the time limit cut short.
pub(crate) fn improve_bandwidth(p: &Problem, prep: &Prep, choice: &mut [usize]) {
    let ng = prep.groups.len();
    let mut adj: Vec<Vec<(usize, f64)>> = vec![Vec::new(); ng];
    for f in &p.flows {
        let (a, b) = (prep.group_of[f.a], prep.group_of[f.b]);
        if a != b && f.bandwidth > 0.0 {
            adj[a].push((b, f.bandwidth));
            adj[b].push((a, f.bandwidth));
        }
    }
    let pe_of = |choice: &[usize], g: usize| prep.groups[g].cands[choice[g]].pe;
    let mut used = vec![[0.0f64; 3]; prep.caps.len()];
    for (g, &i) in choice.iter().enumerate() {
        let c = &prep.groups[g].cands[i];
        add_demand(&mut used[c.pe], &c.demand);
    }
    for _pass in 0..8 {
        let mut improved = false;
        for g in 0..ng {
            let here = pe_of(choice, g);
            if prep.is_host(here) || adj[g].is_empty() {
                continue;
            }
            let mut gain_at: Vec<(usize, f64)> = Vec::new();
            for &(h, bw) in &adj[g] {
                let k = pe_of(choice, h);
                match gain_at.iter_mut().find(|(pe, _)| *pe == k) {
                    Some(e) => e.1 += bw,
                    None => gain_at.push((k, bw)),
                }
            }
            let stay = gain_at
                .iter()
                .find(|(k, _)| *k == here)
                .map_or(0.0, |e| e.1);
            let mut best: Option<(usize, f64)> = None;
            for (i, c) in prep.groups[g].cands.iter().enumerate() {
                if c.pe == here || prep.is_host(c.pe) {
                    continue;
                }
                let gain = gain_at
                    .iter()
                    .find(|(k, _)| *k == c.pe)
                    .map_or(0.0, |e| e.1)
                    - stay;
                let room = prep.room(c.pe, &used[c.pe], &c.demand);
                if gain > 1e-9 && room && best.is_none_or(|(_, b)| gain > b) {
                    best = Some((i, gain));
                }
            }
            if let Some((i, _)) = best {
                let old = prep.groups[g].cands[choice[g]];
                let new = prep.groups[g].cands[i];
                sub_demand(&mut used[old.pe], &old.demand);
                add_demand(&mut used[new.pe], &new.demand);
                choice[g] = i;
                improved = true;
            }
        }
        if !improved {
            break;
        }
    }
}
