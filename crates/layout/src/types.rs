//! The public vocabulary of the layout: the problem, options, the solved layout with
//! its reasons and statistics, and the errors and conflicts, each printable for people.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sidecore_types::{ConstraintKind, PeKind};

/// A layout problem: PEs, offcodes with their can-run rows, constraints, flows and
/// the bandwidth caps of the links between PEs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    pub pes: Vec<PeSpec>,
    pub offcodes: Vec<OffcodeSpec>,
    pub constraints: Vec<ConstraintSpec>,
    pub flows: Vec<Flow>,
    #[serde(default)]
    pub links: Vec<LinkCap>,
}

/// HYDRA's bus-bandwidth cap `B_kl` (Eqs. 7.8–7.9): the flows with one end on PE
/// `a` and the other on PE `b` (either way round) carry at most `bandwidth_bps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkCap {
    pub a: usize,
    pub b: usize,
    /// Bits per second.
    pub bandwidth_bps: f64,
    pub origin: String,
}

/// A processing element. Exactly the PEs of kind Host count as "not offloaded"; there
/// may be zero or one host PE.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeSpec {
    pub id: String,
    pub kind: PeKind,
    /// CPU share available for offcodes (e.g. 1.0 for a whole core).
    pub cpu: f64,
    /// Memory available for offcodes, in bytes.
    pub memory_bytes: u64,
    /// At most this many offcodes (threads, channel slots); `None` is unlimited.
    pub slots: Option<u32>,
}

/// weight: priority weight in the offload objective (`sidecore_types::Priority::weight()`).
/// candidates: the can-run row: the PEs this offcode may be placed on, with its demand there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffcodeSpec {
    pub name: String,
    pub weight: u32,
    pub candidates: Vec<Candidate>,
}

/// One entry of an offcode's can-run row: PE index and the offcode's demand there.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub pe: usize,
    pub cpu: f64,
    pub memory_bytes: u64,
}

/// Between offcodes a and b (indices into offcodes). For AsymGang, a -> b: offloading a
/// implies offloading b. origin: where it was declared, e.g. "examples/x.toml:12:3".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConstraintSpec {
    pub kind: ConstraintKind,
    pub a: usize,
    pub b: usize,
    pub origin: String,
}

/// Estimated traffic between offcodes a and b on a declared channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flow {
    pub a: usize,
    pub b: usize,
    /// Bits per second.
    pub bandwidth_bps: f64,
    pub origin: String,
}

/// How to solve.
#[derive(Debug, Clone, PartialEq)]
pub struct SolveOptions {
    /// Wall-clock budget for both objectives together (default 10 s). When it runs
    /// out the best layout found so far is returned and `stats.stages` records the
    /// status and gap. Proving optimality of a tightly packed layout is NP-hard and
    /// can take far longer than finding it.
    pub time_limit: Option<Duration>,
    /// Explain every offcode left on the host by re-solving with it forced off the
    /// host (only for problems of at most `explain_max_offcodes` offcodes; larger
    /// ones get a cheaper reason). Off, the reasons are the cheap ones.
    pub explain: bool,
    /// The size limit for the re-solving explanations.
    pub explain_max_offcodes: usize,
    /// Budget for all re-solving explanations together (default 5 s); an offcode
    /// whose re-solve does not finish in its share gets the cheaper reason.
    pub explain_time_limit: Option<Duration>,
    /// Relative MIP gap accepted for the bandwidth objective (0 = prove optimality).
    /// The offload objective is always solved to optimality (it is integral).
    pub bandwidth_gap: f64,
    /// Give HiGHS the greedy first-fit layout as a starting solution.
    pub warm_start: bool,
    /// Run the second objective (cross-PE bandwidth). Off, only the offloaded weight
    /// is optimised (the benchmark's "objective 1 only" baseline).
    pub bandwidth_objective: bool,
    /// Let HiGHS print its log to stdout (for studying a slow solve).
    pub solver_log: bool,
    /// First solve the model with identical PEs merged (a relaxation), pack its
    /// solution onto the real PEs and use it as bound and starting point.
    pub aggregate: bool,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            time_limit: Some(Duration::from_secs(10)),
            explain: true,
            explain_max_offcodes: 64,
            explain_time_limit: Some(Duration::from_secs(5)),
            bandwidth_gap: 0.0,
            warm_start: true,
            bandwidth_objective: true,
            solver_log: false,
            aggregate: true,
        }
    }
}

/// A solved layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layout {
    /// offcode index -> PE index.
    pub assignment: Vec<usize>,
    /// Sum of the weights of the offcodes placed on non-host PEs.
    pub offloaded_weight: u64,
    /// Sum of the bandwidth of the flows whose ends are on different PEs.
    pub cross_bandwidth: f64,
    /// One per offcode, in offcode order.
    pub reasons: Vec<Reason>,
    pub stats: SolveStats,
}

/// What the solve cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SolveStats {
    /// Offcode groups after merging pull-connected offcodes.
    pub groups: usize,
    /// Variables and rows of the largest model solved.
    pub vars: usize,
    pub constraints: usize,
    /// Validation, model building and both objectives (not the explanations).
    #[serde(with = "duration_secs")]
    pub time: Duration,
    #[serde(with = "duration_secs")]
    pub explain_time: Duration,
    pub stages: Vec<StageStats>,
}

/// One solver stage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageStats {
    /// `offload` or `bandwidth`.
    pub name: String,
    pub vars: usize,
    pub constraints: usize,
    #[serde(with = "duration_secs")]
    pub time: Duration,
    /// The objective value of the returned solution.
    pub objective: f64,
    /// Relative gap between it and the best bound (0 when proved optimal; infinite,
    /// `null` in JSON, when the time limit came before any bound).
    pub gap: f64,
    /// `optimal`, `time-limit`, `trivial` (no decision left), `warm-start`.
    pub status: String,
}

mod duration_secs {
    use serde::Serializer;
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// Why an offcode went where it went.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reason {
    pub offcode: String,
    pub pe: String,
    pub offloaded: bool,
    pub why: Why,
}

/// A pull partner or a co-located flow, with where it was declared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peer {
    pub offcode: String,
    pub origin: String,
}

/// The reason proper.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Why {
    /// Offloaded: maximising the offloaded weight; `pulled_with` share the PE by pull,
    /// `gang` are gang partners; `colocated` are flow peers kept on the same PE.
    Offloaded {
        weight: u32,
        pulled_with: Vec<Peer>,
        colocated: Vec<Peer>,
        only_candidate: bool,
    },
    /// It can run on no non-host PE.
    NoOffloadCandidate,
    /// A pull partner cannot leave the host (or their non-host candidates are disjoint).
    PulledToHost { pulled_with: Vec<Peer> },
    /// Forcing it off the host is infeasible: these constraints are why.
    Conflict { conflict: Conflict },
    /// Forcing it off the host is feasible but loses offloaded weight.
    LessWeight { best: u64, forced: u64 },
    /// Forcing it off the host keeps the weight but costs more cross-PE bandwidth.
    MoreBandwidth { best: f64, forced: f64 },
    /// An equally good layout offloads it; the solver chose this one.
    Tie,
    /// Cheap reason for large problems: its non-host candidates lack room in this layout.
    NoRoom { full: Vec<String> },
    /// Cheap reason for large problems: room exists, but its gang/asym-gang partners or
    /// the weight of other offcodes kept it on the host.
    Constrained { constraints: Vec<String> },
}

/// A small (irreducible) set of constraints that cannot hold together.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conflict {
    pub items: Vec<ConflictItem>,
}

/// A resource with a per-PE capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    Cpu,
    Memory,
    Slots,
}

impl Resource {
    pub const ALL: [Resource; 3] = [Resource::Cpu, Resource::Memory, Resource::Slots];
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
            Resource::Slots => "slots",
        })
    }
}

/// One member of a conflict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ConflictItem {
    /// A declared constraint (index into `Problem::constraints`).
    Constraint {
        index: usize,
        constraint: ConstraintKind,
        a: String,
        b: String,
        origin: String,
    },
    /// The capacity of one PE for one resource (`capacity` in its unit: share, bytes, slots).
    Capacity {
        pe: usize,
        pe_id: String,
        resource: Resource,
        capacity: f64,
    },
    /// An offcode's can-run row: it may only run on these PEs.
    CanRun {
        offcode: usize,
        name: String,
        candidates: Vec<String>,
    },
    /// The offcode being explained, forced off the host.
    ForcedOffload { offcode: usize, name: String },
    /// The bandwidth cap of the link between two PEs.
    LinkCap {
        index: usize,
        a_id: String,
        b_id: String,
        bandwidth_bps: f64,
        origin: String,
    },
}

impl fmt::Display for ConflictItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConflictItem::Constraint {
                constraint,
                a,
                b,
                origin,
                ..
            } => {
                let arrow = if *constraint == ConstraintKind::AsymGang {
                    " -> "
                } else {
                    ", "
                };
                write!(f, "{constraint}(`{a}`{arrow}`{b}`)")?;
                if !origin.is_empty() {
                    write!(f, " at {origin}")?;
                }
                Ok(())
            }
            ConflictItem::Capacity {
                pe_id,
                resource,
                capacity,
                ..
            } => match resource {
                Resource::Cpu => write!(f, "cpu capacity of {pe_id} ({capacity})"),
                Resource::Memory => write!(f, "memory capacity of {pe_id} ({capacity} bytes)"),
                Resource::Slots => write!(f, "slots of {pe_id} ({capacity})"),
            },
            ConflictItem::CanRun {
                name, candidates, ..
            } => {
                if candidates.is_empty() {
                    write!(f, "`{name}` can run on no PE")
                } else {
                    write!(f, "`{name}` can only run on {}", candidates.join(", "))
                }
            }
            ConflictItem::ForcedOffload { name, .. } => {
                write!(f, "`{name}` placed off the host")
            }
            ConflictItem::LinkCap {
                a_id,
                b_id,
                bandwidth_bps,
                origin,
                ..
            } => {
                write!(
                    f,
                    "bandwidth cap of the link {a_id}—{b_id} ({bandwidth_bps} bit/s)"
                )?;
                if !origin.is_empty() {
                    write!(f, " at {origin}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

fn peers(list: &[Peer]) -> String {
    list.iter()
        .map(|p| {
            if p.origin.is_empty() {
                format!("`{}`", p.offcode)
            } else {
                format!("`{}` ({})", p.offcode, p.origin)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Offloaded {
                weight,
                pulled_with,
                colocated,
                only_candidate,
            } => {
                write!(f, "offloading it adds weight {weight}")?;
                if *only_candidate {
                    f.write_str("; it is its only candidate PE")?;
                }
                if !pulled_with.is_empty() {
                    write!(f, "; pulled with {}", peers(pulled_with))?;
                }
                if !colocated.is_empty() {
                    write!(f, "; shares the PE with flow peers {}", peers(colocated))?;
                }
                Ok(())
            }
            Why::NoOffloadCandidate => f.write_str("no non-host candidate"),
            Why::PulledToHost { pulled_with } => write!(
                f,
                "pulled with {}; their candidate PEs share no non-host PE",
                peers(pulled_with)
            ),
            Why::Conflict { conflict } => write!(f, "offloading it conflicts with: {conflict}"),
            Why::LessWeight { best, forced } => write!(
                f,
                "offloading it would lower the offloaded weight from {best} to {forced}"
            ),
            Why::MoreBandwidth { best, forced } => write!(
                f,
                "offloading it would raise cross-PE bandwidth from {best} to {forced}"
            ),
            Why::Tie => f.write_str("an equally good layout offloads it; this one was chosen"),
            Why::NoRoom { full } => {
                write!(f, "no room on its non-host candidates: {}", full.join("; "))
            }
            Why::Constrained { constraints } => {
                if constraints.is_empty() {
                    f.write_str("its non-host candidates were better used by other offcodes")
                } else {
                    write!(
                        f,
                        "room exists, but offloading it would pull in or displace others: {}",
                        constraints.join("; ")
                    )
                }
            }
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.offloaded {
            write!(
                f,
                "`{}` offloaded to {}: {}",
                self.offcode, self.pe, self.why
            )
        } else {
            write!(f, "`{}` on {}: {}", self.offcode, self.pe, self.why)
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.reasons {
            writeln!(f, "{r}")?;
        }
        write!(
            f,
            "offloaded weight {}; cross-PE bandwidth {}",
            self.offloaded_weight, self.cross_bandwidth
        )
    }
}

impl fmt::Display for SolveStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} groups, {} variables, {} rows, solved in {:.3} s",
            self.groups,
            self.vars,
            self.constraints,
            self.time.as_secs_f64()
        )?;
        for s in &self.stages {
            write!(f, "; {s}")?;
        }
        Ok(())
    }
}

impl fmt::Display for StageStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} ({} vars, {} rows, {:.3} s, objective {}, gap {})",
            self.name,
            self.status,
            self.vars,
            self.constraints,
            self.time.as_secs_f64(),
            self.objective,
            self.gap
        )
    }
}

/// Why no layout came out.
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum LayoutError {
    /// The problem itself is malformed: a bad index, NaN, a self-constraint, ...
    #[error("invalid layout problem: {0}")]
    Invalid(String),
    /// No layout satisfies every constraint; here is a small set that conflicts.
    #[error("no layout satisfies all constraints; these conflict: {0}")]
    Infeasible(Conflict),
    /// The solver failed or ran out of time before finding any layout.
    #[error("layout solver: {0}")]
    Solver(String),
}
