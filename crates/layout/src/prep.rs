//! The ground floor of the solver: the problem reduced to what every solver works
//! on. Pull-connected offcodes are merged into groups (they share one PE), each with
//! its candidate PEs and summed demand there; per-PE capacities; gang and asym-gang
//! edges between groups. Also the capacity test (`fits`, `Prep::room`) that every
//! solver uses, and the objectives of a choice. Nothing here imports another module
//! of the crate except the public vocabulary.

use std::collections::HashMap;

use sidecore_types::{ConstraintKind, PeKind};

use crate::types::{Problem, Resource};

/// Number of capacitated resources: CPU share, memory in bytes, slots.
pub(crate) const RESOURCES: usize = 3;

/// One amount per resource, in `Resource::ALL` order: CPU share, memory in bytes
/// and slots (one per offcode).
pub(crate) type Amounts = [f64; RESOURCES];

/// Relative tolerance when checking a capacity: HiGHS's feasibility tolerance on
/// rows scaled by their capacity.
pub(crate) const CAPACITY_TOLERANCE: f64 = 1e-6;

/// Which constraint groups are switched on. The deletion filter switches them off one
/// by one; a switched-off can-run row lets the offcode run anywhere (with no demand
/// on PEs outside its row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Active {
    pub canrun: Vec<bool>,
    pub cap: Vec<[bool; RESOURCES]>,
    pub cons: Vec<bool>,
    /// Link bandwidth caps switched on.
    pub links: Vec<bool>,
    /// An offcode forced off the host (for explaining why it stayed there).
    pub forced: Option<usize>,
}

impl Active {
    /// Everything on, nothing forced.
    pub fn all(p: &Problem) -> Active {
        Active {
            canrun: vec![true; p.offcodes.len()],
            cap: vec![[true; RESOURCES]; p.pes.len()],
            cons: vec![true; p.constraints.len()],
            links: vec![true; p.links.len()],
            forced: None,
        }
    }
}

/// A candidate PE of a group, with the group's summed demand there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GCand {
    pub pe: usize,
    pub demand: Amounts,
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
    pub caps: Vec<[Option<f64>; RESOURCES]>,
    /// Active gang (`sym = true`) and asym-gang edges between distinct groups.
    pub gangs: Vec<(usize, usize, bool)>,
    /// Active link bandwidth caps.
    pub links: Vec<LinkRow>,
}

/// One active link cap on groups: the flows between distinct groups it may carry.
#[derive(Debug, Clone)]
pub(crate) struct LinkRow {
    pub a: usize,
    pub b: usize,
    pub cap_bps: f64,
    /// (group, group, bit/s) for every flow between distinct groups.
    pub flows: Vec<(usize, usize, f64)>,
}

impl LinkRow {
    /// The traffic a group choice puts on this link.
    pub fn load(&self, prep: &Prep, choice: &[usize]) -> f64 {
        self.flows
            .iter()
            .filter(|&&(g, h, _)| {
                let (k, l) = (prep.pe_of(choice, g), prep.pe_of(choice, h));
                (k, l) == (self.a, self.b) || (k, l) == (self.b, self.a)
            })
            .map(|f| f.2)
            .fold(0.0, |a, b| a + b)
    }
}

impl Prep {
    /// Whether `pe` is the host PE (placing there is "not offloaded").
    pub fn is_host(&self, pe: usize) -> bool {
        self.host == Some(pe)
    }

    /// Whether `pe`, already using `used`, has room for `demand` more on every
    /// resource it caps. The one capacity test of the group solvers.
    pub fn room(&self, pe: usize, used: &Amounts, demand: &Amounts) -> bool {
        (0..RESOURCES).all(|r| self.caps[pe][r].is_none_or(|cap| fits(used[r] + demand[r], cap)))
    }

    /// What each PE uses under a group choice (group -> candidate index).
    pub fn usage(&self, choice: &[usize]) -> Vec<Amounts> {
        let mut used = vec![[0.0; RESOURCES]; self.caps.len()];
        for (g, &i) in choice.iter().enumerate() {
            let c = self.groups[g].cands[i];
            add_demand(&mut used[c.pe], &c.demand);
        }
        used
    }

    /// Does a group choice satisfy every capacity, gang and asym-gang row?
    pub fn feasible_choice(&self, choice: &[usize]) -> bool {
        let used = self.usage(choice);
        let caps_ok = (0..self.caps.len()).all(|k| self.room(k, &used[k], &[0.0; RESOURCES]));
        let off = |g: usize| !self.is_host(self.groups[g].cands[choice[g]].pe);
        caps_ok
            && self.links_ok(choice)
            && self.gangs.iter().all(|&(a, b, sym)| {
                if sym {
                    off(a) == off(b)
                } else {
                    !off(a) || off(b)
                }
            })
    }

    /// Does a group choice keep every active link within its bandwidth cap?
    pub fn links_ok(&self, choice: &[usize]) -> bool {
        self.links
            .iter()
            .all(|l| fits(l.load(self, choice), l.cap_bps))
    }

    /// The weight of the groups a choice places off the host.
    pub fn offload_weight(&self, choice: &[usize]) -> u64 {
        self.groups
            .iter()
            .zip(choice)
            .filter(|(g, c)| !self.is_host(g.cands[**c].pe))
            .map(|(g, _)| g.weight)
            .sum()
    }

    /// The PE a choice puts group `g` on.
    pub fn pe_of(&self, choice: &[usize], g: usize) -> usize {
        self.groups[g].cands[choice[g]].pe
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

/// The index of the host PE, if there is one.
pub(crate) fn host_of(p: &Problem) -> Option<usize> {
    p.pes.iter().position(|pe| pe.kind == PeKind::Host)
}

/// Merge pull groups and intersect their can-run rows under `active`.
pub(crate) fn prepare(p: &Problem, active: &Active) -> Prep {
    let host = host_of(p);
    let (group_of, members) = pull_groups(p, active);
    let groups = members
        .into_iter()
        .map(|m| group(p, active, host, m))
        .collect();
    let caps = capacities(p, active);
    let gangs = gang_edges(p, active, &group_of);
    let links = link_rows(p, active, &group_of);
    Prep {
        groups,
        group_of,
        host,
        caps,
        gangs,
        links,
    }
}

/// Active link caps, with the flows between distinct groups each may carry.
fn link_rows(p: &Problem, active: &Active, group_of: &[usize]) -> Vec<LinkRow> {
    let flows: Vec<(usize, usize, f64)> = p
        .flows
        .iter()
        .map(|f| (group_of[f.a], group_of[f.b], f.bandwidth_bps))
        .filter(|&(g, h, w)| g != h && w > 0.0)
        .collect();
    p.links
        .iter()
        .zip(&active.links)
        .filter(|(_, on)| **on)
        .map(|(l, _)| LinkRow {
            a: l.a,
            b: l.b,
            cap_bps: l.bandwidth_bps,
            flows: flows.clone(),
        })
        .collect()
}

/// Offcode -> group, and the members of each group, in order of first member.
fn pull_groups(p: &Problem, active: &Active) -> (Vec<usize>, Vec<Vec<usize>>) {
    let n = p.offcodes.len();
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
    (group_of, members)
}

/// One group: its weight, and the PEs every member can run on (all PEs for a member
/// whose can-run row is off; not the host when a member is forced off it) with the
/// summed demand there.
fn group(p: &Problem, active: &Active, host: Option<usize>, members: Vec<usize>) -> Group {
    let kk = p.pes.len();
    let mut count = vec![0usize; kk];
    let mut demand = vec![[0.0f64; RESOURCES]; kk];
    let mut weight = 0u64;
    for &o in &members {
        let oc = &p.offcodes[o];
        weight += u64::from(oc.weight);
        for c in &oc.candidates {
            if active.canrun[o] {
                count[c.pe] += 1;
            }
            demand[c.pe][0] += c.cpu;
            demand[c.pe][1] += c.memory_bytes as f64;
        }
        if !active.canrun[o] {
            for c in &mut count {
                *c += 1;
            }
        }
    }
    let forced = active.forced.is_some_and(|f| members.contains(&f));
    let cands = (0..kk)
        .filter(|&k| count[k] == members.len() && !(forced && host == Some(k)))
        .map(|k| GCand {
            pe: k,
            demand: [demand[k][0], demand[k][1], members.len() as f64],
        })
        .collect();
    Group {
        members,
        weight,
        cands,
    }
}

/// Capacity per PE and resource under `active`; `None` where off or unlimited.
fn capacities(p: &Problem, active: &Active) -> Vec<[Option<f64>; RESOURCES]> {
    p.pes
        .iter()
        .enumerate()
        .map(|(k, pe)| {
            let on = active.cap[k];
            [
                on[0].then_some(pe.cpu),
                on[1].then_some(pe.memory_bytes as f64),
                if on[2] { pe.slots.map(f64::from) } else { None },
            ]
        })
        .collect()
}

/// Active gang and asym-gang constraints as edges between distinct groups.
fn gang_edges(p: &Problem, active: &Active, group_of: &[usize]) -> Vec<(usize, usize, bool)> {
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
    gangs
}

/// Resource index in `GCand::demand` and `Prep::caps`.
pub(crate) fn res_index(r: Resource) -> usize {
    match r {
        Resource::Cpu => 0,
        Resource::Memory => 1,
        Resource::Slots => 2,
    }
}

/// Whether `used` is within `cap`, up to `CAPACITY_TOLERANCE`.
pub(crate) fn fits(used: f64, cap: f64) -> bool {
    used <= cap + CAPACITY_TOLERANCE * cap.max(1.0)
}

/// Add a candidate's demand to a PE's use.
pub(crate) fn add_demand(used: &mut Amounts, d: &Amounts) {
    used.iter_mut().zip(d).for_each(|(u, x)| *u += x);
}

/// Remove a candidate's demand from a PE's use.
pub(crate) fn sub_demand(used: &mut Amounts, d: &Amounts) {
    used.iter_mut().zip(d).for_each(|(u, x)| *u -= x);
}

/// Offcode assignment, offloaded weight and cross-PE bandwidth (bit/s) of a group
/// choice.
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
/// `host` PE) and cross-PE flow bandwidth in bit/s.
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
        .map(|f| f.bandwidth_bps)
        .fold(0.0, |a, b| a + b); // not `sum`: an empty f64 sum is -0.0
    (weight, cross)
}

/// Two groups joined by flows and the candidate index pairs on which they would
/// share a PE: the terms of the bandwidth objective.
#[derive(Debug, Clone)]
pub(crate) struct SharedPair {
    pub a: usize,
    pub b: usize,
    /// The flows' summed bandwidth, in bit/s.
    pub bandwidth_bps: f64,
    /// (candidate index of `a`, candidate index of `b`) on the same PE.
    pub common: Vec<(usize, usize)>,
}

/// Flow pairs between distinct groups (bandwidth summed) that could share a PE.
pub(crate) fn shared_pairs(p: &Problem, prep: &Prep) -> Vec<SharedPair> {
    let mut pairs: HashMap<(usize, usize), f64> = HashMap::new();
    for f in &p.flows {
        let (ga, gb) = (prep.group_of[f.a], prep.group_of[f.b]);
        if ga != gb && f.bandwidth_bps > 0.0 {
            *pairs.entry((ga.min(gb), ga.max(gb))).or_insert(0.0) += f.bandwidth_bps;
        }
    }
    let mut pairs: Vec<((usize, usize), f64)> = pairs.into_iter().collect();
    pairs.sort_by_key(|a| a.0);
    pairs
        .into_iter()
        .filter_map(|((a, b), bandwidth_bps)| {
            let mut common = Vec::new();
            for (i, ca) in prep.groups[a].cands.iter().enumerate() {
                if let Some(j) = prep.groups[b].cands.iter().position(|cb| cb.pe == ca.pe) {
                    common.push((i, j));
                }
            }
            (!common.is_empty()).then_some(SharedPair {
                a,
                b,
                bandwidth_bps,
                common,
            })
        })
        .collect()
}

/// Bandwidth (bit/s) kept on one PE by `choice` among the pairs that could share one.
pub(crate) fn saved(shared: &[SharedPair], choice: &[usize], prep: &Prep) -> f64 {
    shared
        .iter()
        .filter(|s| prep.pe_of(choice, s.a) == prep.pe_of(choice, s.b))
        .map(|s| s.bandwidth_bps)
        .sum()
}
