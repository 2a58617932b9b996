//! Sikker's NOS state in one etcd shared by three agents, as root (issue 15):
//! each agent in its own network namespace, etcd in `h0`'s on its testbed
//! address, and the agents started with nothing but `--etcd` — no policy,
//! no placement, no `--peer`: both documents and the agents' addresses come
//! from the two keys, and every change is pushed to every agent by its watch.
//!
//! - A policy change written once (`put-policy`) reaches every agent: a
//!   domain it grants is then permitted at the sender's agent (h0) and at the
//!   receiver's (h1), each checking with its own tables.
//! - A placement change written once (`put-placement`) moves `dst:9` from h1
//!   to h2 and gives h2's agent an address: h0 and h1 dial h2 (learned from
//!   the placement alone), h1's attached `dst:9` ends, and messages from h0's
//!   and h1's senders reach `dst:9` at h2 without restarting any agent.
//! - A malformed placement written to the key is reported by every agent
//!   with `etcd:KEY:line:col`, and forwarding goes on with the last good one.
//! - A placement naming a service the policy does not define yet is refused
//!   by every agent, and applied by each when the policy defining it comes.
//! - Each agent's counters say 2 policy and 2 placement updates applied, 2
//!   placements refused.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code: a failed unwrap is a failed run; one scenario read top to bottom

mod common;

use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::cgroups::{recv_in, run_in};
use common::sikker::{Cluster, PORT, Proc};
use common::*;
use sidecore_sikker_agent::store::{self, LocalEtcd};

/// How long a change may take to reach every agent and the links to follow.
const BOUND: Duration = Duration::from_secs(10);
const PLACEMENT_KEY: &str = store::DEFAULT_ETCD_PLACEMENT_KEY;

/// Runs `f` on a thread inside network namespace `ns` (what it starts runs
/// there too).
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    std::thread::spawn(move || {
        // SAFETY: `file` is an open network namespace file; setns changes
        // only this thread's namespace, and the thread ends after `f`.
        let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// `src` (0–2, in cgroups s0–s2) may reach `dst:9` (in `sink`) in `domains`.
fn policy(c: &Cluster, domains: &str) -> String {
    let g = &c.groups;
    format!(
        "[[service]]\nname = \"src\"\n\
         [[service.process]]\nid = 0\ncgroup = \"{}\"\n\
         [[service.process]]\nid = 1\ncgroup = \"{}\"\n\
         [[service.process]]\nid = 2\ncgroup = \"{}\"\n\
         [[service]]\nname = \"dst\"\ndomains = [\"In\", \"Admin\"]\n\
         [[service.process]]\nid = 9\ncgroup = \"{}\"\n\
         [[grant]]\nfrom = \"src\"\nto = \"dst\"\nprocesses = [9]\ndomains = [{domains}]\n",
        g.path("s0"),
        g.path("s1"),
        g.path("s2"),
        g.path("sink")
    )
}

/// Where host `h`'s agent is reached (any of its addresses: the testbed routes them all).
fn agent_addr(c: &Cluster, h: &str) -> String {
    let from = if h == "h0" { "h1" } else { "h0" };
    c.addr(from, h)
}

/// `src:i` on `hi`; `dst:9` on `dst_on`; h2's agent address only when `h2_known`.
fn placement(c: &Cluster, dst_on: &str, h2_known: bool) -> String {
    let mut s = String::new();
    for (i, h) in ["h0", "h1", "h2"].into_iter().enumerate() {
        let mut procs = vec![format!("\"src:{i}\"")];
        if h == dst_on {
            procs.push("\"dst:9\"".into());
        }
        s += &format!(
            "[[host]]\nname = \"{h}\"\nprocesses = [{}]\n",
            procs.join(", ")
        );
        if h != "h2" || h2_known {
            s += &format!("agent = \"{}\"\n", agent_addr(c, h));
        }
    }
    s
}

/// `sidecore sikker ARGS` inside `h0`'s namespace (where etcd answers).
fn run_h0(c: &Cluster, args: &[&str]) -> Output {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &c.ns("h0"),
            env!("CARGO_BIN_EXE_sidecore"),
            "sikker",
        ])
        .args(args)
        .output()
        .unwrap()
}

/// Checks and stores a document with `put-policy` / `put-placement`.
fn put(c: &Cluster, ep: &str, what: &str, name: &str, body: &str) -> Output {
    let f = c.dir.path().join(name);
    std::fs::write(&f, body).unwrap();
    run_h0(c, &[what, "--etcd", ep, f.to_str().unwrap()])
}

#[track_caller]
fn stored(o: &Output) {
    assert!(o.status.success(), "{:?}", text(o));
    assert!(text(o).0.contains("stored "), "{:?}", text(o));
}

/// Agent `h` in its namespace with nothing but etcd; stdout piped (its counters).
fn agent(c: &Cluster, h: &str, ep: &str) -> Proc {
    let err = std::fs::File::create(c.log(h, "nos")).unwrap();
    Proc(
        Command::new("ip")
            .args(["netns", "exec", &c.ns(h), env!("CARGO_BIN_EXE_sidecore")])
            .args(["sikker", "agent", "--etcd", ep, "--host", h, "--socket"])
            .arg(c.sock(h))
            .args(["--listen", &format!("0.0.0.0:{PORT}"), "--tls"])
            .arg(&c.tls)
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap(),
    )
}

#[track_caller]
fn all_log(c: &Cluster, what: &str) {
    for h in ["h0", "h1", "h2"] {
        assert!(
            wait_for(|| c.log_has(h, "nos", what), BOUND.as_secs()),
            "agent {h} never logged `{what}`:\n{}",
            std::fs::read_to_string(c.log(h, "nos")).unwrap_or_default()
        );
    }
}

/// Sender `src:i` sends through host `hi`'s agent.
fn send(c: &Cluster, i: usize, dom: &str, msg: &str) -> Output {
    run_in(
        &c.groups.procs(&format!("s{i}")),
        &[
            "sikker",
            "send",
            "--socket",
            c.sock(&format!("h{i}")).to_str().unwrap(),
            "--to",
            &format!("dst:9:{dom}"),
            msg,
        ],
    )
}

/// Sends until one is permitted.
#[track_caller]
fn permitted(c: &Cluster, i: usize, dom: &str, msg: &str) {
    let t0 = Instant::now();
    loop {
        let o = send(c, i, dom, msg);
        if o.status.success() {
            return;
        }
        assert!(t0.elapsed() < BOUND, "still refused: {:?}", text(&o));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `dst:9` receiving `n` messages through host `h`'s agent.
fn receiver(c: &Cluster, h: &str, n: usize) -> Guard {
    Guard(recv_in(
        &c.groups.procs("sink"),
        c.sock(h).to_str().unwrap(),
        n,
        20_000,
    ))
}

fn received(mut g: Guard) -> Vec<String> {
    common::sikker::received_texts(&mut g.0, 25)
}

/// Stops the agent with SIGTERM; its counters.
fn counters(mut a: Proc) -> serde_json::Value {
    common::sikker::counters_at_sigterm(&mut a.0)
}

#[test]
fn three_agents_follow_one_etcd_for_policy_and_placement() {
    if !sidecore_testbed::testing::root() {
        return;
    }
    let _s = serial();
    let c = Cluster::up("sikker-nos", "10.219.0.0/16", "scnos", 1.0, 65536);
    let ip: std::net::IpAddr = agent_addr(&c, "h0")
        .parse::<std::net::SocketAddr>()
        .unwrap()
        .ip();
    let data = c.dir.path().join("etcd");
    let etcd = in_ns(&c.ns("h0"), move || LocalEtcd::start_on(&data, ip).unwrap());
    let ep = etcd.endpoint();

    stored(&put(
        &c,
        &ep,
        "put-policy",
        "p1.toml",
        &policy(&c, "\"In\""),
    ));
    // put-placement checks against the policy in etcd before it stores.
    let o = put(
        &c,
        &ep,
        "put-placement",
        "bad.toml",
        "[[host]]\nname = \"h0\"\nprocesses = [\"nope:1\"]\n",
    );
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("unknown service `nope`") && text(&o).1.contains("not stored"),
        "{:?}",
        text(&o)
    );
    stored(&put(
        &c,
        &ep,
        "put-placement",
        "pl1.toml",
        &placement(&c, "h1", false),
    ));

    let agents: Vec<Proc> = ["h0", "h1", "h2"]
        .iter()
        .map(|h| agent(&c, h, &ep))
        .collect();
    assert!(
        wait_for(
            || c.log_has("h0", "nos", "linked to host h1"),
            BOUND.as_secs()
        ),
        "h0 links to h1 at the placement's address:\n{}",
        std::fs::read_to_string(c.log("h0", "nos")).unwrap_or_default()
    );

    // The policy, written once, reaches every agent.
    let rx1 = receiver(&c, "h1", 2);
    permitted(&c, 0, "In", "one");
    let o = send(&c, 0, "Admin", "x");
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("may not use domain Admin of dst"),
        "{:?}",
        text(&o)
    );
    stored(&put(
        &c,
        &ep,
        "put-policy",
        "p2.toml",
        &policy(&c, "\"In\", \"Admin\""),
    ));
    all_log(&c, "policy from etcd key /sidecore/sikker/policy at");
    permitted(&c, 0, "Admin", "admin");
    assert_eq!(received(rx1), ["one", "admin"]);
    // Nothing gave h2's agent an address yet.
    for h in ["h0", "h1"] {
        assert!(
            !c.log_has(h, "nos", "linked to host h2"),
            "{h} knew h2's agent"
        );
    }

    // The placement, written once: dst:9 moves to h2, whose address h0 and h1 learn.
    stored(&put(
        &c,
        &ep,
        "put-placement",
        "pl2.toml",
        &placement(&c, "h2", true),
    ));
    all_log(&c, "placement from etcd key /sidecore/sikker/placement at");
    all_log(&c, "1 processes moved, 1 peers changed");
    for h in ["h0", "h1"] {
        assert!(
            wait_for(|| c.log_has(h, "nos", "linked to host h2"), BOUND.as_secs()),
            "{h} dials h2 at its new address:\n{}",
            std::fs::read_to_string(c.log(h, "nos")).unwrap_or_default()
        );
    }
    // dst:9 can no longer attach at h1.
    let o = run_in(
        &c.groups.procs("sink"),
        &[
            "sikker",
            "recv",
            "--socket",
            c.sock("h1").to_str().unwrap(),
            "--timeout-ms",
            "100",
        ],
    );
    assert_ne!(o.status.code(), Some(0), "{:?}", text(&o));
    assert!(text(&o).1.contains("placed on host h2"), "{:?}", text(&o));
    let rx2 = receiver(&c, "h2", 3);
    permitted(&c, 0, "In", "moved");
    permitted(&c, 1, "In", "from-h1");

    // A malformed placement: every agent reports it, located; the last good one stays.
    let good = placement(&c, "h2", true);
    let line = good.lines().count() + 1;
    let ep2 = ep.clone();
    let bad = format!("{good}bogus = 1\n");
    in_ns(&c.ns("h0"), move || {
        store::put(&[ep2], &store::EtcdAccess::default(), PLACEMENT_KEY, &bad).unwrap()
    });
    all_log(
        &c,
        &format!("etcd:{PLACEMENT_KEY}:{line}:1: unknown field `bogus`"),
    );
    all_log(
        &c,
        "placement update refused, the last good placement stays in force",
    );
    let o = send(&c, 0, "In", "still");
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(received(rx2), ["moved", "from-h1", "still"]);
    let rx3 = receiver(&c, "h2", 1);

    // A placement naming a service the policy does not define yet is
    // refused, and applied once a policy that defines it arrives: the two
    // installed together, in one step.
    let ahead = good.replacen("\"src:2\"", "\"src:2\", \"extra:0\"", 1);
    let ep3 = ep.clone();
    in_ns(&c.ns("h0"), move || {
        store::put(&[ep3], &store::EtcdAccess::default(), PLACEMENT_KEY, &ahead).unwrap()
    });
    all_log(&c, "unknown service `extra`");
    let defined = format!(
        "{}[[service]]\nname = \"extra\"\n[[service.process]]\nid = 0\ncgroup = \"/none\"\n",
        policy(&c, "\"In\", \"Admin\"")
    );
    stored(&put(&c, &ep, "put-policy", "p3.toml", &defined));
    all_log(&c, "applied together: 1 processes moved, 0 peers changed");
    permitted(&c, 2, "In", "after");
    assert_eq!(received(rx3), ["after"]);

    for (h, a) in ["h0", "h1", "h2"].into_iter().zip(agents) {
        let n = counters(a);
        assert_eq!(n["policy_updates"], 2, "{h}: {n}");
        assert_eq!(n["placement_updates"], 2, "{h}: {n}");
        assert_eq!(n["placement_refused"], 2, "{h}: {n}");
        assert_eq!(n["policy_refused"], 0, "{h}: {n}");
    }
    drop(etcd);
}
