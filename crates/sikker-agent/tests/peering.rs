//! The agent core's side of agent links, without sockets: a message another
//! agent forwards is delivered only when its source is placed on that
//! agent's host (an agent speaks only for its own processes); a receiver's
//! verdict comes back to the sender (a denial typed, naming the host), and
//! only from the host it was forwarded to; a link that goes down denies what
//! was forwarded on it and not yet answered; an unlinked host is refused.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use sidecore_sikker_agent::attest::ProcessFacts;
use sidecore_sikker_agent::{AgentCore, Denied, Dest, FromAgent, ToAgent};
use sidecore_sikker_policy::{Nos, parse_placement, parse_policy};
use sidecore_wire::{AgentResult, AgentSend, Message, WireHeader};

fn nos() -> Nos {
    let policy = parse_policy(
        "p.toml",
        "[[service]]\nname = \"src\"\nprocess_count = 3\n[[service.process]]\nid = 5\ncgroup = \"/t/s5\"\n[[service]]\nname = \"dst\"\ndomains = [\"In\"]\n[[service.process]]\nid = 9\n[[grant]]\nfrom = \"src\"\nto = \"dst\"\nprocesses = [9]\ndomains = [\"In\"]\n",
    )
    .unwrap();
    let placement = parse_placement(
        "h.toml",
        "[[host]]\nname = \"h0\"\nprocesses = [\"dst:9\"]\n[[host]]\nname = \"h1\"\nprocesses = [\"src:1\", \"src:5\"]\n[[host]]\nname = \"h2\"\nprocesses = [\"src:0\", \"src:2\"]\n",
        &policy,
    )
    .unwrap();
    Nos::compile(policy, &placement).unwrap()
}

fn ids(n: &Nos, svc: &str) -> u32 {
    n.policy()
        .services
        .values()
        .find(|s| s.name == svc)
        .unwrap()
        .id
}

#[test]
fn a_forwarded_message_whose_source_is_not_on_the_forwarding_host_is_refused() {
    let n = nos();
    let (src, dst) = (ids(&n, "src"), ids(&n, "dst"));
    let dom = n.policy().services[&dst].domains["In"];
    let mut h0 = AgentCore::new(n, "h0").unwrap();
    assert!(h0.linked("h1", 0));
    assert!(
        !h0.linked("h9", 0),
        "a host not in the placement is not linked"
    );
    // h1's agent claims to forward for src:2, which runs on h2.
    let forged = Message::AgentSend(AgentSend {
        fid: 7,
        header: WireHeader {
            src: [src, 2],
            dst: [dst, 9, dom],
            otp: None,
        },
        payload: "aGk=".into(),
    });
    let r = h0.on_peer("h1", forged, 1);
    assert!(r.effects.is_empty() && r.delivery_of.is_none());
    let out = h0.take_outbox();
    let [
        (
            to,
            Message::AgentResult(AgentResult {
                fid: 7,
                denied: Some((kind, why)),
            }),
        ),
    ] = out.as_slice()
    else {
        panic!("{out:?}");
    };
    assert_eq!((to.as_str(), kind.as_str()), ("h1", "forged"));
    assert!(why.contains("src:2 is placed on host h2"), "{why}");
    assert_eq!(h0.counters().denied.get("forged"), Some(&1));
    // Bad base64 from a rightful source: malformed, answered, nothing delivered.
    let bad = Message::AgentSend(AgentSend {
        fid: 8,
        header: WireHeader {
            src: [src, 1],
            dst: [dst, 9, dom],
            otp: None,
        },
        payload: "not base64!".into(),
    });
    let r = h0.on_peer("h1", bad, 2);
    assert!(r.effects.is_empty());
    let out = h0.take_outbox();
    assert!(
        matches!(&out[..], [(_, Message::AgentResult(AgentResult { fid: 8, denied: Some((k, _)) }))] if k == "malformed"),
        "{out:?}"
    );
}

#[test]
fn a_remote_verdict_answers_the_sender_and_a_lost_link_denies_what_it_carried() {
    let n = nos();
    let mut h1 = AgentCore::new(n, "h1").unwrap();
    h1.linked("h0", 0);
    let facts = ProcessFacts {
        pid: 4242,
        uid: 0,
        cgroup: Some("/t/s5".into()),
        exe: "/bin/true".into(),
    };
    assert_eq!(h1.attach(1, &facts).unwrap().to_string(), "src:5");
    let to: Dest = "dst:9:In".parse().unwrap();
    let send = || ToAgent::Send {
        to: to.clone(),
        payload: b"hi".to_vec(),
        otp_for: None,
        claim: None,
    };
    // Forwarded to h0: no answer yet; h0's denial answers it, typed.
    assert!(h1.handle(1, 10, send(), 1).is_empty());
    let out = h1.take_outbox();
    let [(host, Message::AgentSend(m))] = out.as_slice() else {
        panic!("{out:?}");
    };
    assert_eq!(host, "h0");
    let verdict = Message::AgentResult(AgentResult {
        fid: m.fid,
        denied: Some((
            "undeliverable".into(),
            "no process attached as dst:9 is listening".into(),
        )),
    });
    // From the wrong host, the verdict is ignored.
    assert!(h1.on_peer("h2", verdict.clone(), 2).effects.is_empty());
    let r = h1.on_peer("h0", verdict, 3);
    let [e] = r.effects.as_slice() else {
        panic!("{:?}", r.effects);
    };
    assert_eq!(e.to, 1);
    let FromAgent::Denied {
        id: Some(10),
        why: Denied::Remote { host, why },
    } = &e.msg
    else {
        panic!("{:?}", e.msg);
    };
    assert_eq!(host, "h0");
    assert!(why.contains("is listening (undeliverable)"), "{why}");
    // Another, then the link goes down before h0 answers: denied, not lost.
    assert!(h1.handle(1, 11, send(), 4).is_empty());
    assert_eq!(h1.take_outbox().len(), 1);
    let lost = h1.unlinked("h0", 5);
    let [e] = lost.as_slice() else {
        panic!("{lost:?}");
    };
    assert!(
        matches!(&e.msg, FromAgent::Denied { id: Some(11), why: Denied::Undeliverable(w) } if w.contains("went down")),
        "{:?}",
        e.msg
    );
    // Unlinked: the next one is refused at once, by name.
    let now = h1.handle(1, 12, send(), 6);
    assert!(
        matches!(&now[..], [e] if matches!(&e.msg, FromAgent::Denied { id: Some(12), why: Denied::Undeliverable(w) } if w.contains("not linked"))),
        "{now:?}"
    );
}
