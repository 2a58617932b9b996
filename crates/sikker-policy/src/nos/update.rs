//! Live policy updates (§4.6, issue 15): a whole new policy replaces the running
//! one while the tables keep serving.
//!
//! [`Nos::update_policy`] is atomic. The new policy is checked for consistency
//! and compiled against the current placement into a scratch Network OS first,
//! so any error is returned with the live tables untouched. Then the new SACL is
//! diffed against what every host's NMU holds and only the entries that differ
//! are rewritten or removed: processes that stay keep their register sets,
//! addresses, OTPs and PeerSets.
//!
//! Placed processes are matched to the new policy by service name and process ID
//! (the placement names them that way). A placed process the new policy no longer
//! defines refuses the update ([`NosError::PlacedUndefined`]): take it out of the
//! placement first. A service whose ID changed (IDs are assigned in file order
//! when not given) is re-installed under its new ID: its processes get new
//! register sets and addresses, and lose their OTPs. A change of the `[nmu]`
//! limits, which an NMU fixes when it is created, installs the scratch tables
//! whole, dropping every OTP.

use std::collections::BTreeSet;

use sidecore_sikker_nmu::{Address, NOS_SERVICE, ProcessId, ServiceId};

use super::{Delta, Nos, NosError, Placement};
use crate::model::{GrantTarget, Policy, Selection, Service};

impl Nos {
    /// The consistency checks [`Nos::update_policy`] makes of a new policy
    /// (services, grants, rates, `[nmu]` limits), for a caller that compiles
    /// it with a new placement instead.
    pub fn check_policy(p: &Policy) -> Result<(), NosError> {
        validate(p)
    }

    /// Replaces the policy with `new`, rewriting only the NMU entries that
    /// change. On an error nothing has changed.
    pub fn update_policy(&mut self, new: Policy) -> Result<Delta, NosError> {
        validate(&new)?;
        let placement = self.placement_under(&new)?;
        let scratch = Nos::compile(new.clone(), &placement)?;
        let rates = rate_changes(&self.policy, &new);
        let mut d = if new.nmu == self.policy.nmu {
            match self.apply_policy(new) {
                Ok(d) => d,
                // The same policy and placement compiled into the scratch tables,
                // so the NMU has no reason to refuse here; if it did, the live
                // tables hold a mix, and the scratch ones are the right end state.
                Err(_) => self.replace_with(scratch),
            }
        } else {
            self.replace_with(scratch)
        };
        d.rate_limits_changed = rates;
        Ok(d)
    }

    /// The current placement in `new`'s service IDs, hosts in index order and
    /// each host's processes in address order.
    fn placement_under(&self, new: &Policy) -> Result<Placement, NosError> {
        let mut hosts: Vec<(&String, u32)> = self.hosts.iter().map(|(n, h)| (n, h.index)).collect();
        hosts.sort_by_key(|h| h.1);
        let mut out = Placement::default();
        for (host, _) in hosts {
            let mut procs: Vec<(Address, ServiceId, ProcessId)> = self
                .placed
                .iter()
                .filter(|(_, (h, _))| h == host)
                .map(|(&(s, p), (_, a))| (*a, s, p))
                .collect();
            procs.sort_by_key(|x| x.0.0);
            let mut list = Vec::with_capacity(procs.len());
            for (_, s, p) in procs {
                list.push((self.id_under(new, s, p, host)?, p));
            }
            out.hosts.push((host.clone(), list));
        }
        Ok(out)
    }

    /// The ID in `new` of the service that has ID `s` now, which must still
    /// define process `p`.
    fn id_under(
        &self,
        new: &Policy,
        s: ServiceId,
        p: ProcessId,
        host: &str,
    ) -> Result<ServiceId, NosError> {
        let name = self
            .policy
            .services
            .get(&s)
            .map_or_else(|| format!("S{s}"), |x| x.name.clone());
        new.service_by_name(&name)
            .filter(|x| x.processes.contains_key(&p))
            .map(|x| x.id)
            .ok_or(NosError::PlacedUndefined {
                service: name,
                process: p,
                host: host.to_string(),
            })
    }

    /// The incremental path: re-install renumbered services, then rewrite every
    /// entry whose content differs from what the NMU holds.
    fn apply_policy(&mut self, new: Policy) -> Result<Delta, NosError> {
        let mut d = Delta::default();
        let mut moved: Vec<(ServiceId, ServiceId, ProcessId, String)> = Vec::new();
        for (&(s, p), (host, _)) in &self.placed {
            let ns = self.id_under(&new, s, p, host)?;
            if ns != s {
                moved.push((s, ns, p, host.clone()));
            }
        }
        // Every process of a renumbered service moves, so its old ID leaves
        // each of its hosts, and its entries with it.
        let leaving: BTreeSet<(ServiceId, String)> =
            moved.iter().map(|m| (m.0, m.3.clone())).collect();
        for (s, host) in &leaving {
            if let Some(h) = self.hosts.get(host) {
                d.entries_removed += h.tables.destinations(*s).len();
                d.hosts.insert(host.clone());
            }
        }
        // All removals before any addition: two services may swap IDs.
        for (s, _, p, host) in &moved {
            self.placed.remove(&(*s, *p));
            self.host_mut(host)?.tables.remove_process(*s, *p)?;
        }
        for (_, ns, p, host) in &moved {
            let h = self.host_mut(host)?;
            h.tables.add_process(*ns, *p)?;
            let a = Address((h.index << 16) | h.next_slot);
            h.next_slot += 1;
            self.placed.insert((*ns, *p), (host.clone(), a));
        }
        self.policy = new;
        self.sacl = self.policy.sacl();
        let hosts: Vec<String> = self.hosts.keys().cloned().collect();
        for host in hosts {
            for src in self.hosts[&host].tables.resident_services() {
                let mut dsts: BTreeSet<ServiceId> = self.hosts[&host]
                    .tables
                    .destinations(src)
                    .into_iter()
                    .collect();
                dsts.extend(
                    self.sacl
                        .range((src, 0)..=(src, ServiceId::MAX))
                        .map(|(k, _)| k.1),
                );
                for dst in dsts {
                    if self.nmu_entry(src, dst) != self.hosts[&host].tables.permission(src, dst) {
                        self.install(&host, src, dst, &mut d)?;
                    }
                }
            }
        }
        let renumbered: BTreeSet<ServiceId> = moved.iter().map(|m| m.1).collect();
        for s in renumbered {
            self.refresh_peers(s);
        }
        Ok(d)
    }

    fn host_mut(&mut self, host: &str) -> Result<&mut super::Host, NosError> {
        self.hosts
            .get_mut(host)
            .ok_or_else(|| NosError::UnknownHost(host.into()))
    }

    /// Takes `scratch` whole; every entry counts as removed and set again.
    fn replace_with(&mut self, scratch: Nos) -> Delta {
        let count = |n: &Nos| -> usize {
            n.hosts
                .values()
                .map(|h| {
                    h.tables
                        .resident_services()
                        .into_iter()
                        .map(|s| h.tables.destinations(s).len())
                        .sum::<usize>()
                })
                .sum()
        };
        let d = Delta {
            hosts: self
                .hosts
                .keys()
                .chain(scratch.hosts.keys())
                .cloned()
                .collect(),
            entries_set: count(&scratch),
            entries_removed: count(self),
            rate_limits_changed: 0,
        };
        *self = scratch;
        d
    }
}

/// Rate-limit slots that differ between two policies.
fn rate_changes(old: &Policy, new: &Policy) -> usize {
    let n = old.rate_limits.len().max(new.rate_limits.len());
    (0..n)
        .filter(|&i| old.rate_limits.get(i) != new.rate_limits.get(i))
        .count()
}

fn invalid(msg: String) -> NosError {
    NosError::InvalidPolicy(msg)
}

/// What the parser guarantees of a policy, checked again for one built in code.
fn validate(p: &Policy) -> Result<(), NosError> {
    validate_services(p)?;
    validate_grants(p)?;
    validate_rates(p)?;
    if p.nmu.otp_ttl_ms == 0 || p.nmu.otp_cap == 0 {
        return Err(invalid(
            "[nmu] otp_ttl_ms and otp_cap must be positive".into(),
        ));
    }
    Ok(())
}

fn check_selection<T: Ord + Copy + std::fmt::Display>(
    sel: &Selection<T>,
    have: &BTreeSet<T>,
    what: &str,
    kind: &str,
) -> Result<(), NosError> {
    if let Selection::Only(set) = sel
        && let Some(x) = set.iter().find(|x| !have.contains(x))
    {
        return Err(invalid(format!("{what}: no {kind} {x}")));
    }
    Ok(())
}

fn check_target(
    svc: &Service,
    procs: &Selection<ProcessId>,
    doms: &Selection<u32>,
    what: &str,
) -> Result<(), NosError> {
    let ps: BTreeSet<ProcessId> = svc.processes.keys().copied().collect();
    let ds: BTreeSet<u32> = svc.domains.values().copied().collect();
    check_selection(procs, &ps, what, "process")?;
    check_selection(doms, &ds, what, "domain with ID")
}

fn validate_services(p: &Policy) -> Result<(), NosError> {
    let mut names = BTreeSet::new();
    for (&id, s) in &p.services {
        if id != s.id {
            return Err(invalid(format!(
                "service `{}` is filed under ID {id} but has ID {}",
                s.name, s.id
            )));
        }
        if id == NOS_SERVICE {
            return Err(invalid(format!(
                "service `{}` has ID {id}, reserved for the Network OS",
                s.name
            )));
        }
        if s.name.is_empty() {
            return Err(invalid(format!("service {id} has no name")));
        }
        if !names.insert(s.name.as_str()) {
            return Err(invalid(format!("service name `{}` is used twice", s.name)));
        }
        let mut ids = BTreeSet::new();
        if let Some((n, d)) = s.domains.iter().find(|(_, d)| !ids.insert(**d)) {
            return Err(invalid(format!(
                "service `{}`: domain `{n}` reuses domain ID {d}",
                s.name
            )));
        }
        for portal in s.portals.values() {
            let what = format!("service `{}`, portal `{}`", s.name, portal.name);
            check_target(s, &portal.processes, &portal.domains, &what)?;
        }
    }
    Ok(())
}

fn validate_grants(p: &Policy) -> Result<(), NosError> {
    for (i, g) in p.grants.iter().enumerate() {
        let what = format!("grant #{}", i + 1);
        let from = p
            .services
            .get(&g.from)
            .ok_or_else(|| invalid(format!("{what}: no source service with ID {}", g.from)))?;
        let to = p
            .services
            .get(&g.to)
            .ok_or_else(|| invalid(format!("{what}: no destination service with ID {}", g.to)))?;
        let what = format!("{what} ({} → {})", from.name, to.name);
        match &g.target {
            GrantTarget::Portal(name) if !to.portals.contains_key(name) => {
                return Err(invalid(format!(
                    "{what}: service `{}` has no portal `{name}`",
                    to.name
                )));
            }
            GrantTarget::Portal(_) => {}
            GrantTarget::Direct { processes, domains } => {
                check_target(to, processes, domains, &what)?;
            }
        }
    }
    Ok(())
}

fn validate_rates(p: &Policy) -> Result<(), NosError> {
    let mut pairs = BTreeSet::new();
    for (i, r) in p.rate_limits.iter().enumerate() {
        let what = format!("rate limit #{}", i + 1);
        for s in [r.from, r.to] {
            if !p.services.contains_key(&s) {
                return Err(invalid(format!("{what}: no service with ID {s}")));
            }
        }
        if !(r.gbps.is_finite() && r.gbps > 0.0) {
            return Err(invalid(format!(
                "{what}: gbps must be a positive number, got {}",
                r.gbps
            )));
        }
        if r.bucket_bytes == 0 {
            return Err(invalid(format!("{what}: bucket_bytes must be positive")));
        }
        if !pairs.insert((r.from, r.to)) {
            return Err(invalid(format!(
                "{what}: a rate limit from {} to {} is already defined",
                p.services[&r.from].name, p.services[&r.to].name
            )));
        }
    }
    Ok(())
}
