//! Verifies an offcode assignment against the problem, independently of how it was
//! found: every offcode on one of its candidate PEs, every PE's CPU, memory and slot
//! capacity, every pull, gang and asym-gang constraint. `check` is the public form;
//! `assert_feasible` stops the program when a solver hands back a layout that breaks
//! one of these invariants, rather than let it be deployed.

use std::fmt;

use sidecore_types::ConstraintKind;

use crate::prep::{Amounts, RESOURCES, fits, host_of, objectives};
use crate::types::{Problem, Resource};

/// What is wrong with an assignment, and where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Violation {
    /// The assignment does not have one entry per offcode.
    #[error("assignment has {entries} entries for {offcodes} offcodes")]
    Length { entries: usize, offcodes: usize },
    /// An offcode sits on a PE outside its can-run row.
    #[error(
        "offcode {offcode} `{name}` is on PE {pe} ({pe_id}), which is not among its candidates"
    )]
    NotACandidate {
        offcode: usize,
        name: String,
        pe: usize,
        /// The PE's id, or `no such PE` when the index is out of range.
        pe_id: String,
    },
    /// A PE holds more than its capacity of one resource.
    #[error("PE `{pe_id}`: {resource} used {} > capacity {}", Shown(*resource, *used), Shown(*resource, *capacity))]
    OverCapacity {
        pe: usize,
        pe_id: String,
        resource: Resource,
        used: f64,
        capacity: f64,
    },
    /// A pull, gang or asym-gang constraint does not hold.
    #[error(
        "constraint {index} ({kind} of `{a}` and `{b}`{}) is violated",
        At(origin)
    )]
    Constraint {
        index: usize,
        kind: ConstraintKind,
        a: String,
        b: String,
        origin: String,
    },
    /// The flows between two PEs exceed the link's bandwidth cap.
    #[error(
        "link {a_id}—{b_id}: {load_bps} bit/s of flows > cap {cap_bps} bit/s{}",
        At(origin)
    )]
    LinkCap {
        a_id: String,
        b_id: String,
        load_bps: f64,
        cap_bps: f64,
        origin: String,
    },
}

/// An amount of a resource with its unit.
struct Shown(Resource, f64);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Resource::Memory => write!(f, "{} bytes", self.1),
            Resource::Cpu | Resource::Slots => write!(f, "{}", self.1),
        }
    }
}

/// ` at ORIGIN`, or nothing when the origin is unknown.
struct At<'a>(&'a str);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, " at {}", self.0)
        }
    }
}

/// Check an assignment (offcode -> PE index) against every can-run row, capacity and
/// constraint. Returns (offloaded weight, cross-PE bandwidth in bit/s), or the first
/// violation found.
pub fn check(problem: &Problem, assignment: &[usize]) -> Result<(u64, f64), Violation> {
    let p = problem;
    if assignment.len() != p.offcodes.len() {
        return Err(Violation::Length {
            entries: assignment.len(),
            offcodes: p.offcodes.len(),
        });
    }
    let used = usage(p, assignment)?;
    check_capacities(p, &used)?;
    check_constraints(p, assignment)?;
    check_links(p, assignment)?;
    Ok(objectives(p, assignment, host_of(p)))
}

/// What each PE's offcodes use; an offcode off its candidates is a violation.
#[allow(clippy::cast_precision_loss)] // memory in bytes far below 2^53
fn usage(p: &Problem, assignment: &[usize]) -> Result<Vec<Amounts>, Violation> {
    let mut used = vec![[0.0f64; RESOURCES]; p.pes.len()];
    for (n, (oc, &k)) in p.offcodes.iter().zip(assignment).enumerate() {
        let candidate = oc.candidates.iter().find(|c| c.pe == k);
        let (Some(c), Some(u)) = (candidate, used.get_mut(k)) else {
            return Err(Violation::NotACandidate {
                offcode: n,
                name: oc.name.clone(),
                pe: k,
                pe_id: p
                    .pes
                    .get(k)
                    .map_or_else(|| "no such PE".into(), |pe| format!("`{}`", pe.id)),
            });
        };
        u[0] += c.cpu;
        u[1] += c.memory_bytes as f64;
        u[2] += 1.0;
    }
    Ok(used)
}

/// Every PE within its CPU, memory and slot capacity.
#[allow(clippy::cast_precision_loss)] // memory in bytes far below 2^53
fn check_capacities(p: &Problem, used: &[Amounts]) -> Result<(), Violation> {
    for (k, pe) in p.pes.iter().enumerate() {
        let caps = [
            Some(pe.cpu),
            Some(pe.memory_bytes as f64),
            pe.slots.map(f64::from),
        ];
        for ((cap, &u), resource) in caps.iter().zip(&used[k]).zip(Resource::ALL) {
            if let Some(cap) = *cap
                && !fits(u, cap)
            {
                return Err(Violation::OverCapacity {
                    pe: k,
                    pe_id: pe.id.clone(),
                    resource,
                    used: u,
                    capacity: cap,
                });
            }
        }
    }
    Ok(())
}

/// Every pull, gang and asym-gang constraint holds.
/// Every link's flows within its bandwidth cap.
fn check_links(p: &Problem, assignment: &[usize]) -> Result<(), Violation> {
    for l in &p.links {
        let load_bps = p
            .flows
            .iter()
            .filter(|f| {
                let (k, m) = (assignment[f.a], assignment[f.b]);
                (k, m) == (l.a, l.b) || (k, m) == (l.b, l.a)
            })
            .map(|f| f.bandwidth_bps)
            .fold(0.0, |a, b| a + b);
        if !fits(load_bps, l.bandwidth_bps) {
            return Err(Violation::LinkCap {
                a_id: p.pes[l.a].id.clone(),
                b_id: p.pes[l.b].id.clone(),
                load_bps,
                cap_bps: l.bandwidth_bps,
                origin: l.origin.clone(),
            });
        }
    }
    Ok(())
}

fn check_constraints(p: &Problem, assignment: &[usize]) -> Result<(), Violation> {
    let host = host_of(p);
    let off = |n: usize| Some(assignment[n]) != host;
    for (index, c) in p.constraints.iter().enumerate() {
        let ok = match c.kind {
            ConstraintKind::Link => true,
            ConstraintKind::Pull => assignment[c.a] == assignment[c.b],
            ConstraintKind::Gang => off(c.a) == off(c.b),
            ConstraintKind::AsymGang => !off(c.a) || off(c.b),
        };
        if !ok {
            return Err(Violation::Constraint {
                index,
                kind: c.kind,
                a: p.offcodes[c.a].name.clone(),
                b: p.offcodes[c.b].name.clone(),
                origin: c.origin.clone(),
            });
        }
    }
    Ok(())
}

/// The invariant of every layout this crate hands out (MILP or greedy): it passes
/// `check`. Always on (it runs once per solve); a broken invariant is a bug in the
/// solver, and stops the program here rather than deploy an oversubscribed layout.
pub(crate) fn assert_feasible(problem: &Problem, assignment: &[usize], solver: &str) {
    if let Err(v) = check(problem, assignment) {
        panic!("layout invariant broken: the {solver} layout is not feasible: {v}");
    }
}
