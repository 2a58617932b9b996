//! The validated permission model and its expansion into SACL entries.

use std::collections::{BTreeMap, BTreeSet};

use sidecore_sikker_nmu::{DomainId, ProcessId, ServiceId};
use sidecore_sikker_rate::Algorithm;

/// A process definition (§4.6: what to run and how).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ProcessDef {
    /// Program to run; the agent also requires a process claiming this
    /// identity to run this executable.
    pub program: Option<String>,
    /// Its arguments.
    pub args: Vec<String>,
    /// The cgroup (v2 path, `/sikker/bill/101`) a process must be in to be
    /// attested as this one by a Sikker agent; without it, no running process
    /// can hold this identity (identities are derived, never claimed).
    pub cgroup: Option<String>,
    /// The user a process must run as, if set.
    pub uid: Option<u32>,
}

/// A named subset of a service's processes and domains offered to others (§4.6).
#[derive(Clone, Debug, PartialEq)]
pub struct Portal {
    /// Name, unique within the service.
    pub name: String,
    /// Processes offered, or every process (including ones added later).
    pub processes: Selection<ProcessId>,
    /// Domains offered, or every domain (including ones added later).
    pub domains: Selection<DomainId>,
    /// SHA-256 of the password, when the portal is protected.
    pub password_sha256: Option<[u8; 32]>,
}

/// A set of identifiers, or "all of them, now and later" (erratum 16: the dissertation
/// does not say whether a portal listing processes covers processes added later;
/// sidecore makes the policy author say so).
#[derive(Clone, Debug, PartialEq)]
pub enum Selection<T: Ord> {
    /// Exactly these.
    Only(BTreeSet<T>),
    /// Every one the service has, at any time.
    All,
}

impl<T: Ord + Copy> Selection<T> {
    /// The members, given everything the service has.
    pub fn resolve(&self, all: impl Iterator<Item = T>) -> BTreeSet<T> {
        match self {
            Selection::All => all.collect(),
            Selection::Only(s) => {
                let have: BTreeSet<T> = all.collect();
                s.intersection(&have).copied().collect()
            }
        }
    }
}

/// A service: processes and domains (§4.1).
#[derive(Clone, Debug, PartialEq)]
pub struct Service {
    /// Unique name.
    pub name: String,
    /// System-wide unique ID.
    pub id: ServiceId,
    /// Processes by ID.
    pub processes: BTreeMap<ProcessId, ProcessDef>,
    /// Domains: name → ID (each service has its own domain number space).
    pub domains: BTreeMap<String, DomainId>,
    /// Portals by name.
    pub portals: BTreeMap<String, Portal>,
    /// Whether the service may reach all of its own processes in all of its domains
    /// (erratum 8: the two-way OTP example needs it; default on).
    pub self_access: bool,
}

impl Service {
    /// Next free domain ID.
    pub fn next_domain_id(&self) -> DomainId {
        self.domains.values().max().map(|d| d + 1).unwrap_or(0)
    }
}

/// What a grant gives access to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrantTarget {
    /// Through a portal of the destination (credentials already checked).
    Portal(String),
    /// Directly, as the destination's owner wrote it.
    Direct {
        /// Processes.
        processes: Selection<ProcessId>,
        /// Domains.
        domains: Selection<DomainId>,
    },
}

/// A fixed permission: `from` may reach part of `to` (§4.3).
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    /// Source service.
    pub from: ServiceId,
    /// Destination service.
    pub to: ServiceId,
    /// What.
    pub target: GrantTarget,
}

/// A unidirectional aggregate rate limit (§4.5).
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimit {
    /// Source service.
    pub from: ServiceId,
    /// Destination service.
    pub to: ServiceId,
    /// The limit, Gbps (> 0).
    pub gbps: f64,
    /// Enforcement algorithm (SE-TRE by default).
    pub algorithm: Algorithm,
    /// Bucket size, bytes.
    pub bucket_bytes: u64,
}

/// NMU limits from the policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NmuLimits {
    /// OTP lifetime, ms.
    pub otp_ttl_ms: u64,
    /// Live OTPs per process.
    pub otp_cap: usize,
}

impl Default for NmuLimits {
    fn default() -> Self {
        NmuLimits {
            otp_ttl_ms: 10_000,
            otp_cap: 1024,
        }
    }
}

/// A validated policy.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Policy {
    /// Services by ID.
    pub services: BTreeMap<ServiceId, Service>,
    /// Fixed permissions.
    pub grants: Vec<Grant>,
    /// Rate limits; the index is the NMU's rate slot.
    pub rate_limits: Vec<RateLimit>,
    /// NMU limits.
    pub nmu: NmuLimits,
}

/// One SACL entry (Table 3.2): two independent lists and the rate slot.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SaclEntry {
    /// Permitted destination processes.
    pub processes: BTreeSet<ProcessId>,
    /// Permitted destination domains.
    pub domains: BTreeSet<DomainId>,
    /// Index into [`Policy::rate_limits`].
    pub rate_slot: Option<u32>,
}

impl SaclEntry {
    /// The access rule of §3.1.
    pub fn allows(&self, proc: ProcessId, dom: DomainId) -> bool {
        self.processes.contains(&proc) && self.domains.contains(&dom)
    }
}

/// All SACL entries, keyed by (source service, destination service).
pub type Sacl = BTreeMap<(ServiceId, ServiceId), SaclEntry>;

impl Policy {
    /// A service by name.
    pub fn service_by_name(&self, name: &str) -> Option<&Service> {
        self.services.values().find(|s| s.name == name)
    }

    /// Expands grants (through portals), self access and rate limits into SACL
    /// entries. Several grants for the same pair add up. Entries with no process or
    /// no domain allow nothing and are left out.
    pub fn sacl(&self) -> Sacl {
        let mut out: Sacl = BTreeMap::new();
        for s in self.services.values() {
            if s.self_access {
                let e = out.entry((s.id, s.id)).or_default();
                e.processes.extend(s.processes.keys());
                e.domains.extend(s.domains.values());
            }
        }
        for g in &self.grants {
            let Some(dst) = self.services.get(&g.to) else {
                continue;
            };
            let (ps, ds) = match &g.target {
                GrantTarget::Portal(p) => match dst.portals.get(p) {
                    Some(p) => (&p.processes, &p.domains),
                    None => continue,
                },
                GrantTarget::Direct { processes, domains } => (processes, domains),
            };
            let e = out.entry((g.from, g.to)).or_default();
            e.processes
                .extend(ps.resolve(dst.processes.keys().copied()));
            e.domains.extend(ds.resolve(dst.domains.values().copied()));
        }
        out.retain(|_, e| !e.processes.is_empty() && !e.domains.is_empty());
        for (i, r) in self.rate_limits.iter().enumerate() {
            if let Some(e) = out.get_mut(&(r.from, r.to)) {
                e.rate_slot = Some(i as u32);
            }
        }
        out
    }
}
