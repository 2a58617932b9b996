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
    c.handle(BILL, id, msg, 1_000)
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
