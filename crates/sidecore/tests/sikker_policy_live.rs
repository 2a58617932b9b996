//! Sikker's live policy updates end to end, as root: a running agent takes a
//! new policy from its store without a restart, and keeps enforcing the last
//! good one when the new one is wrong or the store goes away.
//!
//! - **File** (the one-node store): a denied send is permitted within a
//!   bounded wait after the policy file grants it; a policy with a syntax
//!   error, and one that no longer defines a placed process, are refused and
//!   reported (with `file:line:col` for the syntax error) while the last good
//!   policy keeps enforcing (a permitted send passes, a denied one is denied);
//!   a later good policy still applies; the receiver stays attached through
//!   every update; a broken placement file is refused too (`file:line:col`)
//!   while the last good placement stays; the agent's counters say 2
//!   applied and 2 refused, and 1 placement refused.
//! - **etcd** (a real one, started by the test on loopback): the agent starts
//!   from the key, applies `put-policy` updates, refuses a broken text written
//!   to the key (located as `etcd:KEY:line:col`), reports etcd going away once
//!   while it keeps enforcing, and after etcd comes back applies the next update.
//! - **etcd with authentication**: `put-policy` needs a user who may write,
//!   the agent reads as its own read-only user, and a wrong password is said.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code: a failed unwrap is a failed run; one scenario read top to bottom

mod common;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::cgroups::*;
use common::*;
use sidecore_sikker_agent::store::LocalEtcd;

/// How long an update may take to reach the agent (the file is polled every
/// 200 ms, the agent looks every 100 ms; etcd reconnects within 2 s).
const BOUND: Duration = Duration::from_secs(5);

/// The policy: kvs:3 and bill:101 in their cgroups; `grant` decides what
/// bill may reach; `extra` goes at the end.
fn policy(g: &Groups, grant: &str, extra: &str) -> String {
    format!(
        r#"[[service]]
name = "kvs"
domains = ["Get", "Set"]
[[service.process]]
id = 3
cgroup = "{}"
[[service.portal]]
name = "ForBill"
processes = [3]
domains = ["Get"]

[[service]]
name = "bill"
domains = ["Reply"]
[[service.process]]
id = 101
cgroup = "{}"
{grant}
{extra}"#,
        g.path("kvs3"),
        g.path("bill")
    )
}

const GRANT_GET: &str = "[[grant]]\nfrom = \"bill\"\nto = \"kvs\"\nportal = \"ForBill\"\n";
const GRANT_ALL: &str =
    "[[grant]]\nfrom = \"bill\"\nto = \"kvs\"\nall_processes = true\nall_domains = true\n";

const PLACEMENT: &str = "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\", \"bill:101\"]\n";

fn send(bill: &Path, sock: &str, dom: &str, text: &str) -> Output {
    run_in(
        bill,
        &[
            "sikker",
            "send",
            "--socket",
            sock,
            "--to",
            &format!("kvs:3:{dom}"),
            text,
        ],
    )
}

#[track_caller]
fn expect_sent(o: &Output) {
    assert!(o.status.success(), "{:?}", text(o));
}

#[track_caller]
fn expect_denied(o: &Output, what: &str) {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains(what), "expected `{what}` in:\n{err}");
}

/// Sends until one is permitted; how long that took.
#[track_caller]
fn permitted_within(bill: &Path, sock: &str, dom: &str, text: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let o = send(bill, sock, dom, text);
        if o.status.success() {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < BOUND,
            "still denied after {BOUND:?}: {:?}",
            common::text(&o)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[track_caller]
fn logged(log: &Path, what: &str) -> String {
    let ok = wait_for(
        || {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains(what)
        },
        BOUND.as_secs(),
    );
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(ok, "the agent never logged `{what}`:\n{text}");
    text
}

/// A receiver for kvs:3 taking `n` messages; its lines' texts.
fn receiver(kvs: &Path, sock: &str, n: usize) -> Guard {
    Guard(recv_in(kvs, sock, n, 20_000))
}

fn received(mut g: Guard) -> Vec<String> {
    common::sikker::received_texts(&mut g.0, 10)
}

/// Stops the agent with SIGTERM; its counters.
fn counters(mut a: Guard) -> serde_json::Value {
    common::sikker::counters_at_sigterm(&mut a.0)
}

fn start_agent(args: &[&str], log: &Path) -> Guard {
    let log = std::fs::File::create(log).unwrap();
    Guard(
        bin()
            .args(["sikker", "agent"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// As root, one test at a time: kvs3 and bill's cgroups (`tag`) and a
/// temporary directory; `None` (the test skipped) when not root.
fn live(
    tag: &str,
) -> Option<(
    std::sync::MutexGuard<'static, ()>,
    Groups,
    tempfile::TempDir,
)> {
    let (serial, g) = root_groups(tag, &["kvs3", "bill"])?;
    Some((serial, g, tempfile::tempdir().unwrap()))
}

/// An agent on watched files, and where they are.
struct OnFiles {
    agent: Guard,
    policy: std::path::PathBuf,
    placement: std::path::PathBuf,
    sock: String,
    log: std::path::PathBuf,
}

/// An agent for host h1 whose store is `dir`'s `policy.toml` and
/// `placement.toml` (written first); it listens on `dir/agent.sock` and logs
/// to `dir/agent.log`.
fn agent_on_files(dir: &Path, policy: &str, placement: &str) -> OnFiles {
    let (pfile, lfile) = (dir.join("policy.toml"), dir.join("placement.toml"));
    std::fs::write(&pfile, policy).unwrap();
    std::fs::write(&lfile, placement).unwrap();
    let sock = dir.join("agent.sock");
    let agent = start_agent(
        &[
            "--host",
            "h1",
            "--socket",
            sock.to_str().unwrap(),
            "--policy",
            pfile.to_str().unwrap(),
            "--placement",
            lfile.to_str().unwrap(),
        ],
        &dir.join("agent.log"),
    );
    assert!(wait_for(|| sock.exists(), 10), "the agent never listened");
    OnFiles {
        agent,
        policy: pfile,
        placement: lfile,
        sock: sock.to_str().unwrap().to_string(),
        log: dir.join("agent.log"),
    }
}

#[test]
fn a_watched_policy_file_updates_the_running_agent_and_a_bad_one_is_refused() {
    let Some((_s, g, dir)) = live("live-file") else {
        return;
    };
    let OnFiles {
        agent,
        policy: file,
        placement,
        sock,
        log,
    } = agent_on_files(dir.path(), &policy(&g, "", ""), PLACEMENT);
    let s = sock.as_str();
    let (kvs, bill) = (g.procs("kvs3"), g.procs("bill"));
    let rx = receiver(&kvs, s, 4);
    std::thread::sleep(Duration::from_millis(300));

    expect_denied(
        &send(&bill, s, "Get", "before"),
        "service bill holds no permission to service kvs",
    );
    // Granted in the file: permitted within the bound, and only Get.
    std::fs::write(&file, policy(&g, GRANT_GET, "")).unwrap();
    let took = permitted_within(&bill, s, "Get", "granted");
    eprintln!("the grant took effect after {took:?}");
    logged(&log, "applied: 1 NMU entries set, 0 removed");
    expect_denied(
        &send(&bill, s, "Set", "x"),
        "service bill may not use domain Set of kvs",
    );

    // A syntax error on the last line: refused, located, and the last good
    // policy keeps enforcing.
    std::fs::write(&file, policy(&g, GRANT_ALL, "bogus = 1\n")).unwrap();
    let line = policy(&g, GRANT_ALL, "").lines().count() + 1;
    logged(
        &log,
        &format!("{}:{line}:1: unknown field `bogus`", file.display()),
    );
    expect_sent(&send(&bill, s, "Get", "still"));
    expect_denied(
        &send(&bill, s, "Set", "x"),
        "service bill may not use domain Set of kvs",
    );
    // A policy that parses but drops a placed process: refused too.
    let no_bill = policy(&g, "", "").replace("id = 101\n", "id = 102\n");
    std::fs::write(&file, no_bill).unwrap();
    logged(
        &log,
        "the new policy does not define process bill:101, which is placed on host `h1`",
    );
    expect_denied(
        &send(&bill, s, "Set", "x"),
        "service bill may not use domain Set of kvs",
    );

    // The placement file is watched the same way: a broken one is refused,
    // located, and the last good placement stays in force.
    std::fs::write(&placement, format!("{PLACEMENT}agent = \"0.0.0.0:7411\"\n")).unwrap();
    logged(
        &log,
        &format!(
            "{}:4:9: agent address of host `h1`: `0.0.0.0:7411` has no specific address",
            placement.display()
        ),
    );
    expect_sent(&send(&bill, s, "Get", "placed"));

    // A good one after the refusals applies.
    std::fs::write(&file, policy(&g, GRANT_ALL, "")).unwrap();
    permitted_within(&bill, s, "Set", "set");
    assert_eq!(received(rx), ["granted", "still", "placed", "set"]);
    let c = counters(agent);
    assert_eq!(c["policy_updates"], 2, "{c}");
    assert_eq!(c["policy_refused"], 2, "{c}");
    assert_eq!(c["placement_refused"], 1, "{c}");
}

#[test]
fn the_agent_follows_its_policy_in_etcd_across_an_etcd_restart() {
    let Some((_s, g, dir)) = live("live-etcd") else {
        return;
    };
    let mut etcd = LocalEtcd::start(&dir.path().join("etcd")).unwrap();
    let ep = etcd.endpoint();
    let key = "/sidecore-test/sikker/policy";
    let put = |name: &str, body: &str| {
        let f = dir.path().join(name);
        std::fs::write(&f, body).unwrap();
        let o = run(&[
            "sikker",
            "put-policy",
            "--etcd",
            &ep,
            "--key",
            key,
            f.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{:?}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&format!("at etcd key {key} (revision")),
            "{:?}",
            text(&o)
        );
    };
    put("deny.toml", &policy(&g, "", ""));
    // put-policy checks before it stores.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, policy(&g, GRANT_ALL, "bogus = 1\n")).unwrap();
    let o = run(&[
        "sikker",
        "put-policy",
        "--etcd",
        &ep,
        "--key",
        key,
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(text(&o).1.contains("not stored"), "{:?}", text(&o));

    let placement = dir.path().join("placement.toml");
    std::fs::write(&placement, PLACEMENT).unwrap();
    let sock = dir.path().join("agent.sock");
    let s = sock.to_str().unwrap();
    let log = dir.path().join("agent.log");
    let agent = start_agent(
        &[
            "--host",
            "h1",
            "--socket",
            s,
            "--etcd",
            &ep,
            "--etcd-key",
            key,
            "--placement",
            placement.to_str().unwrap(),
        ],
        &log,
    );
    assert!(wait_for(|| sock.exists(), 10), "the agent never listened");
    let (kvs, bill) = (g.procs("kvs3"), g.procs("bill"));
    let rx = receiver(&kvs, s, 4);
    std::thread::sleep(Duration::from_millis(300));
    expect_denied(
        &send(&bill, s, "Get", "before"),
        "service bill holds no permission to service kvs",
    );
    put("get.toml", &policy(&g, GRANT_GET, ""));
    permitted_within(&bill, s, "Get", "granted");

    // A broken text written straight to the key: refused, located.
    sidecore_sikker_agent::store::put(
        std::slice::from_ref(&ep),
        &sidecore_sikker_agent::store::EtcdAccess::default(),
        key,
        &policy(&g, GRANT_ALL, "bogus = 1\n"),
    )
    .unwrap();
    let line = policy(&g, GRANT_ALL, "").lines().count() + 1;
    logged(&log, &format!("etcd:{key}:{line}:1: unknown field `bogus`"));
    expect_sent(&send(&bill, s, "Get", "still"));

    // etcd goes away: reported once, and enforcement goes on.
    etcd.stop();
    logged(&log, "cannot be read");
    expect_sent(&send(&bill, s, "Get", "while-down"));
    expect_denied(
        &send(&bill, s, "Set", "x"),
        "service bill may not use domain Set of kvs",
    );
    std::thread::sleep(Duration::from_millis(2500));
    // Back: the watch resumes, and the next update applies.
    etcd.restart().unwrap();
    logged(&log, "can be read again");
    put("all.toml", &policy(&g, GRANT_ALL, ""));
    permitted_within(&bill, s, "Set", "set");
    let text = std::fs::read_to_string(&log).unwrap();
    // Once per watched key: the policy's, and the placement's beside it
    // (this agent's placement is its file; the key holds none).
    assert_eq!(text.matches("cannot be read").count(), 2, "{text}");
    for what in ["policy", "placement"] {
        let once = format!("the {what} at etcd key ");
        assert_eq!(
            text.lines()
                .filter(|l| l.contains(&once) && l.contains("cannot be read"))
                .count(),
            1,
            "{text}"
        );
    }
    assert!(
        text.contains("no placement at etcd key /sidecore/sikker/placement"),
        "{text}"
    );
    assert_eq!(received(rx), ["granted", "still", "while-down", "set"]);
    let c = counters(agent);
    assert_eq!(c["policy_updates"], 2, "{c}");
    assert_eq!(c["policy_refused"], 1, "{c}");
}

/// An etcd with authentication on (root, an `operator` who may write the
/// Sikker keys, an `agent` who may only read them): `put-policy` without a
/// user is refused with what to give, with the operator's password file it
/// stores; the agent, as its own user, starts from the key and applies the
/// next update; with a wrong password it says so and keeps waiting.
#[test]
fn the_agent_reads_its_policy_from_an_etcd_with_authentication_as_its_own_user() {
    let Some((_s, g, dir)) = live("live-auth") else {
        return;
    };
    let etcd = LocalEtcd::start(&dir.path().join("etcd")).unwrap();
    let ep = etcd.endpoint();
    let mut admin = sidecore_sikker_agent::store::Etcd::new(std::slice::from_ref(&ep));
    admin.enable_auth("root-pw").unwrap();
    admin
        .add_user("operator", "op-pw", "/sidecore/", true)
        .unwrap();
    admin
        .add_user("agent", "agent-pw", "/sidecore/", false)
        .unwrap();
    let pw = |name: &str, pw: &str| {
        let f = dir.path().join(name);
        std::fs::write(&f, format!("{pw}\n")).unwrap();
        f.to_str().unwrap().to_string()
    };
    let (op_pw, agent_pw, wrong_pw) = (
        pw("op.pw", "op-pw"),
        pw("agent.pw", "agent-pw"),
        pw("wrong.pw", "nope"),
    );
    let put = |name: &str, body: &str, user: &[&str]| {
        let f = dir.path().join(name);
        std::fs::write(&f, body).unwrap();
        let mut args = vec!["sikker", "put-policy", "--etcd", &ep];
        args.extend_from_slice(user);
        args.push(f.to_str().unwrap());
        run(&args)
    };
    let o = put("deny.toml", &policy(&g, "", ""), &[]);
    assert!(!o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("user name is empty") && text(&o).1.contains("--etcd-user"),
        "{:?}",
        text(&o)
    );
    let operator = ["--etcd-user", "operator", "--etcd-password-file", &op_pw];
    let o = put("deny.toml", &policy(&g, "", ""), &operator);
    assert!(o.status.success(), "{:?}", text(&o));

    let placement = dir.path().join("placement.toml");
    std::fs::write(&placement, PLACEMENT).unwrap();
    let sock = dir.path().join("agent.sock");
    let s = sock.to_str().unwrap();
    let agent_args = |pwfile: &str| {
        vec![
            "--host".to_string(),
            "h1".into(),
            "--socket".into(),
            s.into(),
            "--etcd".into(),
            ep.clone(),
            "--etcd-user".into(),
            "agent".into(),
            "--etcd-password-file".into(),
            pwfile.into(),
            "--placement".into(),
            placement.to_str().unwrap().into(),
        ]
    };
    // A wrong password: said, with the user named, and the agent waits.
    let wrong_log = dir.path().join("wrong.log");
    let a = agent_args(&wrong_pw);
    let wrong = start_agent(
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        &wrong_log,
    );
    logged(&wrong_log, "authentication as user `agent` failed");
    assert!(
        !sock.exists(),
        "an agent without its policy does not listen"
    );
    drop(wrong);

    let log = dir.path().join("agent.log");
    let a = agent_args(&agent_pw);
    let agent = start_agent(&a.iter().map(String::as_str).collect::<Vec<_>>(), &log);
    assert!(wait_for(|| sock.exists(), 10), "the agent never listened");
    let (kvs, bill) = (g.procs("kvs3"), g.procs("bill"));
    let rx = receiver(&kvs, s, 1);
    std::thread::sleep(Duration::from_millis(300));
    expect_denied(
        &send(&bill, s, "Get", "before"),
        "service bill holds no permission to service kvs",
    );
    let o = put("get.toml", &policy(&g, GRANT_GET, ""), &operator);
    assert!(o.status.success(), "{:?}", text(&o));
    permitted_within(&bill, s, "Get", "granted");
    assert_eq!(received(rx), ["granted"]);
    let c = counters(agent);
    assert_eq!(c["policy_updates"], 1, "{c}");
}

/// One change written as two files: a policy that renames `bill` to `carol`
/// (refused alone: the placement in force still places `bill:101`) and a
/// placement that places `carol:101` (refused alone: the policy in force
/// has no `carol`). Whichever comes first waits, and the second installs
/// both together; then the same back in the other order.
#[test]
fn a_policy_and_a_placement_that_only_fit_each_other_are_applied_together() {
    let Some((_s, g, dir)) = live("live-pair") else {
        return;
    };
    let as_bill = policy(&g, GRANT_GET, "");
    let as_carol = as_bill.replace("\"bill\"", "\"carol\"");
    let carol_placed = PLACEMENT.replace("bill:101", "carol:101");
    let OnFiles {
        agent,
        policy: pfile,
        placement: lfile,
        sock,
        log,
    } = agent_on_files(dir.path(), &as_bill, PLACEMENT);
    let s = sock.as_str();
    let (kvs, bill) = (g.procs("kvs3"), g.procs("bill"));
    let rx = receiver(&kvs, s, 2);
    std::thread::sleep(Duration::from_millis(300));

    // Policy first: refused alone, then installed with the placement.
    std::fs::write(&pfile, &as_carol).unwrap();
    logged(&log, "policy update refused");
    std::fs::write(&lfile, &carol_placed).unwrap();
    logged(&log, "applied together");
    permitted_within(&bill, s, "Get", "as-carol");

    // Placement first: refused alone (no `bill` in the policy in force),
    // then installed with the policy.
    std::fs::write(&lfile, PLACEMENT).unwrap();
    logged(&log, "placement update refused");
    std::fs::write(&pfile, &as_bill).unwrap();
    let text = logged(&log, "placement from");
    assert!(
        wait_for(
            || std::fs::read_to_string(&log)
                .unwrap_or_default()
                .matches("applied together")
                .count()
                == 2,
            5
        ),
        "{text}"
    );
    permitted_within(&bill, s, "Get", "as-bill");
    assert_eq!(received(rx), ["as-carol", "as-bill"]);
    let c = counters(agent);
    assert_eq!(c["policy_updates"], 2, "{c}");
    assert_eq!(c["placement_updates"], 2, "{c}");
}

/// A process is judged where it is at the next update, not where it was when
/// it attached: the receiver attached as kvs:3 moves into bill's cgroup, and
/// the next policy update ends its identity (its facts now attest bill:101),
/// so kvs:3 has no listener from then on.
#[test]
fn a_process_that_moved_cgroups_is_judged_where_it_is_at_the_next_update() {
    let Some((_s, g, dir)) = live("live-moved") else {
        return;
    };
    let OnFiles {
        agent,
        policy: file,
        sock,
        log,
        ..
    } = agent_on_files(dir.path(), &policy(&g, GRANT_GET, ""), PLACEMENT);
    let s = sock.as_str();
    let (kvs, bill) = (g.procs("kvs3"), g.procs("bill"));
    let rx = receiver(&kvs, s, 2);
    std::thread::sleep(Duration::from_millis(300));
    permitted_within(&bill, s, "Get", "before");
    // The attached receiver leaves kvs's cgroup for bill's.
    std::fs::write(&bill, rx.0.id().to_string()).unwrap();
    std::fs::write(&file, policy(&g, GRANT_ALL, "")).unwrap();
    let text = logged(&log, "the update ends the identity of connection");
    assert!(
        text.contains(&format!(
            "(pid {}): the new policy makes it bill:101",
            rx.0.id()
        )),
        "{text}"
    );
    expect_denied(
        &send(&bill, s, "Get", "after"),
        "no process attached as kvs:3 is listening",
    );
    let c = counters(agent);
    assert_eq!(c["policy_updates"], 1, "{c}");
    drop(rx);
}
