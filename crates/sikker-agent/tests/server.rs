//! The agent's server and client library in one process, without root: the
//! test process attests as the policy's process whose cgroup is its own. A
//! permitted message goes through with the derived identity; a denial says
//! why; malformed bytes get a clear error and the connection keeps working;
//! and a second agent refuses a host that is not in the placement. Posted
//! (pipelined) messages stream through a busy-polling agent, and flushing
//! hands back exactly the refused ones.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::io::IoSlice;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::socket::{MsgFlags, sendmsg};
use sidecore_sikker_agent::server::Server;
use sidecore_sikker_agent::{AgentCore, Client, ClientError, Counters, Denied, Dest};
use sidecore_sikker_policy::{Nos, parse_placement, parse_policy};

fn own_cgroup() -> String {
    let t = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    sidecore_sikker_agent::attest::cgroup_v2(&t).expect("this test needs a cgroup v2 line")
}

/// One service `echo` with process 1 in this process's cgroup, allowed to
/// reach itself in domain `In` only (self access: on by default).
fn nos(host: &str) -> Nos {
    let policy = parse_policy(
        "p.toml",
        &format!(
            "[[service]]\nname = \"echo\"\ndomains = [\"In\", \"Out\"]\n[[service.process]]\nid = 1\ncgroup = \"{}\"\n",
            own_cgroup()
        ),
    )
    .unwrap();
    let placement = parse_placement(
        "h.toml",
        &format!("[[host]]\nname = \"{host}\"\nprocesses = [\"echo:1\"]\n"),
        &policy,
    )
    .unwrap();
    Nos::compile(policy, &placement).unwrap()
}

/// An agent for host h1 serving on `sock` on a thread of its own (busy-polling
/// with `busy`) until the flag is raised; the thread returns its counters.
fn serve(
    sock: &std::path::Path,
    busy: bool,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<Counters>) {
    let mut server = Server::bind(AgentCore::new(nos("h1"), "h1").unwrap(), sock).unwrap();
    server.set_busy_poll(busy);
    let stop = Arc::new(AtomicBool::new(false));
    let st = Arc::clone(&stop);
    let t = std::thread::spawn(move || {
        server.run(&st).unwrap();
        server.core().counters().clone()
    });
    (stop, t)
}

#[test]
fn a_process_talks_to_itself_through_the_agent_and_bad_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let (stop, t) = serve(&sock, false);
    let mut rx = Client::connect(&sock).unwrap();
    assert_eq!(rx.identity().unwrap().to_string(), "echo:1");
    rx.listen().unwrap();
    let mut tx = Client::connect(&sock).unwrap();
    let to: Dest = "echo:1:In".parse().unwrap();
    tx.send(&to, b"one").unwrap();
    let d = rx.recv(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(
        (d.from.to_string(), d.domain.as_str(), d.payload.as_slice()),
        ("echo:1".into(), "In", &b"one"[..])
    );
    // Garbage on the socket: a clear error, and the connection still works.
    let garbage = [0xffu8; 40];
    sendmsg::<()>(
        tx.raw_fd().as_raw_fd(),
        &[IoSlice::new(&garbage)],
        &[],
        MsgFlags::empty(),
        None,
    )
    .unwrap();
    // The garbage is denied as such; the next request is answered as itself.
    tx.send(&to, b"two").unwrap();
    assert!(
        matches!(
            tx.stray(),
            [sidecore_sikker_agent::FromAgent::Denied {
                id: None,
                why: Denied::Malformed(_)
            }]
        ),
        "{:?}",
        tx.stray()
    );
    let d = rx.recv(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(d.payload, b"two");
    // A destination the policy does not know, by each kind of name.
    for (bad, what) in [
        ("nope:1:In", "service"),
        ("echo:9:In", "process"),
        ("echo:1:Nope", "domain"),
    ] {
        match tx.send(&bad.parse().unwrap(), b"x") {
            Err(ClientError::Denied(Denied::Unknown { what: w, .. })) => assert_eq!(w, what),
            other => panic!("{bad}: {other:?}"),
        }
    }
    stop.store(true, Ordering::Release);
    let counters = t.join().unwrap();
    assert_eq!(counters.attached, 2);
    assert_eq!(counters.delivered, 2);
    assert_eq!(counters.denied.get("malformed"), Some(&1));
    assert_eq!(counters.denied.get("unknown-name"), Some(&3));
}

#[test]
fn an_agent_for_a_host_outside_the_placement_does_not_start() {
    let e = AgentCore::new(nos("h1"), "h2").err().unwrap().to_string();
    assert!(
        e.contains("host `h2` is not in the placement (hosts: h1)"),
        "{e}"
    );
}

#[test]
fn posted_messages_stream_through_a_busy_polling_agent_and_flush_returns_exactly_the_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let (stop, t) = serve(&sock, true);
    let mut rx = Client::connect(&sock).unwrap();
    rx.listen().unwrap();
    const N: u32 = 3000;
    // The receiver takes everything until the end marker.
    let got = std::thread::spawn(move || {
        let mut got = Vec::new();
        while let Some(d) = rx.recv(Duration::from_secs(10)).unwrap() {
            if d.payload == b"end" {
                break;
            }
            got.push(u32::from_le_bytes(d.payload[..4].try_into().unwrap()));
        }
        got
    });
    let mut tx = Client::connect(&sock).unwrap();
    let (good, bad): (Dest, Dest) = ("echo:1:In".parse().unwrap(), "echo:9:In".parse().unwrap());
    let mut sent = std::collections::BTreeMap::new();
    for i in 0..N {
        let to = if i % 7 == 3 { &bad } else { &good };
        let id = tx.post(to, &i.to_le_bytes()).unwrap();
        assert!(tx.unanswered() <= sidecore_sikker_agent::client::POST_WINDOW);
        sent.insert(id, i);
    }
    let refused = tx.flush(Duration::from_secs(10)).unwrap();
    assert_eq!(tx.unanswered(), 0);
    // Every message to the unknown process is refused as such, by its number;
    // anything else refused could only be a full receiver, said so.
    let mut unknown = Vec::new();
    let mut full = std::collections::BTreeSet::new();
    for (id, why) in refused {
        let i = sent[&id];
        match why {
            Denied::Unknown { what, .. } if what == "process" => unknown.push(i),
            Denied::Undeliverable(_) => assert!(full.insert(i)),
            other => panic!("message {i}: {other}"),
        }
    }
    let expect_unknown: Vec<u32> = (0..N).filter(|i| i % 7 == 3).collect();
    assert_eq!(unknown, expect_unknown);
    // A blocking send after the posts is answered as itself.
    tx.send(&good, b"end").unwrap();
    let got = got.join().unwrap();
    let expect: Vec<u32> = (0..N).filter(|i| i % 7 != 3 && !full.contains(i)).collect();
    assert_eq!(got, expect, "delivered in order, each once");
    stop.store(true, Ordering::Release);
    let counters = t.join().unwrap();
    assert_eq!(counters.delivered, expect.len() as u64 + 1);
    assert_eq!(
        counters.denied.get("unknown-name"),
        Some(&(expect_unknown.len() as u64))
    );
}
