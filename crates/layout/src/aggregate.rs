//! Large problems with interchangeable PEs: merge PEs that are identical (same
//! capacities, same candidacy and demand for every group) into classes, giving a
//! much smaller relaxation whose optimum bounds the offloaded weight; then pack its
//! solution back onto the real PEs (and fill up with the greedy) for a starting
//! point, optimal whenever it meets the bound.

use std::collections::{HashMap, VecDeque};

use crate::greedy::{Rule, greedy_from};
use crate::prep::{Amounts, GCand, Group, Prep, RESOURCES, add_demand, fits, sub_demand};
use crate::types::Problem;

/// The problem with identical PEs merged into classes.
pub(crate) struct Aggregate {
    pub prep: Prep,
    /// Class -> its PEs.
    members: Vec<Vec<usize>>,
    /// PE -> its class.
    class_of: Vec<usize>,
}

impl Aggregate {
    /// A layout of the real PEs as a layout of the classes (for a warm start).
    pub fn lift(&self, prep: &Prep, choice: &[usize]) -> Option<Vec<usize>> {
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

/// A PE's column, for finding identical PEs: capacities (as bits) and, per group
/// that can run there, its demand (as bits).
type Key<'a> = (Vec<Option<u64>>, &'a Vec<(usize, [u64; RESOURCES])>);

/// Merge identical PEs: same capacities and, for every group, the same candidacy and
/// demand. A class of m PEs gets m times the capacity; a group's candidate is
/// dropped where it cannot fit one PE of the class. The result is a relaxation
/// (bin packing ignored) with far fewer variables. `None` if no two PEs are identical.
pub(crate) fn aggregate(prep: &Prep) -> Option<Aggregate> {
    if !prep.links.is_empty() {
        return None; // link caps tell PEs apart
    }
    let kk = prep.caps.len();
    let (class_of, members) = classes(prep);
    if members.len() == kk {
        return None;
    }
    #[allow(clippy::cast_precision_loss)] // class sizes far below 2^53
    let caps: Vec<[Option<f64>; RESOURCES]> = members
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
                let fits_one = (0..RESOURCES)
                    .all(|r| prep.caps[c.pe][r].is_none_or(|cap| fits(c.demand[r], cap)));
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
            links: Vec::new(), // none: see the guard at the top
        },
        members,
        class_of,
    })
}

/// PE -> class, and class -> PEs; the host is a class of its own.
fn classes(prep: &Prep) -> (Vec<usize>, Vec<Vec<usize>>) {
    let kk = prep.caps.len();
    let mut sig: Vec<Vec<(usize, [u64; RESOURCES])>> = vec![Vec::new(); kk];
    for (g, grp) in prep.groups.iter().enumerate() {
        for c in &grp.cands {
            sig[c.pe].push((g, c.demand.map(f64::to_bits)));
        }
    }
    let mut class_of = vec![0usize; kk];
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut seen: HashMap<Key<'_>, usize> = HashMap::new();
    for k in 0..kk {
        let caps: Vec<Option<u64>> = prep.caps[k].iter().map(|c| c.map(f64::to_bits)).collect();
        let key = (caps, &sig[k]);
        let c = if prep.is_host(k) {
            None
        } else {
            seen.get(&key).copied()
        };
        if let Some(c) = c {
            class_of[k] = c;
            members[c].push(k);
        } else {
            members.push(vec![k]);
            class_of[k] = members.len() - 1;
            if !prep.is_host(k) {
                seen.insert(key, members.len() - 1);
            }
        }
    }
    (class_of, members)
}

/// Turn an aggregated solution into a real layout: pack each class's groups into its
/// PEs (largest first, fullest PE that fits), try other candidates for the rest, and
/// send what still does not fit to the host together with everything gang or
/// asym-gang ties to it. `None` if that needs a group without a host candidate or
/// overflows the host.
///
/// `flow_rank`, when given, packs in that order (flow neighbours next to each other,
/// so they tend to share a PE) instead of largest first.
pub(crate) fn unpack(
    prep: &Prep,
    agg: &Aggregate,
    agg_choice: &[usize],
    flow_rank: Option<&[usize]>,
) -> Option<Vec<usize>> {
    let mut pack = Packing {
        prep,
        used: vec![[0.0f64; RESOURCES]; prep.caps.len()],
        choice: vec![None; prep.groups.len()],
    };
    let pinned = pinned_groups(prep);
    let unplaced = pack.by_class(agg, agg_choice, flow_rank, &pinned);
    let to_host = pack.elsewhere(unplaced);
    pack.send_home(to_host)?;
    let choice: Vec<usize> = pack.choice.into_iter().collect::<Option<_>>()?;
    if !prep.feasible_choice(&choice) {
        return None;
    }
    // Fill: offload more of what went home where room is left.
    greedy_from(prep, Rule::DensityBestFit, Some(&choice))
        .filter(|c| prep.feasible_choice(c))
        .or(Some(choice))
}

/// Groups that cannot go home: no host candidate, or going home would force one of
/// those home through gang / asym-gang (home(b) forces home(a) for a -> b).
fn pinned_groups(prep: &Prep) -> Vec<bool> {
    let ng = prep.groups.len();
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
    pinned
}

/// A layout being packed from an aggregated solution.
struct Packing<'a> {
    prep: &'a Prep,
    used: Vec<Amounts>,
    /// Group -> candidate index, once placed.
    choice: Vec<Option<usize>>,
}

impl Packing<'_> {
    /// The largest share of a PE's capacity that `d` takes.
    fn share(&self, pe: usize, d: &Amounts) -> f64 {
        (0..RESOURCES)
            .map(|r| match self.prep.caps[pe][r] {
                Some(cap) if cap > 0.0 => d[r] / cap,
                _ => 0.0,
            })
            .fold(0.0, f64::max)
    }

    fn room(&self, pe: usize, d: &Amounts) -> bool {
        self.prep.room(pe, &self.used[pe], d)
    }

    fn place(&mut self, g: usize, i: usize) {
        let c = self.prep.groups[g].cands[i];
        add_demand(&mut self.used[c.pe], &c.demand);
        self.choice[g] = Some(i);
    }

    /// Per class, place the groups the aggregated model put there on the fullest of
    /// its PEs with room: pinned ones first, then largest first (or in `flow_rank`
    /// order). Returns the groups that found no room.
    fn by_class(
        &mut self,
        agg: &Aggregate,
        agg_choice: &[usize],
        flow_rank: Option<&[usize]>,
        pinned: &[bool],
    ) -> Vec<usize> {
        let prep = self.prep;
        let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); agg.members.len()];
        for (g, &i) in agg_choice.iter().enumerate() {
            by_class[agg.prep.groups[g].cands[i].pe].push(g);
        }
        let mut unplaced = Vec::new();
        for (cl, gs) in by_class.iter_mut().enumerate() {
            let in_class = |pe: usize| agg.members[cl].contains(&pe);
            let size = |g: usize| {
                let c = prep.groups[g].cands.iter().find(|c| in_class(c.pe));
                c.map_or(0.0, |c| self.share(c.pe, &c.demand))
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
                    .filter(|(_, c)| in_class(c.pe) && self.room(c.pe, &c.demand))
                    .max_by(|(_, a), (_, b)| {
                        self.share(a.pe, &self.used[a.pe])
                            .total_cmp(&self.share(b.pe, &self.used[b.pe]))
                            .then(b.pe.cmp(&a.pe))
                    })
                    .map(|(i, _)| i);
                match best {
                    Some(i) => self.place(g, i),
                    None => unplaced.push(g),
                }
            }
        }
        unplaced
    }

    /// Any other non-host candidate with room for the unplaced groups; returns those
    /// that found none.
    fn elsewhere(&mut self, unplaced: Vec<usize>) -> Vec<usize> {
        let prep = self.prep;
        let mut to_host = Vec::new();
        for g in unplaced {
            let spot = prep.groups[g]
                .cands
                .iter()
                .position(|c| !prep.is_host(c.pe) && self.room(c.pe, &c.demand));
            match spot {
                Some(i) => self.place(g, i),
                None => to_host.push(g),
            }
        }
        to_host
    }

    /// Send `to_host` home, closed under gang (both ways) and asym-gang (a -> b: b
    /// home => a home). `None` if one of them has no host candidate.
    fn send_home(&mut self, to_host: Vec<usize>) -> Option<()> {
        let prep = self.prep;
        let ng = prep.groups.len();
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
        for (g, &at_home) in home.iter().enumerate().take(ng) {
            let on_host = self.choice[g].is_some_and(|i| prep.is_host(prep.groups[g].cands[i].pe));
            if !at_home || on_host {
                continue;
            }
            if let Some(i) = self.choice[g] {
                let c = prep.groups[g].cands[i];
                sub_demand(&mut self.used[c.pe], &c.demand);
            }
            let i = prep.groups[g]
                .cands
                .iter()
                .position(|c| prep.is_host(c.pe))?;
            self.place(g, i);
        }
        Some(())
    }
}

/// A rank per group that walks each flow-connected component breadth first,
/// components in order of their first group.
pub(crate) fn flow_order(p: &Problem, prep: &Prep) -> Vec<usize> {
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
    let mut queue = VecDeque::new();
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
