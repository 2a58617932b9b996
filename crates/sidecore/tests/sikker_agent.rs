//! Sikker's agent end to end, as root: real processes in real cgroup v2
//! groups attach through `sidecore sikker`, and the agent derives who each
//! is. A permitted message arrives with its sender's verified identity; one
//! the policy does not permit is denied with the reason; a one-time
//! permission answers once and never again; and every way of claiming
//! another identity is refused — a forged source, a process in a cgroup the
//! policy does not name, a socket passed to another process, and an exec
//! after attaching.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code: a failed unwrap is a failed run; one scenario read top to bottom

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use common::cgroups::*;
use common::*;

#[track_caller]
fn expect_refused(o: &Output, what: &str) {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains(what), "expected `{what}` in:\n{err}");
}

fn lines(o: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_agent_derives_identities_checks_every_message_and_refuses_every_spoof() {
    let Some((_s, g)) = root_groups("sikker", &["kvs3", "bill", "other"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            r#"
[nmu]
otp_ttl_ms = 60000
otp_cap = 4

[[service]]
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

[[grant]]
from = "bill"
to = "kvs"
portal = "ForBill"
"#,
            g.path("kvs3"),
            g.path("bill")
        ),
    )
    .unwrap();
    let placement = dir.path().join("placement.toml");
    std::fs::write(
        &placement,
        "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\", \"bill:101\"]\n",
    )
    .unwrap();
    let sock = dir.path().join("agent.sock");
    let s = sock.to_str().unwrap();
    let agent_log = dir.path().join("agent.log");
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let _agent = Guard(
        bin()
            .args(["sikker", "agent", "--host", "h1", "--socket", s, "--policy"])
            .arg(&policy)
            .args(["--metrics", &metrics])
            .arg("--placement")
            .arg(&placement)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&agent_log).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| sock.exists(), 10), "the agent never listened");
    let (kvs, bill, other) = (g.procs("kvs3"), g.procs("bill"), g.procs("other"));

    // kvs:3 listens and answers every one-time permission with "pong";
    // bill:101 listens for that answer.
    let kvs_rx = spawn_in(
        &kvs,
        &[
            "sikker",
            "recv",
            "--socket",
            s,
            "--count",
            "2",
            "--timeout-ms",
            "8000",
            "--reply",
            "pong",
        ],
    );
    let bill_rx = recv_in(&bill, s, 1, 8000);
    std::thread::sleep(Duration::from_millis(300));

    // Permitted: delivered with the sender's derived identity.
    let o = run_in(
        &bill,
        &[
            "sikker",
            "send",
            "--socket",
            s,
            "--to",
            "kvs:3:Get",
            "hello",
        ],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    // Not permitted: the domain is outside the portal bill was granted.
    expect_refused(
        &run_in(
            &bill,
            &[
                "sikker",
                "send",
                "--socket",
                s,
                "--to",
                "kvs:3:Set",
                "write",
            ],
        ),
        "service bill may not use domain Set of kvs",
    );
    // The agent logged it with the sender it derived and the reason.
    let log = std::fs::read_to_string(&agent_log).unwrap();
    assert!(
        log.lines().any(|l| l.contains("denied pid")
            && l.contains("(bill:101)")
            && l.contains("(permission)")
            && l.contains("service bill may not use domain Set of kvs")),
        "no denial line in the agent's log:\n{log}"
    );
    // A name the policy does not know.
    expect_refused(
        &run_in(
            &bill,
            &["sikker", "send", "--socket", s, "--to", "kvs:3:Nope", "x"],
        ),
        "unknown domain `Nope of kvs`",
    );
    // With a one-time permission for kvs:3 to answer bill:101.
    let o = run_in(
        &bill,
        &[
            "sikker",
            "send",
            "--socket",
            s,
            "--to",
            "kvs:3:Get",
            "--otp-for",
            "bill:101:Reply",
            "ping",
        ],
    );
    assert!(o.status.success(), "{:?}", text(&o));

    // Every spoof is refused.
    expect_refused(
        &run_in(
            &bill,
            &[
                "sikker",
                "send",
                "--socket",
                s,
                "--claim",
                "kvs:3",
                "--to",
                "kvs:3:Get",
                "forged",
            ],
        ),
        "the message claims to come from kvs:3, but its sender is bill:101",
    );
    expect_refused(
        &run_in(
            &other,
            &[
                "sikker",
                "send",
                "--socket",
                s,
                "--to",
                "kvs:3:Get",
                "other",
            ],
        ),
        "matches no process of the policy",
    );
    expect_refused(
        &run_in(
            &bill,
            &[
                "sikker",
                "send",
                "--socket",
                s,
                "--hand-to-child",
                "--to",
                "kvs:3:Get",
                "passed",
            ],
        ),
        "but pid",
    );
    let copy = dir.path().join("another-program");
    std::fs::copy(env!("CARGO_BIN_EXE_sidecore"), &copy).unwrap();
    expect_refused(
        &run_in(
            &bill,
            &[
                "sikker",
                "send",
                "--socket",
                s,
                "--exec-after-attach",
                copy.to_str().unwrap(),
                "--to",
                "kvs:3:Get",
                "execd",
            ],
        ),
        "its identity ended with the exec",
    );

    // kvs:3 got exactly the two permitted messages, from bill:101; the
    // second carried a one-time permission, which it used to answer.
    let k = kvs_rx.wait_with_output().unwrap();
    assert!(k.status.success(), "{:?}", text(&k));
    let got = lines(&k);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["from"], "bill:101");
    assert_eq!(got[0]["text"], "hello");
    assert_eq!(got[0]["domain"], "Get");
    assert!(got[0]["otp"].is_null());
    assert_eq!(got[1]["text"], "ping");
    let otp = got[1]["otp"]
        .as_u64()
        .expect("the second message carries an OTP");
    // bill:101 got the answer from kvs:3, naming itself as the requester.
    let b = bill_rx.wait_with_output().unwrap();
    assert!(b.status.success(), "{:?}", text(&b));
    let ans = lines(&b);
    assert_eq!(ans.len(), 1, "{ans:?}");
    assert_eq!(ans[0]["from"], "kvs:3");
    assert_eq!(ans[0]["text"], "pong");
    assert_eq!(ans[0]["domain"], "Reply");
    assert_eq!(ans[0]["requester"], "bill:101");
    // The permission was used: using it again is refused.
    expect_refused(
        &run_in(
            &kvs,
            &[
                "sikker",
                "reply",
                "--socket",
                s,
                "--otp",
                &otp.to_string(),
                "again",
            ],
        ),
        "one-time permission: process has no one-time permission with key",
    );
    // The agent's own /metrics tells the same story.
    let scrape = || common::http_get(&metrics, "/metrics");
    let delivered = "sidecore_sikker_messages_total{host=\"h1\",what=\"delivered\"}";
    assert!(
        wait_for(
            || common::sample(&scrape(), delivered).is_some_and(|v| v >= 3.0),
            5
        ),
        "ping, the second message and pong were delivered: {}",
        scrape()
    );
    let m = scrape();
    assert!(
        m.contains("sidecore_sikker_denials_total{host=\"h1\",kind="),
        "{m}"
    );
    assert!(
        m.contains("sidecore_sikker_attachments_total{host=\"h1\"}"),
        "{m}"
    );
    // No placement change came: applied and refused both read zero.
    for name in ["placement_updates", "placement_refused"] {
        let key = format!("sidecore_sikker_{name}_total{{host=\"h1\"}}");
        assert_eq!(common::sample(&m, &key), Some(0.0), "{key} in {m}");
    }
    common::promtool_ok(&m);
}

/// The last CPU this process may run on (`Cpus_allowed_list`, e.g. `0-1`).
fn last_allowed_cpu(status: &str) -> u32 {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    list.rsplit([',', '-']).next().unwrap().parse().unwrap()
}

#[test]
fn an_agent_on_a_core_of_its_own_busy_polls_there_and_a_cpu_it_may_not_use_is_refused() {
    let Some((_s, g)) = root_groups("sikker-core", &["a"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[service]]\nname = \"a\"\ndomains = [\"In\"]\n[[service.process]]\nid = 1\ncgroup = \"{}\"\n",
            g.path("a")
        ),
    )
    .unwrap();
    let placement = dir.path().join("placement.toml");
    std::fs::write(
        &placement,
        "[[host]]\nname = \"h1\"\nprocesses = [\"a:1\"]\n",
    )
    .unwrap();
    let sock = dir.path().join("agent.sock");
    let s = sock.to_str().unwrap();
    let agent = |cpu: &str| {
        let mut c = bin();
        c.args([
            "sikker", "agent", "--host", "h1", "--socket", s, "--core", cpu,
        ])
        .arg("--policy")
        .arg(&policy)
        .arg("--placement")
        .arg(&placement);
        c
    };
    // A CPU this process may not use: refused before anything starts.
    let o = agent("4096").output().unwrap();
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("--core 4096: this process may not run on CPU 4096 (it may use CPUs"),
        "{err}"
    );
    assert!(!sock.exists(), "a refused agent listened");

    let cpu = last_allowed_cpu(&std::fs::read_to_string("/proc/self/status").unwrap());
    let log = dir.path().join("agent.log");
    let a = Guard(
        agent(&cpu.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let busy = format!("busy-polling on CPU {cpu}");
    assert!(
        wait_for(
            || std::fs::read_to_string(&log).is_ok_and(|l| l.contains(&busy)),
            10
        ),
        "the agent never said it busy-polls: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Its loop (the main thread) is pinned to that CPU alone.
    let status = std::fs::read_to_string(format!("/proc/{}/status", a.0.id())).unwrap();
    assert_eq!(last_allowed_cpu(&status), cpu);
    assert!(
        status.contains(&format!("Cpus_allowed_list:\t{cpu}\n")),
        "{status}"
    );
    // And it serves: a message goes through with its derived identity.
    let procs = g.procs("a");
    let rx = recv_in(&procs, s, 1, 8000);
    std::thread::sleep(Duration::from_millis(300));
    let o = run_in(
        &procs,
        &["sikker", "send", "--socket", s, "--to", "a:1:In", "spun"],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let r = rx.wait_with_output().unwrap();
    assert!(r.status.success(), "{:?}", text(&r));
    let got = lines(&r);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0]["from"].as_str(), got[0]["text"].as_str()),
        (Some("a:1"), Some("spun"))
    );
}
