//! Unit tests of the §6.2 procedures, including every negative path.

use super::*;

/// The worked example of Fig. 4.3 / 4.5 plus a third service:
/// S2 (Bill-like) holds S1 processes {2, 600} domains {1, 700}; S2 holds itself (self
/// permission, erratum 8) and S3 process 3 domain 2. S1 holds nothing.
fn host() -> (NmuTables, LocalIndex, LocalIndex) {
    let mut t = NmuTables::new(NmuConfig {
        otp_cap: 2,
        otp_ttl: 100,
        max_local: 16,
    });
    let s2p1 = t.add_process(2, 1).unwrap();
    let s1p2 = t.add_process(1, 2).unwrap();
    t.set_permission(
        2,
        1,
        &[(2, Address(12)), (600, Address(1600))],
        &[1, 700],
        Some(5),
    )
    .unwrap();
    t.set_permission(2, 2, &[(1, Address(21))], &[1], None)
        .unwrap();
    t.set_permission(2, 3, &[(3, Address(33))], &[2], None)
        .unwrap();
    (t, s2p1, s1p2)
}

#[test]
fn send_allows_exactly_the_sacl() {
    let (t, s2p1, _) = host();
    let o = t.send(s2p1, Triple::new(1, 2, 1)).unwrap();
    assert_eq!(o.address, Address(12));
    assert_eq!(o.header.src, (2, 1), "source is derived, not claimed");
    assert_eq!(o.header.dst, Triple::new(1, 2, 1));
    assert_eq!(o.rate_slot, Some(5));
    // Identifiers above one chunk go through the overflow map.
    let o = t.send(s2p1, Triple::new(1, 600, 700)).unwrap();
    assert_eq!(o.address, Address(1600));
    // Orthogonality (§3.1): any permitted process with any permitted domain.
    assert!(t.send(s2p1, Triple::new(1, 600, 1)).is_ok());
    assert!(t.send(s2p1, Triple::new(1, 2, 700)).is_ok());
}

#[test]
fn send_denies_process_domain_and_service() {
    let (t, s2p1, s1p2) = host();
    assert_eq!(
        t.send(s2p1, Triple::new(1, 3, 1)).unwrap_err(),
        NmuError::ProcessDenied {
            src: 2,
            dst: 1,
            proc: 3
        }
    );
    assert_eq!(
        t.send(s2p1, Triple::new(1, 2, 2)).unwrap_err(),
        NmuError::DomainDenied {
            src: 2,
            dst: 1,
            dom: 2
        }
    );
    assert_eq!(
        t.send(s2p1, Triple::new(1, 1000, 1)).unwrap_err(),
        NmuError::ProcessDenied {
            src: 2,
            dst: 1,
            proc: 1000
        }
    );
    assert_eq!(
        t.send(s2p1, Triple::new(9, 2, 1)).unwrap_err(),
        NmuError::ServiceDenied { src: 2, dst: 9 }
    );
    // S1 holds no permissions at all (Fig. 4.4).
    assert_eq!(
        t.send(s1p2, Triple::new(2, 1, 1)).unwrap_err(),
        NmuError::ServiceDenied { src: 1, dst: 2 }
    );
    assert_eq!(
        t.send(7, Triple::new(1, 2, 1)).unwrap_err(),
        NmuError::UnknownLocalIndex(7)
    );
    assert!(
        t.send(s2p1, Triple::new(1, 3, 1))
            .unwrap_err()
            .to_string()
            .contains("process 3")
    );
}

#[test]
fn receive_finds_the_register_set_or_refuses() {
    let (t, s2p1, s1p2) = host();
    let o = t.send(s2p1, Triple::new(1, 2, 1)).unwrap();
    assert_eq!(t.receive(&o.header).unwrap(), s1p2);
    let mut h = o.header;
    h.dst.proc = 77;
    assert_eq!(t.receive(&h).unwrap_err(), NmuError::NotResident(1, 77));
}

#[test]
fn two_way_otp_round_trip() {
    let (mut t, s2p1, s1p2) = host();
    // (S2,P1) sends to (S1,P2,D1) with an OTP naming itself (S2,P1,D1).
    let req = t
        .send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(2, 1, 1))
        .unwrap();
    assert_eq!(req.rate_slot, Some(5), "the request is rate-controlled");
    let (li, key) = t.receive_with_otp(&req.header, 10).unwrap();
    assert_eq!(li, s1p2);
    assert_eq!(t.otp_count(s1p2), 1);
    // S1 holds no fixed permissions, yet can answer once.
    let resp = t.send_using_otp(s1p2, key, 20).unwrap();
    assert_eq!(resp.header.src, (1, 2));
    assert_eq!(resp.header.dst, Triple::new(2, 1, 1));
    assert_eq!(resp.address, Address(21));
    assert_eq!(resp.header.otp.unwrap().requester, Some((2, 1)));
    assert_eq!(
        resp.rate_slot, None,
        "sent using an OTP: bypasses rate control"
    );
    assert_eq!(t.receive(&resp.header).unwrap(), s2p1);
    // Reuse is impossible.
    assert_eq!(
        t.send_using_otp(s1p2, key, 21).unwrap_err(),
        NmuError::UnknownOtp(key)
    );
    assert_eq!(t.otp_count(s1p2), 0);
}

#[test]
fn three_way_otp_and_wrong_recipient() {
    let (mut t, s2p1, s1p2) = host();
    // To a third party the requester may reach: allowed.
    let req = t
        .send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(3, 3, 2))
        .unwrap();
    let (_, key) = t.receive_with_otp(&req.header, 0).unwrap();
    let resp = t.send_using_otp(s1p2, key, 1).unwrap();
    assert_eq!(resp.header.dst, Triple::new(3, 3, 2));
    assert_eq!(resp.address, Address(33));
    assert_eq!(resp.header.otp.unwrap().requester, Some((2, 1)));
    // To a recipient the requester may not reach: refused at the requester.
    assert_eq!(
        t.send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(3, 4, 2))
            .unwrap_err(),
        NmuError::ProcessDenied {
            src: 2,
            dst: 3,
            proc: 4
        }
    );
    assert_eq!(
        t.send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(3, 3, 9))
            .unwrap_err(),
        NmuError::DomainDenied {
            src: 2,
            dst: 3,
            dom: 9
        }
    );
    assert_eq!(
        t.send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(4, 0, 0))
            .unwrap_err(),
        NmuError::ServiceDenied { src: 2, dst: 4 }
    );
}

#[test]
fn otp_is_usable_only_by_the_process_that_received_it() {
    let (mut t, s2p1, s1p2) = host();
    let s1p3 = t.add_process(1, 3).unwrap();
    let req = t
        .send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(2, 1, 1))
        .unwrap();
    let (_, key) = t.receive_with_otp(&req.header, 0).unwrap();
    assert_eq!(
        t.send_using_otp(s1p3, key, 1).unwrap_err(),
        NmuError::UnknownOtp(key)
    );
    assert!(t.send_using_otp(s1p2, key, 1).is_ok());
}

#[test]
fn otp_expires() {
    let (mut t, s2p1, s1p2) = host();
    let req = t
        .send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(2, 1, 1))
        .unwrap();
    let (_, key) = t.receive_with_otp(&req.header, 0).unwrap();
    assert_eq!(
        t.send_using_otp(s1p2, key, 100).unwrap_err(),
        NmuError::OtpExpired(key)
    );
    // Expired and removed: a second try finds nothing.
    assert_eq!(
        t.send_using_otp(s1p2, key, 100).unwrap_err(),
        NmuError::UnknownOtp(key)
    );
}

#[test]
fn otp_cap_bounds_state_and_expiry_frees_room() {
    let (mut t, s2p1, s1p2) = host();
    let req = t
        .send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(2, 1, 1))
        .unwrap();
    t.receive_with_otp(&req.header, 0).unwrap();
    t.receive_with_otp(&req.header, 50).unwrap();
    let e = t.receive_with_otp(&req.header, 60).unwrap_err();
    assert_eq!(
        e,
        NmuError::OtpTableFull {
            svc: 1,
            proc: 2,
            cap: 2
        }
    );
    assert!(e.to_string().contains("already holds 2"));
    // At 100 the first has expired: room again.
    let (_, k) = t.receive_with_otp(&req.header, 100).unwrap();
    assert_eq!(t.otp_count(s1p2), 2);
    assert!(t.send_using_otp(s1p2, k, 101).is_ok());
    assert_eq!(t.purge_expired(1000), 1);
    assert_eq!(t.otp_count(s1p2), 0);
}

#[test]
fn receive_with_otp_needs_an_otp_and_a_resident_destination() {
    let (mut t, s2p1, _) = host();
    let plain = t.send(s2p1, Triple::new(1, 2, 1)).unwrap();
    assert_eq!(
        t.receive_with_otp(&plain.header, 0).unwrap_err(),
        NmuError::NoOtpInMessage
    );
    let mut req = t
        .send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(2, 1, 1))
        .unwrap();
    req.header.dst.proc = 99;
    assert_eq!(
        t.receive_with_otp(&req.header, 0).unwrap_err(),
        NmuError::NotResident(1, 99)
    );
}

#[test]
fn removing_a_process_purges_its_otps_and_last_one_drops_permissions() {
    let (mut t, s2p1, s1p2) = host();
    let req = t
        .send_with_otp(s2p1, Triple::new(1, 2, 1), Triple::new(2, 1, 1))
        .unwrap();
    let (_, key) = t.receive_with_otp(&req.header, 0).unwrap();
    t.remove_process(1, 2).unwrap();
    let again = t.add_process(1, 2).unwrap();
    assert_eq!(again, s1p2, "register set reused");
    assert_eq!(
        t.send_using_otp(again, key, 1).unwrap_err(),
        NmuError::UnknownOtp(key)
    );
    // A second process of S2 inherits S2's permissions (§4.3).
    let s2p5 = t.add_process(2, 5).unwrap();
    assert!(t.send(s2p5, Triple::new(1, 2, 1)).is_ok());
    t.remove_process(2, 1).unwrap();
    assert!(t.send(s2p5, Triple::new(1, 2, 1)).is_ok());
    t.remove_process(2, 5).unwrap();
    assert!(t.destinations(2).is_empty());
    assert_eq!(
        t.remove_process(2, 5).unwrap_err(),
        NmuError::NotResident(2, 5)
    );
    let s2p1b = t.add_process(2, 1).unwrap();
    assert_eq!(
        t.send(s2p1b, Triple::new(1, 2, 1)).unwrap_err(),
        NmuError::ServiceDenied { src: 2, dst: 1 }
    );
}

#[test]
fn management_errors() {
    let (mut t, _, _) = host();
    assert_eq!(
        t.add_process(2, 1).unwrap_err(),
        NmuError::AlreadyResident(2, 1)
    );
    assert_eq!(
        t.set_permission(8, 1, &[], &[], None).unwrap_err(),
        NmuError::ServiceNotResident(8)
    );
    assert!(matches!(
        t.add_process(NOS_SERVICE, 1),
        Err(NmuError::InvalidId(_))
    ));
    for p in 10..24 {
        let _ = t.add_process(5, p);
    }
    assert!(
        matches!(t.add_process(6, 0), Err(NmuError::InvalidId(m)) if m.contains("register set"))
    );
}

#[test]
fn replace_remove_and_compact_keep_contents() {
    let (mut t, s2p1, _) = host();
    for round in 0..200u32 {
        let procs: Vec<(u32, Address)> = (0..40)
            .map(|p| (p * 37 + round, Address(p + round)))
            .collect();
        t.set_permission(2, 1, &procs, &[round, 1000 + round], None)
            .unwrap();
    }
    let (p, d, r) = t.permission(2, 1).unwrap();
    assert_eq!(p.len(), 40);
    assert_eq!(d, vec![199, 1199]);
    assert_eq!(r, None);
    assert_eq!(
        t.send(s2p1, Triple::new(1, 199 + 37, 1199))
            .unwrap()
            .address,
        Address(200)
    );
    t.compact();
    assert_eq!(t.permission(2, 1).unwrap().0, p);
    assert_eq!(
        t.send(s2p1, Triple::new(1, 199 + 37 * 39, 199))
            .unwrap()
            .address,
        Address(39 + 199)
    );
    assert!(t.remove_permission(2, 1));
    assert!(!t.remove_permission(2, 1));
    assert!(t.send(s2p1, Triple::new(1, 199, 199)).is_err());
    assert_eq!(
        t.send(s2p1, Triple::new(3, 3, 2)).unwrap().address,
        Address(33)
    );
    let s = t.stats();
    assert_eq!(s.sacl_entries, 2);
    assert_eq!(s.process_entries, 2);
    assert!(s.total_bytes > 0);
}
