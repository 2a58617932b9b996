//! `Nos::update_policy`: every kind of change reaches exactly the entries it
//! should (counted in the `Delta`), the processes that stay keep their OTPs and
//! register sets, the result equals a fresh compile, and a refused update leaves
//! everything as it was.

use super::*;

fn pol(src: &str) -> Policy {
    parse_policy("p.toml", src).unwrap()
}

/// The fixture's policy with `extra` appended (more services, grants, limits).
fn with(extra: &str) -> Policy {
    pol(&format!("{POLICY}\n{extra}"))
}

fn delta(hosts: &[&str], set: usize, removed: usize, rates: usize) -> Delta {
    Delta {
        hosts: hosts.iter().map(|h| (*h).to_string()).collect(),
        entries_set: set,
        entries_removed: removed,
        rate_limits_changed: rates,
    }
}

/// The tables with addresses erased (a fresh compile numbers slots its own way).
fn erased(n: &Nos) -> BTreeMap<String, Vec<String>> {
    snapshot(n)
        .into_iter()
        .map(|(k, v)| {
            let v = v
                .into_iter()
                .map(|s| s.split("Address").next().unwrap_or_default().to_string())
                .collect();
            (k, v)
        })
        .collect()
}

fn placement_of(n: &Nos) -> Placement {
    Placement {
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
    }
}

#[track_caller]
fn assert_fresh(n: &Nos) {
    let fresh = Nos::compile(n.policy().clone(), &placement_of(n)).unwrap();
    assert_eq!(erased(n), erased(&fresh));
    assert_eq!(n.sacl(), fresh.sacl());
}

#[test]
fn the_same_policy_changes_nothing() {
    let mut n = nos();
    let before = snapshot(&n);
    assert_eq!(n.update_policy(pol(POLICY)).unwrap(), Delta::default());
    assert_eq!(snapshot(&n), before);
}

#[test]
fn a_grant_is_installed_and_revoked_on_the_hosts_of_its_source_only() {
    let mut n = nos();
    assert!(matches!(
        send(&n, 1, 0, Triple::new(2, 1, 0)),
        Err(NmuError::ServiceDenied { .. })
    ));
    // kvs runs on a and b: two entries.
    let d = n
        .update_policy(with(
            "[[grant]]\nfrom = \"kvs\"\nto = \"web\"\nall_processes = true\nall_domains = true\n",
        ))
        .unwrap();
    assert_eq!(d, delta(&["a", "b"], 2, 0, 0));
    let o = send(&n, 1, 0, Triple::new(2, 1, 0)).unwrap();
    assert_eq!(o.address, n.locate(2, 1).unwrap().1);
    assert_fresh(&n);
    // batch runs on b only: one entry there, and the kvs → web ones go.
    let d = n
        .update_policy(with(
            "[[grant]]\nfrom = \"batch\"\nto = \"web\"\nprocesses = [1]\ndomains = [\"Reply\"]\n",
        ))
        .unwrap();
    assert_eq!(d, delta(&["a", "b"], 1, 2, 0));
    assert!(send(&n, 3, 0, Triple::new(2, 1, 0)).is_ok());
    assert!(matches!(
        send(&n, 3, 0, Triple::new(2, 0, 0)),
        Err(NmuError::ProcessDenied { .. })
    ));
    assert!(matches!(
        send(&n, 1, 0, Triple::new(2, 1, 0)),
        Err(NmuError::ServiceDenied { .. })
    ));
    assert_eq!(
        n.update_policy(pol(POLICY)).unwrap(),
        delta(&["b"], 0, 1, 0)
    );
    assert_fresh(&n);
}

#[test]
fn rate_limits_change_their_slots_and_only_the_entries_that_carry_them() {
    let mut n = nos();
    // A new rate alone: no entry changes, the policy holds it.
    let d = n
        .update_policy(pol(&POLICY.replace("gbps = 10.0", "gbps = 20.0")))
        .unwrap();
    assert_eq!(d, delta(&[], 0, 0, 1));
    assert!((n.policy().rate_limits[0].gbps - 20.0).abs() < 1e-9);
    // A limit for batch → kvs: slot 1, on batch's one host.
    let d = n
        .update_policy(with(
            "[[rate_limit]]\nfrom = \"batch\"\nto = \"kvs\"\ngbps = 5.0\n",
        ))
        .unwrap();
    assert_eq!(d, delta(&["b"], 1, 0, 2), "slot 0 went back to 10 Gbps");
    assert_eq!(
        send(&n, 3, 0, Triple::new(1, 2, 0)).unwrap().rate_slot,
        Some(1)
    );
    // Without web → kvs's limit, batch's moves to slot 0: web's two entries
    // lose their slot and batch's one changes slot.
    let only_batch = POLICY.replace(
        "[[rate_limit]]\nfrom = \"web\"",
        "[[rate_limit]]\nfrom = \"batch\"",
    );
    let d = n.update_policy(pol(&only_batch)).unwrap();
    assert_eq!(d, delta(&["a", "b"], 3, 0, 2));
    assert_eq!(
        send(&n, 3, 0, Triple::new(1, 2, 0)).unwrap().rate_slot,
        Some(0)
    );
    assert_eq!(
        send(&n, 2, 0, Triple::new(1, 1, 0)).unwrap().rate_slot,
        None
    );
    assert_fresh(&n);
}

#[test]
fn domains_added_and_removed_reach_the_entries_that_cover_them() {
    let mut n = nos();
    let scan = POLICY.replace(
        "domains = [\"Get\", \"Set\", \"Delete\"]",
        "domains = [\"Get\", \"Set\", \"Delete\", \"Scan\"]",
    );
    // kvs's own entries on a and b, and batch's "everything" on b; web's
    // "readers" portal lists Get only.
    let d = n.update_policy(pol(&scan)).unwrap();
    assert_eq!(d, delta(&["a", "b"], 3, 0, 0));
    assert!(send(&n, 3, 0, Triple::new(1, 2, 3)).is_ok());
    assert!(send(&n, 1, 0, Triple::new(1, 1, 3)).is_ok());
    assert!(matches!(
        send(&n, 2, 0, Triple::new(1, 1, 3)),
        Err(NmuError::DomainDenied { .. })
    ));
    let no_delete = POLICY.replace(
        "domains = [\"Get\", \"Set\", \"Delete\"]",
        "domains = [\"Get\", \"Set\"]",
    );
    let d = n.update_policy(pol(&no_delete)).unwrap();
    assert_eq!(d, delta(&["a", "b"], 3, 0, 0));
    for dom in [2, 3] {
        assert!(matches!(
            send(&n, 3, 0, Triple::new(1, 2, dom)),
            Err(NmuError::DomainDenied { .. })
        ));
    }
    assert!(send(&n, 3, 0, Triple::new(1, 2, 1)).is_ok());
    assert_fresh(&n);
}

#[test]
fn services_added_renumbered_and_removed() {
    let mut n = nos();
    let before = snapshot(&n);
    // A service with no placed process changes no table, either way round.
    let audit = "[[service]]\nname = \"audit\"\nid = 9\ndomains = [\"Log\"]\nprocess_count = 1\n\
                 [[grant]]\nfrom = \"audit\"\nto = \"kvs\"\nportal = \"everything\"\n\
                 [[grant]]\nfrom = \"kvs\"\nto = \"audit\"\nall_processes = true\nall_domains = true\n";
    assert_eq!(n.update_policy(with(audit)).unwrap(), Delta::default());
    assert!(n.policy().service_by_name("audit").is_some());
    assert_eq!(snapshot(&n), before);
    // Placed, it is reachable at once (through the ordinary process path).
    n.add_process(9, 0, "a").unwrap();
    assert!(send(&n, 1, 0, Triple::new(9, 0, 0)).is_ok());
    assert!(send(&n, 9, 0, Triple::new(1, 1, 2)).is_ok());
    n.remove_process(9, 0).unwrap();
    // Removing the unplaced service again.
    // (remove_process already took kvs's entries towards audit.)
    assert_eq!(n.update_policy(pol(POLICY)).unwrap(), Delta::default());
    assert_eq!(snapshot(&n), before);
    assert!(n.policy().service_by_name("audit").is_none());
    // kvs renumbered 1 → 11: its processes are re-installed under the new ID;
    // every entry from or to kvs is rewritten (5 set: kvs's own on a and b,
    // web's on a and b, batch's on b), and the old ones removed.
    let d = n
        .update_policy(pol(&POLICY.replacen("id = 1\n", "id = 11\n", 1)))
        .unwrap();
    assert_eq!(
        d,
        delta(&["a", "b"], 5, 5, 1),
        "rate slot 0 names kvs's new ID"
    );
    let o = send(&n, 2, 0, Triple::new(11, 1, 0)).unwrap();
    assert_eq!(
        (o.address, o.rate_slot),
        (n.locate(11, 1).unwrap().1, Some(0))
    );
    assert!(matches!(
        send(&n, 2, 0, Triple::new(1, 1, 0)),
        Err(NmuError::ServiceDenied { .. })
    ));
    let (h, _, li) = n.locate(11, 0).unwrap();
    let mut peers = n.tables(&h).unwrap().peers(li).to_vec();
    peers.sort_unstable_by_key(|a| a.0);
    assert_eq!(
        peers,
        [n.locate(11, 1).unwrap().1, n.locate(11, 2).unwrap().1]
    );
    assert_fresh(&n);
    // A placed service cannot go while it is placed.
    let no_batch = POLICY
        .replace(
            "[[service]]\nname = \"batch\"\nid = 3\nprocess_count = 2\n",
            "",
        )
        .replace(
            "[[grant]]\nfrom = \"batch\"\nto = \"kvs\"\nportal = \"everything\"\n",
            "",
        );
    let e = n.update_policy(pol(&no_batch)).unwrap_err();
    assert_eq!(
        e,
        NosError::PlacedUndefined {
            service: "batch".into(),
            process: 0,
            host: "b".into()
        }
    );
}

#[test]
fn otps_register_sets_and_peers_survive_an_update() {
    let mut n = nos();
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
    let peers = n.tables(&ha).unwrap().peers(web0).to_vec();
    let d = n
        .update_policy(with(
            "[[grant]]\nfrom = \"web\"\nto = \"batch\"\nall_processes = true\nall_domains = true\n\
             [[rate_limit]]\nfrom = \"kvs\"\nto = \"kvs\"\ngbps = 1.0\n",
        ))
        .unwrap();
    // batch has no domain: the grant yields no entry; kvs's own two carry slot 1.
    assert_eq!(d, delta(&["a", "b"], 2, 0, 1));
    assert_eq!(n.locate(2, 0).unwrap().2, web0);
    assert_eq!(n.locate(1, 0).unwrap().2, kvs0);
    assert_eq!(n.tables(&ha).unwrap().peers(web0), peers.as_slice());
    assert_eq!(n.tables(&hk).unwrap().otp_count(kvs0), 1);
    let resp = n
        .tables_mut(&hk)
        .unwrap()
        .send_using_otp(kvs0, key, 1)
        .unwrap();
    assert_eq!(resp.address, n.locate(2, 0).unwrap().1);
}

#[test]
fn refused_updates_leave_everything_as_it_was() {
    let mut n = nos();
    let (ha, _, web0) = n.locate(2, 0).unwrap();
    let req = n
        .tables(&ha)
        .unwrap()
        .send_with_otp(web0, Triple::new(1, 0, 0), Triple::new(2, 0, 0))
        .unwrap();
    let (hk, _, kvs0) = n.locate(1, 0).unwrap();
    let (_, key) = n
        .tables_mut(&hk)
        .unwrap()
        .receive_with_otp(&req.header, 0)
        .unwrap();
    let (tables, policy, sacl) = (snapshot(&n), n.policy().clone(), n.sacl().clone());

    let mut unknown_dst = pol(POLICY);
    unknown_dst.grants.push(Grant {
        from: 2,
        to: 99,
        target: crate::model::GrantTarget::Portal("readers".into()),
    });
    let mut no_portal = pol(POLICY);
    no_portal.grants[0].target = crate::model::GrantTarget::Portal("nope".into());
    let mut bad_rate = pol(POLICY);
    bad_rate.rate_limits[0].gbps = f64::NAN;
    let mut reserved = pol(POLICY);
    let mut svc = reserved.services[&3].clone();
    svc.id = sidecore_sikker_nmu::NOS_SERVICE;
    svc.name = "nos".into();
    reserved.services.insert(svc.id, svc);
    let mut bad_domain = pol(POLICY);
    bad_domain.grants.push(Grant {
        from: 3,
        to: 2,
        target: crate::model::GrantTarget::Direct {
            processes: Selection::All,
            domains: Selection::Only([7].into()),
        },
    });
    let mut no_kvs2 = pol(POLICY);
    no_kvs2.services.get_mut(&1).unwrap().processes.remove(&2);
    let cases = [
        (
            unknown_dst,
            "invalid policy: grant #3: no destination service with ID 99",
        ),
        (
            no_portal,
            "grant #1 (web → kvs): service `kvs` has no portal `nope`",
        ),
        (
            bad_rate,
            "rate limit #1: gbps must be a positive number, got NaN",
        ),
        (reserved, "reserved for the Network OS"),
        (bad_domain, "grant #3 (batch → web): no domain with ID 7"),
        (
            no_kvs2,
            "the new policy does not define process kvs:2, which is placed on host `b`",
        ),
    ];
    for (p, want) in cases {
        let e = n.update_policy(p).unwrap_err().to_string();
        assert!(e.contains(want), "expected `{want}` in `{e}`");
        assert_eq!(snapshot(&n), tables, "after `{e}`");
        assert_eq!(n.policy(), &policy);
        assert_eq!(n.sacl(), &sacl);
    }
    // The OTP issued before is still there and answers once.
    assert!(
        n.tables_mut(&hk)
            .unwrap()
            .send_using_otp(kvs0, key, 1)
            .is_ok()
    );
}

#[test]
fn new_nmu_limits_reinstall_the_tables_whole() {
    let mut n = nos();
    let d = n
        .update_policy(with("[nmu]\notp_cap = 8\notp_ttl_ms = 500\n"))
        .unwrap();
    // Every entry (3 on a, 4 on b) is removed and set again.
    assert_eq!(d, delta(&["a", "b"], 7, 7, 0));
    for h in ["a", "b"] {
        let c = n.tables(h).unwrap().config();
        assert_eq!((c.otp_cap, c.otp_ttl), (8, 500_000_000));
    }
    assert!(send(&n, 2, 0, Triple::new(1, 1, 0)).is_ok());
    assert_fresh(&n);
}
