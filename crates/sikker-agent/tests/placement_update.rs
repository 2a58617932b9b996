//! `AgentCore::update_placement`, sans-IO: a process moved to another host is
//! forwarded to that host's agent from then on (and one moved here is
//! delivered here); a connection whose identity moved away ends; the peers'
//! agent addresses follow the placement; a placement that leaves this host
//! out, or names a process the policy does not define, is refused, counted,
//! and the last good placement stays in force.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use sidecore_sikker_agent::attest::ProcessFacts;
use sidecore_sikker_agent::{AgentCore, Dest, FromAgent, PlacementRefused, ToAgent};
use sidecore_sikker_policy::{Nos, Placement, Policy, parse_placement, parse_policy};
use sidecore_wire::Message;

const BILL: u64 = 1;
const KVS: u64 = 2;

fn policy() -> Policy {
    parse_policy(
        "p.toml",
        "[[service]]\nname = \"kvs\"\ndomains = [\"Get\"]\n\
         [[service.process]]\nid = 3\ncgroup = \"/t/kvs\"\n\
         [[service]]\nname = \"bill\"\n[[service.process]]\nid = 101\ncgroup = \"/t/bill\"\n\
         [[grant]]\nfrom = \"bill\"\nto = \"kvs\"\nall_processes = true\nall_domains = true\n",
    )
    .unwrap()
}

/// bill:101 on h1; kvs:3 on `kvs_on`; h2 and h3 with agents at .2 and .3.
fn placement(p: &Policy, kvs_on: &str) -> Placement {
    let mut src = String::new();
    for h in ["h1", "h2", "h3"] {
        let mut procs = Vec::new();
        if h == "h1" {
            procs.push("\"bill:101\"");
        }
        if h == kvs_on {
            procs.push("\"kvs:3\"");
        }
        src += &format!(
            "[[host]]\nname = \"{h}\"\nprocesses = [{}]\n",
            procs.join(", ")
        );
        if h != "h1" {
            src += &format!("agent = \"10.0.0.{}:7411\"\n", &h[1..]);
        }
    }
    parse_placement("pl.toml", &src, p).unwrap()
}

fn facts(pid: i32, cgroup: &str) -> ProcessFacts {
    ProcessFacts {
        pid,
        uid: 1000,
        cgroup: Some(cgroup.into()),
        exe: "/usr/bin/true".into(),
    }
}

fn send(c: &mut AgentCore, id: u64) -> Vec<FromAgent> {
    send_from(c, BILL, id)
}

/// Request `id` from connection `conn`: a message to kvs:3 in domain Get.
fn send_from(c: &mut AgentCore, conn: u64, id: u64) -> Vec<FromAgent> {
    let msg = ToAgent::Send {
        to: Dest {
            service: "kvs".into(),
            process: 3,
            domain: "Get".into(),
        },
        payload: b"hi".to_vec(),
        otp_for: None,
        claim: None,
    };
    c.handle(conn, id, msg, 1_000)
        .into_iter()
        .map(|e| e.msg)
        .collect()
}

/// The host the last message was forwarded to.
fn forwarded_to(c: &mut AgentCore) -> Vec<String> {
    c.take_outbox()
        .into_iter()
        .filter(|(_, m)| matches!(m, Message::AgentSend(_)))
        .map(|(h, _)| h)
        .collect()
}

#[test]
fn a_moved_process_is_reached_on_its_new_host_and_bad_placements_are_refused() {
    let p = policy();
    let first = placement(&p, "h2");
    let mut c = AgentCore::new(Nos::compile(p.clone(), &first).unwrap(), "h1").unwrap();
    c.set_agents(first.agents.clone());
    c.attach(BILL, &facts(10, "/t/bill")).unwrap();
    assert!(c.linked("h2", 0) && c.linked("h3", 0));
    assert!(send(&mut c, 1).is_empty(), "forwarded: answered later");
    assert_eq!(forwarded_to(&mut c), ["h2"]);

    // kvs:3 moves to h3: forwarded there, the addresses unchanged.
    let d = c.update_placement(&placement(&p, "h3")).unwrap();
    assert_eq!((d.moved, d.peers_changed), (1, 0));
    assert!(!c.take_peers_changed());
    assert!(send(&mut c, 2).is_empty());
    assert_eq!(forwarded_to(&mut c), ["h3"]);

    // h3's agent moves: the links are told.
    let mut moved = placement(&p, "h3");
    moved
        .agents
        .insert("h3".into(), "10.0.0.33:7411".parse().unwrap());
    let d = c.update_placement(&moved).unwrap();
    assert_eq!((d.moved, d.peers_changed), (0, 1));
    assert!(c.take_peers_changed());
    assert_eq!(c.agents()["h3"], "10.0.0.33:7411".parse().unwrap());

    // Refused: this host left out; a process the policy does not define.
    let mut without = moved.clone();
    without.hosts.retain(|h| h.0 != "h1");
    let e = c.update_placement(&without).unwrap_err();
    assert!(matches!(e, PlacementRefused::NotHere { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "this agent's host `h1` is not in it (hosts: h2, h3)"
    );
    let mut unknown = moved.clone();
    unknown.hosts[2]
        .1
        .push((p.service_by_name("kvs").unwrap().id, 4));
    let e = c.update_placement(&unknown).unwrap_err();
    assert!(e.to_string().contains("has no process 4"), "{e}");
    // The last good placement stays in force.
    assert!(send(&mut c, 3).is_empty());
    assert_eq!(forwarded_to(&mut c), ["h3"]);
    assert_eq!(c.counters().placement_updates, 2);
    assert_eq!(c.counters().placement_refused, 2);

    // kvs:3 moves here: delivered here; then away again: its connection ends.
    c.update_placement(&placement(&p, "h1")).unwrap();
    c.attach(KVS, &facts(11, "/t/kvs")).unwrap();
    c.handle(KVS, 1, ToAgent::Listen, 0);
    let out = send(&mut c, 4);
    assert!(
        out.iter().any(|m| matches!(m, FromAgent::Deliver { .. })),
        "{out:?}"
    );
    c.update_placement(&placement(&p, "h2")).unwrap();
    assert!(c.attested(KVS).is_none(), "kvs:3 is no longer placed here");
    assert!(c.attested(BILL).is_some());
    assert!(send(&mut c, 5).is_empty());
    assert_eq!(forwarded_to(&mut c), ["h2"]);
}

/// `update_policy_and_placement`: a policy that renames `bill` to `carol`
/// is refused alone (the placement in force places `bill:101`), and so is a
/// placement of `carol:101` alone (the policy in force has no `carol`); the
/// two together are installed in one step, the attached process keeps its
/// identity changes (its old connection ends, a new one attests as carol),
/// and both counters move. An invalid
/// policy in the pair is refused and nothing changes.
#[test]
fn a_policy_and_a_placement_are_installed_together() {
    let p = policy();
    let first = placement(&p, "h1");
    let mut c = AgentCore::new(Nos::compile(p.clone(), &first).unwrap(), "h1").unwrap();
    c.set_agents(first.agents.clone());
    c.attach(BILL, &facts(10, "/t/bill")).unwrap();
    let text = "[[service]]\nname = \"kvs\"\ndomains = [\"Get\"]\n\
         [[service.process]]\nid = 3\ncgroup = \"/t/kvs\"\n\
         [[service]]\nname = \"carol\"\n[[service.process]]\nid = 101\ncgroup = \"/t/bill\"\n\
         [[grant]]\nfrom = \"carol\"\nto = \"kvs\"\nall_processes = true\nall_domains = true\n";
    let carol = parse_policy("p2.toml", text).unwrap();
    assert!(
        c.update_policy(carol.clone()).is_err(),
        "alone: bill:101 is placed"
    );
    let src = "[[host]]\nname = \"h1\"\nprocesses = [\"carol:101\", \"kvs:3\"]\n\
               [[host]]\nname = \"h2\"\nprocesses = []\nagent = \"10.0.0.2:7411\"\n\
               [[host]]\nname = \"h3\"\nprocesses = []\nagent = \"10.0.0.3:7411\"\n";
    assert!(
        parse_placement("pl2.toml", src, &p).is_err(),
        "alone: no carol"
    );
    let placed = parse_placement("pl2.toml", src, &carol).unwrap();

    let mut bad = carol.clone();
    bad.nmu.otp_cap = 0;
    let e = c.update_policy_and_placement(bad, &placed).unwrap_err();
    assert!(e.to_string().contains("otp_cap"), "{e}");
    assert!(
        c.nos().policy().service_by_name("bill").is_some(),
        "nothing changed"
    );

    c.update_policy_and_placement(carol, &placed).unwrap();
    assert!(c.nos().policy().service_by_name("carol").is_some());
    // A renamed service is another identity: the old connection ends, and
    // the same process attaching again is carol:101.
    assert!(c.attested(BILL).is_none(), "bill's identity ended");
    c.attach(3, &facts(10, "/t/bill")).unwrap();
    assert!(c.attested(3).is_some());
    c.attach(KVS, &facts(11, "/t/kvs")).unwrap();
    c.handle(KVS, 1, ToAgent::Listen, 0);
    let out = send_from(&mut c, 3, 1);
    assert!(
        out.iter()
            .any(|m| matches!(m, FromAgent::Deliver { .. } | FromAgent::Ok(_))),
        "carol may reach kvs: {out:?}"
    );
    let n = c.counters();
    assert_eq!((n.policy_updates, n.placement_updates), (1, 1));
    assert_eq!((n.policy_refused, n.placement_refused), (1, 1));
}

/// `refresh_facts`: facts read again before an update replace the ones from
/// attach time (a process that moved from bill's cgroup to kvs's loses
/// bill's identity at the update); an unreadable process, or facts for
/// another pid, change nothing.
#[test]
fn refreshed_facts_judge_a_process_where_it_is_now() {
    let p = policy();
    let first = placement(&p, "h1");
    let mut c = AgentCore::new(Nos::compile(p.clone(), &first).unwrap(), "h1").unwrap();
    c.set_agents(first.agents.clone());
    c.attach(BILL, &facts(10, "/t/bill")).unwrap();
    c.attach(KVS, &facts(11, "/t/kvs")).unwrap();
    // Gone (None) and a different pid: kept.
    c.refresh_facts(|f| (f.pid == 11).then(|| facts(99, "/t/bill")));
    c.update_placement(&first).unwrap();
    assert!(c.attested(BILL).is_some() && c.attested(KVS).is_some());
    // Process 10 now sits in kvs's cgroup: bill's identity ends.
    c.refresh_facts(|f| (f.pid == 10).then(|| facts(10, "/t/kvs")));
    c.update_placement(&first).unwrap();
    assert!(c.attested(BILL).is_none(), "moved: no longer bill:101");
    assert!(c.attested(KVS).is_some());
}
