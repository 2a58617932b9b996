//! A greedy first-fit layout (the warm start for HiGHS and the benchmark's baseline)
//! and `check`, which verifies any assignment against every constraint and capacity.

use sidecore_types::ConstraintKind;

use crate::model::{Active, Dsu, Prep, fits, host_of, prepare};
use crate::{LayoutError, Problem};

/// Greedy first-fit on pull groups: gang components (closed under asym-gang) are
/// offloaded heaviest first onto the first non-host candidate with room; the rest stay
/// on the host. `None` when this simple rule finds no feasible layout.
pub(crate) fn greedy_prep(prep: &Prep) -> Option<Vec<usize>> {
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
    order.sort_by_key(|&c| (!must_off(c), std::cmp::Reverse(weight(c)), c));

    let mut used = vec![[0.0f64; 3]; kk];
    let mut choice: Vec<Option<usize>> = vec![None; ng];
    // 0 = undecided, 1 = offloaded, 2 = host.
    let mut state = vec![0u8; ng];
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
                    let slot = grp.cands.iter().enumerate().find(|(_, cd)| {
                        !prep.is_host(cd.pe)
                            && (0..3).all(|r| {
                                prep.caps[cd.pe][r]
                                    .is_none_or(|cap| fits(used[cd.pe][r] + cd.demand[r], cap))
                            })
                    });
                    match slot {
                        Some((i, cd)) => {
                            for r in 0..3 {
                                used[cd.pe][r] += cd.demand[r];
                            }
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
    for g in 0..ng {
        if choice[g].is_some() {
            continue;
        }
        let (i, cd) = prep.groups[g]
            .cands
            .iter()
            .enumerate()
            .find(|(_, cd)| prep.is_host(cd.pe))?;
        for r in 0..3 {
            used[cd.pe][r] += cd.demand[r];
            if let Some(cap) = prep.caps[cd.pe][r] {
                if !fits(used[cd.pe][r], cap) {
                    return None;
                }
            }
        }
        choice[g] = Some(i);
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
    Ok(greedy_prep(&prep).map(|choice| crate::model::assignment(problem, &prep, &choice).0))
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
        for r in 0..3 {
            if let Some(cap) = caps[r] {
                if !fits(used[k][r], cap) {
                    return Err(format!(
                        "PE `{}`: resource {r} used {} > capacity {cap}",
                        pe.id, used[k][r]
                    ));
                }
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
    let weight = (0..p.offcodes.len())
        .filter(|&n| off(n))
        .map(|n| u64::from(p.offcodes[n].weight))
        .sum();
    let cross = p
        .flows
        .iter()
        .filter(|f| assignment[f.a] != assignment[f.b])
        .map(|f| f.bandwidth)
        .fold(0.0, |a, b| a + b); // not `sum`: an empty f64 sum is -0.0
    Ok((weight, cross))
}
