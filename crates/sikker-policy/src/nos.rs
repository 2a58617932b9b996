//! The Network OS compiler (§4.6, §6.1.4): policy + placement → per-host NMU tables,
//! and incremental updates when a process, a domain or a permission is added or
//! removed, or a whole new policy replaces the running one (`update`).
//!
//! The SACL is recomputed from the (small) policy on every change and diffed against
//! the previous one; only the NMU entries that differ are rewritten, and only on the
//! hosts where the source service has a resident process. A process's permissions are
//! installed before it is reported placed, and removed with it (§6.1.4).

use std::collections::{BTreeMap, BTreeSet};

use sidecore_sikker_nmu::{
    Address, DomainId, LocalIndex, NmuConfig, NmuError, NmuTables, PermissionView, ProcessId,
    ServiceId,
};

use crate::model::{Grant, Policy, Sacl, Selection};

/// Which processes run on which host, in host order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// Host name and its processes.
    pub hosts: Vec<(String, Vec<(ServiceId, ProcessId)>)>,
    /// Where a process listens for plain TCP (Sikker's L4 mode, for services
    /// that cannot link the client library): its addresses, on its host.
    pub l4: BTreeMap<(ServiceId, ProcessId), Vec<std::net::SocketAddr>>,
    /// Where each host's agent listens for the other hosts' agents (the
    /// `agent` of its `[[host]]`; hosts without one are reached by address
    /// given elsewhere, such as `sikker agent --peer`).
    pub agents: BTreeMap<String, std::net::SocketAddr>,
}

/// What an update changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Hosts whose tables changed.
    pub hosts: BTreeSet<String>,
    /// NMU SACL entries written.
    pub entries_set: usize,
    /// NMU SACL entries removed.
    pub entries_removed: usize,
    /// Rate-limit slots whose limit, algorithm or bucket changed, appeared or went
    /// (the NMU holds only the slot, so a new rate alone rewrites no entry).
    pub rate_limits_changed: usize,
}

/// Why an update was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NosError {
    /// No such service.
    #[error("unknown service {0}")]
    UnknownService(ServiceId),
    /// No such host.
    #[error("unknown host `{0}`")]
    UnknownHost(String),
    /// The process is not defined or not placed.
    #[error("service {0} has no placed process {1}")]
    UnknownProcess(ServiceId, ProcessId),
    /// The process is already placed.
    #[error("process {0}:{1} is already placed on host `{2}`")]
    AlreadyPlaced(ServiceId, ProcessId, String),
    /// The domain name exists.
    #[error("service {0} already has domain `{1}`")]
    DomainExists(ServiceId, String),
    /// No such domain.
    #[error("service {0} has no domain `{1}`")]
    UnknownDomain(ServiceId, String),
    /// The placement names a process the policy does not define.
    #[error("placement: service {0} has no process {1}")]
    PlacementUnknown(ServiceId, ProcessId),
    /// A new policy is inconsistent in itself (a grant to an unknown service, …).
    #[error("invalid policy: {0}")]
    InvalidPolicy(String),
    /// A new policy no longer defines a process that is placed.
    #[error(
        "the new policy does not define process {service}:{process}, which is placed on host `{host}` (take it out of the placement first)"
    )]
    PlacedUndefined {
        /// Service name.
        service: String,
        /// Process.
        process: ProcessId,
        /// Where it is placed.
        host: String,
    },
    /// The NMU refused.
    #[error("NMU: {0}")]
    Nmu(#[from] NmuError),
}

struct Host {
    index: u32,
    tables: NmuTables,
    next_slot: u32,
}

/// The Network OS: the policy, where every process runs, and every host's NMU.
pub struct Nos {
    policy: Policy,
    hosts: BTreeMap<String, Host>,
    placed: BTreeMap<(ServiceId, ProcessId), (String, Address)>,
    sacl: Sacl,
}

impl Nos {
    /// Compiles a policy and a placement into per-host NMU tables.
    pub fn compile(policy: Policy, placement: &Placement) -> Result<Nos, NosError> {
        let cfg = NmuConfig {
            otp_cap: policy.nmu.otp_cap,
            otp_ttl: policy.nmu.otp_ttl_ms * 1_000_000,
            max_local: 1 << 16,
        };
        let mut nos = Nos {
            sacl: policy.sacl(),
            policy,
            hosts: BTreeMap::new(),
            placed: BTreeMap::new(),
        };
        for (i, (name, procs)) in placement.hosts.iter().enumerate() {
            let mut h = Host {
                index: i as u32,
                tables: NmuTables::new(cfg),
                next_slot: 0,
            };
            for &(s, p) in procs {
                let svc = nos
                    .policy
                    .services
                    .get(&s)
                    .ok_or(NosError::UnknownService(s))?;
                if !svc.processes.contains_key(&p) {
                    return Err(NosError::PlacementUnknown(s, p));
                }
                if let Some((other, _)) = nos.placed.get(&(s, p)) {
                    return Err(NosError::AlreadyPlaced(s, p, other.clone()));
                }
                h.tables.add_process(s, p)?;
                let a = Address((h.index << 16) | h.next_slot);
                h.next_slot += 1;
                nos.placed.insert((s, p), (name.clone(), a));
            }
            nos.hosts.insert(name.clone(), h);
        }
        let names: Vec<String> = nos.hosts.keys().cloned().collect();
        for n in names {
            for s in nos.hosts[&n].tables.resident_services() {
                nos.install_all(&n, s)?;
                nos.refresh_peers(s);
            }
        }
        Ok(nos)
    }

    /// The policy as it now stands.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The SACL as it now stands.
    pub fn sacl(&self) -> &Sacl {
        &self.sacl
    }

    /// A host's NMU tables.
    pub fn tables(&self, host: &str) -> Option<&NmuTables> {
        self.hosts.get(host).map(|h| &h.tables)
    }

    /// A host's NMU tables, for running the data-path procedures (OTPs mutate them).
    pub fn tables_mut(&mut self, host: &str) -> Option<&mut NmuTables> {
        self.hosts.get_mut(host).map(|h| &mut h.tables)
    }

    /// Host names.
    pub fn host_names(&self) -> Vec<String> {
        self.hosts.keys().cloned().collect()
    }

    /// Where a process runs, its address and register set.
    pub fn locate(&self, s: ServiceId, p: ProcessId) -> Option<(String, Address, LocalIndex)> {
        let (h, a) = self.placed.get(&(s, p))?;
        let li = self.hosts[h].tables.local_index(s, p)?;
        Some((h.clone(), *a, li))
    }

    fn nmu_entry(&self, src: ServiceId, dst: ServiceId) -> Option<PermissionView> {
        let e = self.sacl.get(&(src, dst))?;
        let procs: Vec<(ProcessId, Address)> = e
            .processes
            .iter()
            .filter_map(|&p| self.placed.get(&(dst, p)).map(|(_, a)| (p, *a)))
            .collect();
        // A permitted process that is not placed has no address and is not installed.
        if procs.is_empty() {
            return None;
        }
        Some((procs, e.domains.iter().copied().collect(), e.rate_slot))
    }

    fn install(
        &mut self,
        host: &str,
        src: ServiceId,
        dst: ServiceId,
        d: &mut Delta,
    ) -> Result<(), NosError> {
        let entry = self.nmu_entry(src, dst);
        let h = self
            .hosts
            .get_mut(host)
            .ok_or_else(|| NosError::UnknownHost(host.into()))?;
        match entry {
            Some((p, doms, r)) => {
                h.tables.set_permission(src, dst, &p, &doms, r)?;
                d.entries_set += 1;
            }
            None => {
                if h.tables.remove_permission(src, dst) {
                    d.entries_removed += 1;
                } else {
                    return Ok(());
                }
            }
        }
        d.hosts.insert(host.to_string());
        Ok(())
    }

    fn install_all(&mut self, host: &str, src: ServiceId) -> Result<Delta, NosError> {
        let mut d = Delta::default();
        let dsts: Vec<ServiceId> = self
            .sacl
            .range((src, 0)..=(src, ServiceId::MAX))
            .map(|(k, _)| k.1)
            .collect();
        for dst in dsts {
            self.install(host, src, dst, &mut d)?;
        }
        Ok(d)
    }

    fn hosts_of(&self, s: ServiceId) -> BTreeSet<String> {
        self.placed
            .range((s, 0)..=(s, ProcessId::MAX))
            .map(|(_, (h, _))| h.clone())
            .collect()
    }

    fn refresh_peers(&mut self, s: ServiceId) {
        let all: Vec<(ProcessId, String, Address)> = self
            .placed
            .range((s, 0)..=(s, ProcessId::MAX))
            .map(|(k, (h, a))| (k.1, h.clone(), *a))
            .collect();
        for (p, h, a) in &all {
            let peers = all.iter().filter(|x| x.2 != *a).map(|x| x.2).collect();
            let t = &mut self
                .hosts
                .get_mut(h)
                .expect("placed on a known host")
                .tables;
            if let Some(li) = t.local_index(s, *p) {
                let _ = t.set_peers(li, peers);
            }
        }
    }

    /// Recomputes the SACL and rewrites every entry that changed, plus every entry
    /// towards `touched` services (whose placement changed), on the hosts of its source.
    fn apply(&mut self, touched: &BTreeSet<ServiceId>) -> Result<Delta, NosError> {
        let new = self.policy.sacl();
        let old = std::mem::replace(&mut self.sacl, new);
        let mut pairs: BTreeSet<(ServiceId, ServiceId)> = BTreeSet::new();
        for (k, v) in &old {
            if self.sacl.get(k) != Some(v) {
                pairs.insert(*k);
            }
        }
        for k in self.sacl.keys() {
            if !old.contains_key(k) || touched.contains(&k.1) {
                pairs.insert(*k);
            }
        }
        for k in old.keys() {
            if touched.contains(&k.1) {
                pairs.insert(*k);
            }
        }
        let mut d = Delta::default();
        for (src, dst) in pairs {
            for h in self.hosts_of(src) {
                self.install(&h, src, dst, &mut d)?;
            }
        }
        Ok(d)
    }

    /// Adds a process to a service (defining it if the policy does not) and starts it
    /// on `host`: the NMU learns its identity and its service's permissions first,
    /// then every service permitted to reach it learns its address.
    pub fn add_process(
        &mut self,
        s: ServiceId,
        p: ProcessId,
        host: &str,
    ) -> Result<Delta, NosError> {
        if !self.policy.services.contains_key(&s) {
            return Err(NosError::UnknownService(s));
        }
        if let Some((h, _)) = self.placed.get(&(s, p)) {
            return Err(NosError::AlreadyPlaced(s, p, h.clone()));
        }
        let h = self
            .hosts
            .get_mut(host)
            .ok_or_else(|| NosError::UnknownHost(host.into()))?;
        let newly_resident = !h.tables.resident_services().contains(&s);
        h.tables.add_process(s, p)?;
        let a = Address((h.index << 16) | h.next_slot);
        h.next_slot += 1;
        self.placed.insert((s, p), (host.to_string(), a));
        self.policy
            .services
            .get_mut(&s)
            .expect("checked")
            .processes
            .entry(p)
            .or_default();
        let mut d = self.apply(&BTreeSet::from([s]))?;
        if newly_resident {
            let more = self.install_all(host, s)?;
            d.entries_set += more.entries_set;
            d.hosts.extend(more.hosts);
        }
        d.hosts.insert(host.to_string());
        self.refresh_peers(s);
        Ok(d)
    }

    /// Stops a process and removes it from its service: its OTPs and register set go,
    /// and no service can reach it any more.
    pub fn remove_process(&mut self, s: ServiceId, p: ProcessId) -> Result<Delta, NosError> {
        let (host, _) = self
            .placed
            .remove(&(s, p))
            .ok_or(NosError::UnknownProcess(s, p))?;
        self.hosts
            .get_mut(&host)
            .expect("placed on a known host")
            .tables
            .remove_process(s, p)?;
        let svc = self
            .policy
            .services
            .get_mut(&s)
            .expect("placed service exists");
        svc.processes.remove(&p);
        for portal in svc.portals.values_mut() {
            if let Selection::Only(set) = &mut portal.processes {
                set.remove(&p);
            }
        }
        for g in &mut self.policy.grants {
            if g.to == s
                && let crate::model::GrantTarget::Direct {
                    processes: Selection::Only(set),
                    ..
                } = &mut g.target
            {
                set.remove(&p);
            }
        }
        let mut d = self.apply(&BTreeSet::from([s]))?;
        d.hosts.insert(host);
        self.refresh_peers(s);
        Ok(d)
    }

    /// Adds a domain to a service (§4.6: policies may create domains at run time).
    /// Grants and portals that cover all domains gain it at once.
    pub fn add_domain(&mut self, s: ServiceId, name: &str) -> Result<(DomainId, Delta), NosError> {
        let svc = self
            .policy
            .services
            .get_mut(&s)
            .ok_or(NosError::UnknownService(s))?;
        if svc.domains.contains_key(name) {
            return Err(NosError::DomainExists(s, name.into()));
        }
        let id = svc.next_domain_id();
        svc.domains.insert(name.into(), id);
        Ok((id, self.apply(&BTreeSet::new())?))
    }

    /// Removes a domain: no process of any service can use it afterwards.
    pub fn remove_domain(&mut self, s: ServiceId, name: &str) -> Result<Delta, NosError> {
        let svc = self
            .policy
            .services
            .get_mut(&s)
            .ok_or(NosError::UnknownService(s))?;
        let id = svc
            .domains
            .remove(name)
            .ok_or_else(|| NosError::UnknownDomain(s, name.into()))?;
        for portal in svc.portals.values_mut() {
            if let Selection::Only(set) = &mut portal.domains {
                set.remove(&id);
            }
        }
        for g in &mut self.policy.grants {
            if g.to == s
                && let crate::model::GrantTarget::Direct {
                    domains: Selection::Only(set),
                    ..
                } = &mut g.target
            {
                set.remove(&id);
            }
        }
        self.apply(&BTreeSet::new())
    }

    /// Adds a fixed permission.
    pub fn add_grant(&mut self, g: Grant) -> Result<Delta, NosError> {
        for s in [g.from, g.to] {
            if !self.policy.services.contains_key(&s) {
                return Err(NosError::UnknownService(s));
            }
        }
        self.policy.grants.push(g);
        self.apply(&BTreeSet::new())
    }

    /// Removes every grant from `from` to `to`.
    pub fn remove_grants(&mut self, from: ServiceId, to: ServiceId) -> Result<Delta, NosError> {
        self.policy
            .grants
            .retain(|g| !(g.from == from && g.to == to));
        self.apply(&BTreeSet::new())
    }
}

mod update;

#[cfg(test)]
mod tests;
