//! The compiler end to end: policy + placement → tables, the §6.2 procedures through
//! them, and incremental updates that must equal a fresh compile.

use super::*;
use crate::parse::{parse_placement, parse_policy};
use sidecore_sikker_nmu::Triple;

const POLICY: &str = r#"
[[service]]
name = "kvs"
id = 1
domains = ["Get", "Set", "Delete"]
process_count = 4
[[service.portal]]
name = "readers"
processes = [0, 1]
domains = ["Get"]
[[service.portal]]
name = "everything"
all_processes = true
all_domains = true

[[service]]
name = "web"
id = 2
domains = ["Reply"]
process_count = 3

[[service]]
name = "batch"
id = 3
process_count = 2

[[grant]]
from = "web"
to = "kvs"
portal = "readers"

[[grant]]
from = "batch"
to = "kvs"
portal = "everything"

[[rate_limit]]
from = "web"
to = "kvs"
gbps = 10.0
"#;

const PLACEMENT: &str = r#"
[[host]]
name = "a"
processes = ["kvs:0", "kvs:1", "web:0"]
[[host]]
name = "b"
processes = ["kvs:2", "web:1", "batch:0"]
"#;

fn nos() -> Nos {
    let p = parse_policy("p.toml", POLICY).unwrap();
    let pl = parse_placement("h.toml", PLACEMENT, &p).unwrap();
    Nos::compile(p, &pl).unwrap()
}

/// Everything a host's tables hold, independent of register-set numbering.
fn snapshot(n: &Nos) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for h in n.host_names() {
        let t = n.tables(&h).unwrap();
        let mut v = Vec::new();
        for (s, p, _) in t.resident_processes() {
            v.push(format!("proc {s}:{p}"));
        }
        for s in t.resident_services() {
            for d in t.destinations(s) {
                v.push(format!("{s}->{d} {:?}", t.permission(s, d).unwrap()));
            }
        }
        out.insert(h, v);
    }
    out
}

fn send(n: &Nos, s: u32, p: u32, dst: Triple) -> Result<sidecore_sikker_nmu::Outgoing, NmuError> {
    let (h, _, li) = n.locate(s, p).unwrap();
    n.tables(&h).unwrap().send(li, dst)
}

#[test]
fn compiled_tables_enforce_portals() {
    let n = nos();
    // web → kvs through "readers": processes 0, 1, domain Get (0).
    let o = send(&n, 2, 0, Triple::new(1, 1, 0)).unwrap();
    assert_eq!(o.address, n.locate(1, 1).unwrap().1);
    assert_eq!(o.rate_slot, Some(0));
    assert!(matches!(
        send(&n, 2, 0, Triple::new(1, 2, 0)),
        Err(NmuError::ProcessDenied { .. })
    ));
    assert!(matches!(
        send(&n, 2, 1, Triple::new(1, 0, 1)),
        Err(NmuError::DomainDenied { .. })
    ));
    // batch → kvs: everything placed; kvs:3 is defined but not placed, so unreachable.
    assert!(send(&n, 3, 0, Triple::new(1, 2, 2)).is_ok());
    assert!(matches!(
        send(&n, 3, 0, Triple::new(1, 3, 0)),
        Err(NmuError::ProcessDenied { .. })
    ));
    // kvs holds no permission to web (only to itself).
    assert!(matches!(
        send(&n, 1, 0, Triple::new(2, 0, 0)),
        Err(NmuError::ServiceDenied { .. })
    ));
    assert!(send(&n, 1, 0, Triple::new(1, 2, 1)).is_ok(), "self access");
    // Host a holds only what its residents need (§7.2.3).
    assert_eq!(n.tables("a").unwrap().destinations(3), Vec::<u32>::new());
    // PeerSets hold the other placed processes of the service.
    let (h, _, li) = n.locate(2, 0).unwrap();
    assert_eq!(
        n.tables(&h).unwrap().peers(li),
        &[n.locate(2, 1).unwrap().1]
    );
}

#[test]
fn otp_through_compiled_tables() {
    let mut n = nos();
    // web:0 asks kvs:0 (which holds no permission to web) with a 2-way OTP.
    let (ha, _, web0) = n.locate(2, 0).unwrap();
    let req = n
        .tables(&ha)
        .unwrap()
        .send_with_otp(web0, Triple::new(1, 0, 0), Triple::new(2, 0, 0))
        .unwrap();
    let (hk, _, _) = n.locate(1, 0).unwrap();
    let (kvs0, key) = n
        .tables_mut(&hk)
        .unwrap()
        .receive_with_otp(&req.header, 0)
        .unwrap();
    let resp = n
        .tables_mut(&hk)
        .unwrap()
        .send_using_otp(kvs0, key, 1)
        .unwrap();
    assert_eq!(resp.address, n.locate(2, 0).unwrap().1);
    assert_eq!(n.tables(&ha).unwrap().receive(&resp.header).unwrap(), web0);
}

#[test]
fn incremental_updates_equal_a_fresh_compile() {
    let mut n = nos();
    // Add a kvs process on b: web cannot reach it (portal lists 0,1), batch can ("all").
    let d = n.add_process(1, 3, "b").unwrap();
    assert!(d.hosts.contains("b"));
    assert!(send(&n, 3, 0, Triple::new(1, 3, 0)).is_ok());
    assert!(send(&n, 2, 0, Triple::new(1, 3, 0)).is_err());
    // A new domain reaches "everything" holders at once.
    let (id, _) = n.add_domain(1, "Scan").unwrap();
    assert!(send(&n, 3, 0, Triple::new(1, 0, id)).is_ok());
    assert!(send(&n, 2, 0, Triple::new(1, 0, id)).is_err());
    // Revoke and re-grant directly.
    n.remove_grants(2, 1).unwrap();
    assert!(matches!(
        send(&n, 2, 0, Triple::new(1, 0, 0)),
        Err(NmuError::ServiceDenied { .. })
    ));
    n.add_grant(Grant {
        from: 2,
        to: 1,
        target: crate::model::GrantTarget::Direct {
            processes: Selection::Only([2].into()),
            domains: Selection::Only([1].into()),
        },
    })
    .unwrap();
    assert!(send(&n, 2, 0, Triple::new(1, 2, 1)).is_ok());
    // Remove a domain and a process.
    n.remove_domain(1, "Set").unwrap();
    assert!(send(&n, 2, 0, Triple::new(1, 2, 1)).is_err());
    n.remove_process(1, 2).unwrap();
    assert!(matches!(
        send(&n, 3, 0, Triple::new(1, 2, 0)),
        Err(NmuError::ProcessDenied { .. })
    ));
    // A new source service becoming resident learns its permissions.
    n.add_process(3, 1, "a").unwrap();
    assert!(send(&n, 3, 1, Triple::new(1, 0, 0)).is_ok());
    // The result equals compiling the updated policy from scratch.
    let placement = Placement {
        hosts: n
            .host_names()
            .into_iter()
            .map(|h| {
                let ps = n
                    .tables(&h)
                    .unwrap()
                    .resident_processes()
                    .into_iter()
                    .map(|(s, p, _)| (s, p))
                    .collect();
                (h, ps)
            })
            .collect(),
        ..Placement::default()
    };
    let fresh = Nos::compile(n.policy().clone(), &placement).unwrap();
    // Addresses differ by slot assignment order; compare with addresses erased.
    let erase = |m: BTreeMap<String, Vec<String>>| -> BTreeMap<String, Vec<String>> {
        m.into_iter()
            .map(|(k, v)| {
                (
                    k,
                    v.into_iter()
                        .map(|s| s.split("Address").next().unwrap().to_string())
                        .collect(),
                )
            })
            .collect()
    };
    assert_eq!(erase(snapshot(&n)), erase(snapshot(&fresh)));
    assert_eq!(n.sacl(), fresh.sacl());
}

#[test]
fn update_errors() {
    let mut n = nos();
    assert_eq!(
        n.add_process(9, 0, "a").unwrap_err(),
        NosError::UnknownService(9)
    );
    assert_eq!(
        n.add_process(1, 0, "b").unwrap_err(),
        NosError::AlreadyPlaced(1, 0, "a".into())
    );
    assert_eq!(
        n.add_process(1, 3, "zz").unwrap_err(),
        NosError::UnknownHost("zz".into())
    );
    assert_eq!(
        n.remove_process(1, 3).unwrap_err(),
        NosError::UnknownProcess(1, 3)
    );
    assert_eq!(
        n.add_domain(1, "Get").unwrap_err(),
        NosError::DomainExists(1, "Get".into())
    );
    assert_eq!(
        n.remove_domain(1, "Nope").unwrap_err(),
        NosError::UnknownDomain(1, "Nope".into())
    );
    assert!(
        n.add_process(1, 3, "zz")
            .unwrap_err()
            .to_string()
            .contains("unknown host `zz`")
    );
}

#[test]
fn the_shipped_kvs_example_compiles_and_enforces_fig_4_3() {
    let p = parse_policy("kvs.toml", include_str!("../../examples/kvs.toml")).unwrap();
    let pl = parse_placement(
        "kvs-placement.toml",
        include_str!("../../examples/kvs-placement.toml"),
        &p,
    )
    .unwrap();
    let kvs = p.service_by_name("kvs").unwrap().id;
    let bill = p.service_by_name("bill").unwrap().id;
    let john = p.service_by_name("john").unwrap().id;
    let mammals_set = p.services[&kvs].domains["MammalsSet"];
    let n = Nos::compile(p, &pl).unwrap();
    // Bill #101 sets pet=cat in Mammals: allowed; John #72 is stopped at the sender.
    assert!(send(&n, bill, 101, Triple::new(kvs, 3, mammals_set)).is_ok());
    assert!(matches!(
        send(&n, john, 72, Triple::new(kvs, 3, mammals_set)),
        Err(NmuError::ServiceDenied { .. })
    ));
    assert_eq!(n.tables("h1").unwrap().config().otp_cap, 256);
}

/// Whole-policy updates (`Nos::update_policy`).
mod update;
