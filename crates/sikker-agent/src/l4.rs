//! Sikker's L4 mode, sans-IO: what the kernel's L4 programs (cgroup connect
//! and egress, in `sidecore-kernel`) must hold for one host, computed from the
//! compiled Network OS and the placement's L4 addresses.
//!
//! - **Sources**: which (service, process) each local cgroup is — every
//!   process placed on the host whose definition names a `cgroup` (and the
//!   `uid` it requires, if any). L4 mode knows a process by its cgroup alone:
//!   the policy's `program` rule is not checked (the agent's attestation
//!   checks it for processes that attach to it).
//! - **Destinations**: which (service, process) listens at each L4 address,
//!   on any host.
//! - **Permits**: (source service, address) for every local source service
//!   whose SACL entry towards the address's service lists its process. A TCP
//!   connection carries no domain: any permitted domain permits it.
//! - **Rates**: each (local source service, destination service) pair with a
//!   rate limit, in bytes per second (`gbps` × 10⁹ / 8) with the policy's
//!   bucket. Each host's bucket holds the whole limit: L4 buckets are not yet
//!   divided between hosts by SE-TRE.
//!
//! Resolving a cgroup path to the id the kernel uses is I/O, left to the
//! caller.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use sidecore_sikker_nmu::{ProcessId, ServiceId};
use sidecore_sikker_policy::Nos;

/// A local process the L4 programs recognise by its cgroup.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct L4Source {
    /// Its cgroup v2 path, as the policy gives it (`/sikker/bill/101`).
    pub cgroup: String,
    pub service: ServiceId,
    pub process: ProcessId,
    /// The user it must run as, if the policy requires one.
    pub uid: Option<u32>,
}

/// A pair's rate limit, converted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct L4Limit {
    /// As the policy gives it.
    pub gbps: f64,
    /// `gbps` × 10⁹ / 8, rounded, at least 1.
    pub bytes_per_sec: u64,
    /// The policy's bucket.
    pub bucket_bytes: u64,
}

/// Everything the L4 programs of one host need.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct L4Plan {
    /// Local processes known by their cgroup, in cgroup order.
    pub sources: Vec<L4Source>,
    /// Every L4 address, on every host, and who listens there.
    pub destinations: BTreeMap<SocketAddr, (ServiceId, ProcessId)>,
    /// (source service, address): permitted.
    pub permits: BTreeSet<(ServiceId, SocketAddr)>,
    /// (source service, destination service) → its limit.
    pub rates: BTreeMap<(ServiceId, ServiceId), L4Limit>,
    /// Processes placed on this host that name no cgroup: the programs cannot
    /// tell them apart, so their connects to L4 addresses are refused.
    pub unidentified: Vec<(ServiceId, ProcessId)>,
}

/// Why no plan could be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum L4PlanError {
    #[error("host `{0}` is not in the placement (its hosts: {1})")]
    UnknownHost(String, String),
    #[error(
        "cgroup {cgroup} is the cgroup of {which} on host `{host}`; L4 mode knows a process by its cgroup alone, so each must have its own"
    )]
    SharedCgroup {
        cgroup: String,
        host: String,
        which: String,
    },
    #[error("the placement gives L4 addresses to {0}, which the policy does not define")]
    UnknownProcess(String),
}

/// Bytes per second for a limit in Gbps: rounded, at least 1.
pub fn bytes_per_sec(gbps: f64) -> u64 {
    let b = (gbps * 1e9 / 8.0).round();
    // `as` saturates: a limit too large for u64 becomes u64::MAX, which the
    // kernel loader refuses by name.
    (b as u64).max(1)
}

/// The plan for `host`, from the compiled Network OS and the placement's L4
/// addresses (`Placement::l4`).
pub fn plan(
    nos: &Nos,
    l4: &BTreeMap<(ServiceId, ProcessId), Vec<SocketAddr>>,
    host: &str,
) -> Result<L4Plan, L4PlanError> {
    let policy = nos.policy();
    let name = |s: ServiceId, p: ProcessId| {
        let svc = policy.services.get(&s).map_or("?", |x| x.name.as_str());
        format!("{svc}:{p}")
    };
    let tables = nos
        .tables(host)
        .ok_or_else(|| L4PlanError::UnknownHost(host.to_string(), nos.host_names().join(", ")))?;
    let mut out = L4Plan::default();
    let mut by_cgroup: BTreeMap<&str, Vec<L4Source>> = BTreeMap::new();
    for (s, p, _) in tables.resident_processes() {
        let def = policy.services.get(&s).and_then(|x| x.processes.get(&p));
        match def.and_then(|d| d.cgroup.as_deref().map(|c| (c, d.uid))) {
            Some((c, uid)) => by_cgroup.entry(c).or_default().push(L4Source {
                cgroup: c.to_string(),
                service: s,
                process: p,
                uid,
            }),
            None => out.unidentified.push((s, p)),
        }
    }
    for (cgroup, mut procs) in by_cgroup {
        if procs.len() > 1 {
            let which: Vec<String> = procs.iter().map(|x| name(x.service, x.process)).collect();
            return Err(L4PlanError::SharedCgroup {
                cgroup: cgroup.to_string(),
                host: host.to_string(),
                which: which.join(" and "),
            });
        }
        out.sources.append(&mut procs);
    }
    for (&(s, p), addrs) in l4 {
        if !policy
            .services
            .get(&s)
            .is_some_and(|x| x.processes.contains_key(&p))
        {
            return Err(L4PlanError::UnknownProcess(name(s, p)));
        }
        for &a in addrs {
            out.destinations.insert(a, (s, p));
        }
    }
    let src_services: BTreeSet<ServiceId> = out.sources.iter().map(|x| x.service).collect();
    let sacl = nos.sacl();
    for &src in &src_services {
        for (&a, &(dst, p)) in &out.destinations {
            if sacl
                .get(&(src, dst))
                .is_some_and(|e| e.processes.contains(&p))
            {
                out.permits.insert((src, a));
            }
        }
    }
    let dst_services: BTreeSet<ServiceId> = out.destinations.values().map(|x| x.0).collect();
    for r in &policy.rate_limits {
        if src_services.contains(&r.from) && dst_services.contains(&r.to) {
            out.rates.insert(
                (r.from, r.to),
                L4Limit {
                    gbps: r.gbps,
                    bytes_per_sec: bytes_per_sec(r.gbps),
                    bucket_bytes: r.bucket_bytes,
                },
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecore_sikker_policy::{parse_placement, parse_policy};

    const POLICY: &str = r#"
[[service]]
name = "kvs"
domains = ["Get", "Set"]
[[service.process]]
id = 3
cgroup = "/sikker/kvs/3"
[[service.process]]
id = 4
cgroup = "/sikker/kvs/4"
[[service.portal]]
name = "ForBill"
processes = [3]
domains = ["Get"]

[[service]]
name = "bill"
domains = ["Reply"]
[[service.process]]
id = 101
cgroup = "/sikker/bill/101"
uid = 1000
[[service.process]]
id = 102

[[service]]
name = "eve"
[[service.process]]
id = 1
cgroup = "/sikker/eve"

[[grant]]
from = "bill"
to = "kvs"
portal = "ForBill"

[[rate_limit]]
from = "bill"
to = "kvs"
gbps = 0.08
bucket_bytes = 50000

[[rate_limit]]
from = "eve"
to = "bill"
gbps = 1.0
"#;

    fn nos_and_l4(placement: &str) -> (Nos, BTreeMap<(ServiceId, ProcessId), Vec<SocketAddr>>) {
        let p = parse_policy("p.toml", POLICY).unwrap();
        let pl = parse_placement("h.toml", placement, &p).unwrap();
        (Nos::compile(p, &pl).unwrap(), pl.l4)
    }

    const PLACEMENT: &str = r#"
[[host]]
name = "h1"
processes = ["bill:101", "bill:102", "eve:1", "kvs:4"]
l4 = { "kvs:4" = "10.9.0.1:7000" }
[[host]]
name = "h2"
processes = ["kvs:3"]
l4 = { "kvs:3" = ["10.9.0.2:8080", "[fd00::2]:8080"] }
"#;

    #[test]
    fn sources_destinations_permits_and_rates_for_one_host() {
        let (nos, l4) = nos_and_l4(PLACEMENT);
        let p = plan(&nos, &l4, "h1").unwrap();
        let (kvs, bill, eve) = (1, 2, 3);
        assert_eq!(
            p.sources,
            vec![
                L4Source {
                    cgroup: "/sikker/bill/101".into(),
                    service: bill,
                    process: 101,
                    uid: Some(1000),
                },
                L4Source {
                    cgroup: "/sikker/eve".into(),
                    service: eve,
                    process: 1,
                    uid: None,
                },
                L4Source {
                    cgroup: "/sikker/kvs/4".into(),
                    service: kvs,
                    process: 4,
                    uid: None,
                },
            ]
        );
        // bill:102 names no cgroup: it cannot be told apart.
        assert_eq!(p.unidentified, vec![(bill, 102)]);
        // Destinations on every host.
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(p.destinations.len(), 3);
        assert_eq!(p.destinations[&a("[fd00::2]:8080")], (kvs, 3));
        assert_eq!(p.destinations[&a("10.9.0.1:7000")], (kvs, 4));
        // bill reaches kvs:3 (through the portal, both addresses) but not
        // kvs:4; kvs reaches its own processes (self access); eve nothing.
        let want: BTreeSet<(ServiceId, SocketAddr)> = [
            (bill, a("10.9.0.2:8080")),
            (bill, a("[fd00::2]:8080")),
            (kvs, a("10.9.0.1:7000")),
            (kvs, a("10.9.0.2:8080")),
            (kvs, a("[fd00::2]:8080")),
        ]
        .into();
        assert_eq!(p.permits, want);
        // Only pairs whose source is local and whose destination has an L4
        // address: eve → bill has none.
        assert_eq!(p.rates.len(), 1);
        let r = p.rates[&(bill, kvs)];
        assert_eq!(r.bytes_per_sec, 10_000_000);
        assert_eq!(r.bucket_bytes, 50_000);
    }

    #[test]
    fn another_host_sees_the_same_destinations_and_its_own_sources() {
        let (nos, l4) = nos_and_l4(PLACEMENT);
        let p = plan(&nos, &l4, "h2").unwrap();
        assert_eq!(p.sources.len(), 1);
        assert_eq!(p.sources[0].cgroup, "/sikker/kvs/3");
        assert_eq!(p.destinations.len(), 3);
        assert!(p.permits.iter().all(|&(s, _)| s == 1));
        assert!(p.rates.is_empty());
    }

    #[test]
    fn unknown_hosts_and_shared_cgroups_are_refused() {
        let (nos, l4) = nos_and_l4(PLACEMENT);
        let e = plan(&nos, &l4, "h9").unwrap_err();
        assert_eq!(
            e.to_string(),
            "host `h9` is not in the placement (its hosts: h1, h2)"
        );
        let shared = POLICY.replace("cgroup = \"/sikker/eve\"", "cgroup = \"/sikker/kvs/4\"");
        let p = parse_policy("p.toml", &shared).unwrap();
        let pl = parse_placement("h.toml", PLACEMENT, &p).unwrap();
        let nos = Nos::compile(p, &pl).unwrap();
        let e = plan(&nos, &pl.l4, "h1").unwrap_err();
        assert!(
            e.to_string()
                .contains("cgroup /sikker/kvs/4 is the cgroup of kvs:4 and eve:1"),
            "{e}"
        );
        let mut bad = BTreeMap::new();
        bad.insert((1, 77), vec!["10.0.0.1:1".parse().unwrap()]);
        let e = plan(&nos_and_l4(PLACEMENT).0, &bad, "h1").unwrap_err();
        assert!(e.to_string().contains("kvs:77"), "{e}");
    }

    #[test]
    fn gbps_become_bytes_per_second() {
        assert_eq!(bytes_per_sec(100.0), 12_500_000_000);
        assert_eq!(bytes_per_sec(0.08), 10_000_000);
        assert_eq!(bytes_per_sec(1e-12), 1);
        assert_eq!(bytes_per_sec(1e30), u64::MAX);
    }
}
