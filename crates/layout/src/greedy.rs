//! The greedy layouts on groups: first-fit (the warm start for HiGHS and the
//! benchmark's baseline) and density best-fit, optionally filling up a layout found
//! elsewhere; and the local search that improves a layout's bandwidth objective.
//! Both work on the prepared groups and test capacities only through `Prep::room`.

use std::cmp::Reverse;

use crate::prep::{
    Active, Amounts, Dsu, Prep, RESOURCES, add_demand, assignment, prepare, sub_demand,
};
use crate::types::{LayoutError, Problem};
use crate::validate::validate;
use crate::verify::assert_feasible;

/// Most passes of the bandwidth local search over all groups.
const MAX_IMPROVE_PASSES: usize = 8;

/// Least bandwidth gain (bit/s) for which the local search moves a group.
const MIN_GAIN_BPS: f64 = 1e-9;

/// Floor for a component's normalised size when ranking by weight per size.
const MIN_SIZE: f64 = 1e-9;

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

/// The greedy first-fit layout of a problem (offcode -> PE), or `None` if the greedy
/// rule finds no feasible one. Used as a baseline and as HiGHS's warm start.
pub fn greedy(problem: &Problem) -> Result<Option<Vec<usize>>, LayoutError> {
    validate(problem)?;
    let prep = prepare(problem, &Active::all(problem));
    let layout =
        greedy_prep(&prep, Rule::FirstFit).map(|choice| assignment(problem, &prep, &choice).0);
    if let Some(asg) = &layout {
        assert_feasible(problem, asg, "greedy");
    }
    Ok(layout)
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
    let comps = Components::new(prep);
    let order = comps.order(prep, rule);
    let mut fill = Fill::new(prep, &comps, rule, init);
    for &c in &order {
        fill.try_offload(c);
    }
    // Asym-gang a -> b with a offloaded and b on the host cannot arise (closures), nor
    // can a split gang component; the result is feasible by construction, except for
    // link bandwidth caps, which this rule does not look at: checked here.
    fill.rest_to_host().filter(|c| prep.links_ok(c))
}

/// Gang components of groups (roots of a union-find over gang edges) and the
/// asym-gang edges between them.
struct Components {
    /// Group -> its component's root.
    comp: Vec<usize>,
    /// Root -> the groups of its component.
    members: Vec<Vec<usize>>,
    /// Root -> roots it implies through asym-gang.
    succ: Vec<Vec<usize>>,
}

impl Components {
    fn new(prep: &Prep) -> Components {
        let ng = prep.groups.len();
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
        Components {
            comp,
            members,
            succ,
        }
    }

    /// Whether component `c` has a group that cannot stay on the host.
    fn must_off(&self, prep: &Prep, c: usize) -> bool {
        self.members[c]
            .iter()
            .any(|&g| !prep.groups[g].cands.iter().any(|cd| prep.is_host(cd.pe)))
    }

    /// The summed weight of component `c`.
    fn weight(&self, prep: &Prep, c: usize) -> u64 {
        self.members[c]
            .iter()
            .map(|&g| prep.groups[g].weight)
            .sum::<u64>()
    }

    /// Normalised size of component `c`: per group, its smallest share of a non-host
    /// candidate, summed.
    fn size(&self, prep: &Prep, c: usize) -> f64 {
        self.members[c]
            .iter()
            .map(|&g| {
                prep.groups[g]
                    .cands
                    .iter()
                    .filter(|cd| !prep.is_host(cd.pe))
                    .map(|cd| share(prep, cd.pe, &cd.demand))
                    .fold(f64::INFINITY, f64::min)
            })
            .sum()
    }

    /// The components (roots) in the order the rule offloads them: those that must
    /// leave the host first, then by the rule's key.
    #[allow(clippy::cast_precision_loss)] // weights far below 2^53
    fn order(&self, prep: &Prep, rule: Rule) -> Vec<usize> {
        let ng = self.comp.len();
        let mut order: Vec<usize> = (0..ng).filter(|&g| self.comp[g] == g).collect();
        match rule {
            Rule::FirstFit => {
                order.sort_by_key(|&c| (!self.must_off(prep, c), Reverse(self.weight(prep, c)), c));
            }
            Rule::DensityBestFit => {
                let key: Vec<f64> = (0..ng)
                    .map(|c| {
                        if self.comp[c] == c {
                            self.weight(prep, c) as f64 / self.size(prep, c).max(MIN_SIZE)
                        } else {
                            0.0
                        }
                    })
                    .collect();
                order.sort_by(|&a, &b| {
                    (!self.must_off(prep, a))
                        .cmp(&!self.must_off(prep, b))
                        .then(key[b].total_cmp(&key[a]))
                        .then(a.cmp(&b))
                });
            }
        }
        order
    }
}

/// The largest share of a PE's capacity that `d` takes over the resources it caps
/// (infinite when a capacity of zero is asked for more than zero).
fn share(prep: &Prep, pe: usize, d: &Amounts) -> f64 {
    (0..RESOURCES)
        .map(|r| match prep.caps[pe][r] {
            Some(cap) if cap > 0.0 => d[r] / cap,
            Some(_) if d[r] > 0.0 => f64::INFINITY,
            _ => 0.0,
        })
        .fold(0.0, f64::max)
}

/// Where a component stands while the greedy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Undecided,
    Offloaded,
    Host,
}

/// The greedy's working layout.
struct Fill<'a> {
    prep: &'a Prep,
    comps: &'a Components,
    rule: Rule,
    used: Vec<Amounts>,
    /// Group -> candidate index, once placed off the host.
    choice: Vec<Option<usize>>,
    /// Per component root.
    state: Vec<State>,
}

impl<'a> Fill<'a> {
    /// An empty layout, or `init` with its offloaded groups kept in place.
    fn new(prep: &'a Prep, comps: &'a Components, rule: Rule, init: Option<&[usize]>) -> Self {
        let ng = prep.groups.len();
        let mut fill = Fill {
            prep,
            comps,
            rule,
            used: vec![[0.0f64; RESOURCES]; prep.caps.len()],
            choice: vec![None; ng],
            state: vec![State::Undecided; ng],
        };
        for (g, &i) in init.unwrap_or_default().iter().enumerate() {
            let cd = prep.groups[g].cands[i];
            if !prep.is_host(cd.pe) {
                add_demand(&mut fill.used[cd.pe], &cd.demand);
                fill.choice[g] = Some(i);
                fill.state[comps.comp[g]] = State::Offloaded;
            }
        }
        fill
    }

    /// Offload component `c` with everything it implies through asym-gang, or, if
    /// that cannot be done, decide it stays on the host.
    fn try_offload(&mut self, c: usize) {
        if self.state[c] != State::Undecided {
            return;
        }
        let placed = self.closure(c).and_then(|closure| {
            let placed = self.place(&closure)?;
            Some((closure, placed))
        });
        match placed {
            Some((closure, placed)) => {
                for x in closure {
                    self.state[x] = State::Offloaded;
                }
                for (g, i) in placed {
                    self.choice[g] = Some(i);
                }
            }
            None => self.state[c] = State::Host,
        }
    }

    /// The forward closure of `c` over asym-gang among components not yet offloaded;
    /// `None` if one of them is bound to the host or has a group with no non-host
    /// candidate.
    fn closure(&self, c: usize) -> Option<Vec<usize>> {
        let (prep, comps) = (self.prep, self.comps);
        let has_off = |g: usize| prep.groups[g].cands.iter().any(|cd| !prep.is_host(cd.pe));
        let mut closure = vec![c];
        let mut seen = vec![false; comps.comp.len()];
        seen[c] = true;
        let mut i = 0;
        while i < closure.len() {
            let x = closure[i];
            i += 1;
            if self.state[x] == State::Host || comps.members[x].iter().any(|&g| !has_off(g)) {
                return None;
            }
            for &y in &comps.succ[x] {
                if !seen[y] && self.state[y] != State::Offloaded {
                    seen[y] = true;
                    closure.push(y);
                }
            }
        }
        Some(closure)
    }

    /// Place every group of the closure on a non-host candidate with room, by the
    /// rule. Returns (group, candidate index) per group, or `None` (and the use as it
    /// was) when one does not fit.
    fn place(&mut self, closure: &[usize]) -> Option<Vec<(usize, usize)>> {
        let saved = self.used.clone();
        let mut placed = Vec::new();
        for &x in closure {
            for &g in &self.comps.members[x] {
                let Some((i, pe, demand)) = self.slot(g) else {
                    self.used = saved;
                    return None;
                };
                add_demand(&mut self.used[pe], &demand);
                placed.push((g, i));
            }
        }
        Some(placed)
    }

    /// The non-host candidate of group `g` the rule picks among those with room.
    fn slot(&self, g: usize) -> Option<(usize, usize, Amounts)> {
        let (prep, used) = (self.prep, &self.used);
        let mut fitting =
            prep.groups[g].cands.iter().enumerate().filter(|(_, cd)| {
                !prep.is_host(cd.pe) && prep.room(cd.pe, &used[cd.pe], &cd.demand)
            });
        let slot = match self.rule {
            Rule::FirstFit => fitting.next(),
            Rule::DensityBestFit => fitting.max_by(|(_, x), (_, y)| {
                share(prep, x.pe, &used[x.pe])
                    .total_cmp(&share(prep, y.pe, &used[y.pe]))
                    .then(y.pe.cmp(&x.pe))
            }),
        };
        slot.map(|(i, cd)| (i, cd.pe, cd.demand))
    }

    /// Everything not offloaded goes to the host, if it can and there is room.
    fn rest_to_host(mut self) -> Option<Vec<usize>> {
        let prep = self.prep;
        for (g, slot) in self.choice.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            let (i, cd) = prep.groups[g]
                .cands
                .iter()
                .enumerate()
                .find(|(_, cd)| prep.is_host(cd.pe))?;
            add_demand(&mut self.used[cd.pe], &cd.demand);
            if !prep.room(cd.pe, &self.used[cd.pe], &[0.0; RESOURCES]) {
                return None;
            }
            *slot = Some(i);
        }
        self.choice.into_iter().collect()
    }
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
        if a != b && f.bandwidth_bps > 0.0 {
            adj[a].push((b, f.bandwidth_bps));
            adj[b].push((a, f.bandwidth_bps));
        }
    }
    let mut used = prep.usage(choice);
    for _pass in 0..MAX_IMPROVE_PASSES {
        let mut improved = false;
        for g in 0..ng {
            let here = prep.pe_of(choice, g);
            if prep.is_host(here) || adj[g].is_empty() {
                continue;
            }
            if let Some(i) = best_move(prep, choice, &used, &adj[g], g) {
                let was = choice[g];
                choice[g] = i;
                if !prep.links_ok(choice) {
                    choice[g] = was; // the move would overload a capped link
                    continue;
                }
                let old = prep.groups[g].cands[was];
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

/// The candidate of group `g` (off the host, with room) that keeps the most more of
/// its flow traffic (`adj`: peer group, bit/s) on one PE than where it is, if any.
fn best_move(
    prep: &Prep,
    choice: &[usize],
    used: &[Amounts],
    adj: &[(usize, f64)],
    g: usize,
) -> Option<usize> {
    let here = prep.pe_of(choice, g);
    let mut gain_at: Vec<(usize, f64)> = Vec::new();
    for &(h, bw) in adj {
        let k = prep.pe_of(choice, h);
        match gain_at.iter_mut().find(|(pe, _)| *pe == k) {
            Some(e) => e.1 += bw,
            None => gain_at.push((k, bw)),
        }
    }
    let kept_at = |pe: usize| gain_at.iter().find(|(k, _)| *k == pe).map_or(0.0, |e| e.1);
    let stay = kept_at(here);
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in prep.groups[g].cands.iter().enumerate() {
        if c.pe == here || prep.is_host(c.pe) {
            continue;
        }
        let gain = kept_at(c.pe) - stay;
        let room = prep.room(c.pe, &used[c.pe], &c.demand);
        if gain > MIN_GAIN_BPS && room && best.is_none_or(|(_, b)| gain > b) {
            best = Some((i, gain));
        }
    }
    best.map(|(i, _)| i)
}
