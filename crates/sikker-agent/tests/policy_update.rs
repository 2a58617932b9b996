//! `AgentCore::update_policy`, sans-IO: a new policy takes effect for
//! connections already attached (also when their services are renumbered);
//! one the agent cannot enforce (a rate algorithm it does not run, a placed
//! process dropped) is refused with its reason, counted, and the last good
//! policy keeps enforcing; one that no longer attests an attached process
//! ends that process's identity.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use sidecore_sikker_agent::attest::ProcessFacts;
use sidecore_sikker_agent::{AgentCore, Denied, Dest, FromAgent, ToAgent};
use sidecore_sikker_policy::{Nos, Policy, parse_placement, parse_policy};

const KVS: u64 = 1;
const BILL: u64 = 2;

fn policy(grant: &str, extra: &str) -> Policy {
    parse_policy(
        "p.toml",
        &format!(
            "[[service]]\nname = \"kvs\"\n{extra}domains = [\"Get\", \"Set\"]\n\
             [[service.process]]\nid = 3\ncgroup = \"/t/kvs\"\n\
             [[service.portal]]\nname = \"ForBill\"\nprocesses = [3]\ndomains = [\"Get\"]\n\
             [[service]]\nname = \"bill\"\ndomains = [\"Reply\"]\n\
             [[service.process]]\nid = 101\ncgroup = \"/t/bill\"\n{grant}"
        ),
    )
    .unwrap()
}

const GRANT: &str = "[[grant]]\nfrom = \"bill\"\nto = \"kvs\"\nportal = \"ForBill\"\n";

fn facts(pid: i32, cgroup: &str) -> ProcessFacts {
    ProcessFacts {
        pid,
        uid: 1000,
        cgroup: Some(cgroup.into()),
        exe: "/usr/bin/true".into(),
    }
}

fn core() -> AgentCore {
    let p = policy("", "");
    let pl = parse_placement(
        "h.toml",
        "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\", \"bill:101\"]\n",
        &p,
    )
    .unwrap();
    let mut c = AgentCore::new(Nos::compile(p, &pl).unwrap(), "h1").unwrap();
    c.attach(KVS, &facts(10, "/t/kvs")).unwrap();
    c.attach(BILL, &facts(11, "/t/bill")).unwrap();
    c.handle(KVS, 1, ToAgent::Listen, 0);
    c
}

/// bill:101 sends to kvs:3 in `domain`: delivered to kvs's connection (as
/// from bill:101), or why not.
fn send(c: &mut AgentCore, id: u64, domain: &str) -> Result<(), Denied> {
    let to = Dest {
        service: "kvs".into(),
        process: 3,
        domain: domain.into(),
    };
    let msg = ToAgent::Send {
        to,
        payload: b"hi".to_vec(),
        otp_for: None,
        claim: None,
    };
    let effects = c.handle(BILL, id, msg, 1_000);
    for e in &effects {
        if let FromAgent::Denied { why, .. } = &e.msg {
            return Err(why.clone());
        }
    }
    let delivered = effects.iter().any(|e| {
        e.to == KVS
            && matches!(&e.msg, FromAgent::Deliver { from, domain: d, .. }
                if from.to_string() == "bill:101" && d == domain)
    });
    assert!(delivered, "{effects:?}");
    assert!(
        effects
            .iter()
            .any(|e| e.to == BILL && e.msg == FromAgent::Ok(id))
    );
    Ok(())
}

#[track_caller]
fn denied(r: Result<(), Denied>, what: &str) {
    match r {
        Err(d) => assert!(d.to_string().contains(what), "expected `{what}` in `{d}`"),
        Ok(()) => panic!("expected a denial ({what})"),
    }
}

#[test]
fn updates_reach_attached_connections_and_refusals_keep_the_last_good_policy() {
    let mut c = core();
    denied(send(&mut c, 1, "Get"), "service bill holds no permission");
    let d = c.update_policy(policy(GRANT, "")).unwrap();
    assert_eq!((d.entries_set, d.entries_removed), (1, 0));
    send(&mut c, 2, "Get").unwrap();
    denied(send(&mut c, 3, "Set"), "may not use domain Set of kvs");

    // kvs renumbered (1 → 7): both connections keep their identities.
    let d = c.update_policy(policy(GRANT, "id = 7\n")).unwrap();
    assert!(d.entries_set >= 2, "{d:?}");
    send(&mut c, 4, "Get").unwrap();

    // A rate algorithm the agent does not run: refused, and rolled back.
    let mut re = policy(GRANT, "id = 7\n");
    re.rate_limits.push(sidecore_sikker_policy::RateLimit {
        from: re.service_by_name("bill").unwrap().id,
        to: 7,
        gbps: 1.0,
        algorithm: sidecore_sikker_rate::Algorithm::Re,
        bucket_bytes: 25_000,
    });
    let e = c.update_policy(re).unwrap_err();
    assert!(
        matches!(e, sidecore_sikker_agent::PolicyRefused::Rates(_)),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(
        e.contains("rate limits: ") && e.contains("cannot be run by the agent"),
        "{e}"
    );
    send(&mut c, 5, "Get").unwrap();
    denied(send(&mut c, 6, "Set"), "may not use domain Set of kvs");

    // A placed process dropped: refused.
    let mut gone = policy(GRANT, "id = 7\n");
    let bill = gone.service_by_name("bill").unwrap().id;
    gone.services.get_mut(&bill).unwrap().processes.clear();
    let e = c.update_policy(gone).unwrap_err().to_string();
    assert!(e.contains("does not define process bill:101"), "{e}");
    send(&mut c, 7, "Get").unwrap();

    // A rate limit the agent runs: applied (rate control rebuilt), and a
    // small message still passes at once.
    let mut limited = policy(GRANT, "id = 7\n");
    limited.rate_limits.push(sidecore_sikker_policy::RateLimit {
        from: bill,
        to: 7,
        gbps: 1.0,
        algorithm: sidecore_sikker_rate::Algorithm::SeTre,
        bucket_bytes: 25_000,
    });
    let d = c.update_policy(limited).unwrap();
    assert_eq!(d.rate_limits_changed, 1);
    send(&mut c, 8, "Get").unwrap();

    let n = c.counters();
    assert_eq!((n.policy_updates, n.policy_refused), (3, 2), "{n:?}");
    assert_eq!(c.policy_refused("from the I/O layer"), "from the I/O layer");
    assert_eq!(c.counters().policy_refused, 3);
}

#[test]
fn denials_are_logged_with_sender_and_reason_then_sampled() {
    use sidecore_sikker_agent::core::{LOG_EVERY_DENIAL, LOG_FIRST_DENIALS};
    let mut c = core();
    let why = || Denied::Permission("service bill may not use domain Set of kvs".into());
    c.deny(BILL, Some(7), why());
    let line = c.denial_line(BILL, Some(7), &why()).unwrap();
    assert!(
        line.contains("denied pid 11 (bill:101) request 7 (permission)")
            && line.ends_with("service bill may not use domain Set of kvs"),
        "{line}"
    );
    // A connection that never attached is named as such.
    let anon = c.denial_line(99, None, &why()).unwrap();
    assert!(anon.contains("connection 99 (not attached)"), "{anon}");
    // Past the first ones, one in LOG_EVERY_DENIAL is logged, with the total.
    let mut logged = Vec::new();
    for total in 2..=LOG_FIRST_DENIALS + 2 * LOG_EVERY_DENIAL {
        c.deny(BILL, None, why());
        if let Some(l) = c.denial_line(BILL, None, &why()) {
            assert_eq!(
                total > LOG_FIRST_DENIALS,
                l.contains("denials so far"),
                "{l}"
            );
            logged.push(total);
        }
    }
    assert_eq!(logged.len() as u64, LOG_FIRST_DENIALS - 1 + 2);
    assert_eq!(
        logged[logged.len() - 2..],
        [LOG_EVERY_DENIAL, 2 * LOG_EVERY_DENIAL]
    );
}

/// A policy that moves bill:101 to another cgroup ends the identity of the
/// process attached from the old one (its facts no longer attest to it):
/// its messages are refused as from no identity, and it is logged; kvs's
/// connection, still attested, keeps working.
#[test]
fn a_policy_that_no_longer_attests_an_attached_process_ends_its_identity() {
    let mut c = core();
    c.update_policy(policy(GRANT, "")).unwrap();
    send(&mut c, 1, "Get").unwrap();
    let text = format!(
        "[[service]]\nname = \"kvs\"\ndomains = [\"Get\", \"Set\"]\n\
         [[service.process]]\nid = 3\ncgroup = \"/t/kvs\"\n\
         [[service.portal]]\nname = \"ForBill\"\nprocesses = [3]\ndomains = [\"Get\"]\n\
         [[service]]\nname = \"bill\"\ndomains = [\"Reply\"]\n\
         [[service.process]]\nid = 101\ncgroup = \"/t/bill-elsewhere\"\n{GRANT}"
    );
    c.update_policy(parse_policy("p.toml", &text).unwrap())
        .unwrap();
    assert!(c.attested(BILL).is_none(), "bill's identity ended");
    assert!(c.attested(KVS).is_some(), "kvs still attests");
    let e = send(&mut c, 2, "Get").unwrap_err();
    assert!(
        matches!(e, Denied::NoIdentity(_)),
        "refused as from no identity: {e:?}"
    );
    assert_eq!(c.counters().denied.get("no-identity"), Some(&1));
    // A process in the new cgroup attaches as bill:101.
    let id = c.attach(9, &facts(12, "/t/bill-elsewhere")).unwrap();
    assert_eq!(id.to_string(), "bill:101");
}
