//! `sidecore sikker l4` end to end: the policy and the placement's L4
//! addresses drive the kernel's cgroup programs. As root, real processes in
//! real cgroup v2 groups connect over TCP on loopback: a permitted service
//! connects, another service and a process in no mapped cgroup get EPERM, a
//! cgroup made after the start is mapped when it appears, and the counters
//! come out as JSON, periodically and at SIGINT. Without root: a placement
//! with a malformed L4 address, and an unknown host, are refused with the
//! file and line.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use common::cgroups::{Groups, root_groups};
use common::*;

/// Connects from a new process in cgroup `procs` (bash's /dev/tcp): `Ok` if
/// connected, else bash's complaint.
fn connect_from(procs: &Path, port: u16) -> Result<(), String> {
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected",
            procs.display()
        ))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    if o.status.success() && out.contains("connected") {
        Ok(())
    } else {
        Err(err)
    }
}

fn policy(g: &Groups) -> String {
    format!(
        r#"
[[service]]
name = "kvs"
domains = ["Get"]
[[service.process]]
id = 3
cgroup = "{kvs}"
[[service.portal]]
name = "ForBill"
processes = [3]
domains = ["Get"]

[[service]]
name = "bill"
domains = ["Reply"]
[[service.process]]
id = 101
cgroup = "{bill}"
[[service.process]]
id = 102
cgroup = "{late}"

[[service]]
name = "eve"
[[service.process]]
id = 1
cgroup = "{eve}"

[[grant]]
from = "bill"
to = "kvs"
portal = "ForBill"

[[rate_limit]]
from = "bill"
to = "kvs"
gbps = 0.08
"#,
        kvs = g.path("kvs"),
        bill = g.path("bill"),
        late = g.path("late"),
        eve = g.path("eve"),
    )
}

/// Starts `sikker l4` attached at `top`; its stderr is collected as it comes.
fn start(pol: &Path, placement: &Path, top: &Path) -> (Guard, Arc<Mutex<String>>) {
    let l4 = ["l4", "--stats-ms", "200", "--cgroup"];
    spawn(&l4, top, pol, placement, Stdio::piped())
}

/// Starts `sikker agent --l4` attached at `top`; its stderr is collected.
fn start_agent(
    pol: &Path,
    placement: &Path,
    sock: &Path,
    top: &Path,
) -> (Guard, Arc<Mutex<String>>) {
    let sock = sock.to_str().unwrap();
    let agent = ["agent", "--l4", "--socket", sock, "--l4-cgroup"];
    spawn(&agent, top, pol, placement, Stdio::null())
}

/// `sidecore sikker ARGS… TOP --host h1 --policy POL --placement PLACEMENT`,
/// its stderr collected as it comes.
fn spawn(
    args: &[&str],
    top: &Path,
    pol: &Path,
    placement: &Path,
    stdout: Stdio,
) -> (Guard, Arc<Mutex<String>>) {
    let mut child = bin()
        .arg("sikker")
        .args(args)
        .arg(top)
        .args(["--host", "h1", "--policy"])
        .arg(pol)
        .arg("--placement")
        .arg(placement)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = collect_stderr(&mut child);
    (Guard(child), stderr)
}

/// The child's stderr, collected as it comes.
fn collect_stderr(child: &mut std::process::Child) -> Arc<Mutex<String>> {
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&stderr);
    let pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    stderr
}

/// The JSON lines the stopped child printed.
fn json_lines(child: &mut Guard) -> Vec<serde_json::Value> {
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.0.stdout.take().unwrap(), &mut out).unwrap();
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn l4_mode_maps_cgroups_refuses_connects_and_reports_counters() {
    let Some((_s, g)) = root_groups("l4", &["kvs", "bill", "eve", "other"]) else {
        return;
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let pol = dir.path().join("policy.toml");
    std::fs::write(&pol, policy(&g)).unwrap();
    let placement = dir.path().join("placement.toml");
    std::fs::write(
        &placement,
        format!(
            "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\", \"bill:101\", \"bill:102\", \"eve:1\"]\n\
             l4 = {{ \"kvs:3\" = \"127.0.0.1:{port}\" }}\n"
        ),
    )
    .unwrap();
    let top = g
        .procs("kvs")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let (mut child, stderr) = start(&pol, &placement, &top);
    let said = |what: &str| stderr.lock().unwrap().contains(what);
    assert!(
        wait_for(|| said("Ctrl-C stops it"), 20),
        "no summary:\n{}",
        stderr.lock().unwrap()
    );
    {
        let s = stderr.lock().unwrap();
        assert!(
            s.contains(&format!("destination  127.0.0.1:{port} → kvs:3")),
            "{s}"
        );
        assert!(
            s.contains(&format!("permit       bill → 127.0.0.1:{port}")),
            "{s}"
        );
        assert!(
            s.contains("rate         bill → kvs: 0.08 Gbps = 10000000 bytes/s, bucket 25000 bytes"),
            "{s}"
        );
        assert!(s.contains("not yet      bill:102"), "{s}");
        assert!(s.contains("3 cgroup(s), 1 destination(s)"), "{s}");
    }

    assert_eq!(connect_from(&g.procs("bill"), port), Ok(()));
    for who in ["eve", "other"] {
        let e = connect_from(&g.procs(who), port).unwrap_err();
        assert!(e.contains("Operation not permitted"), "{who}: {e}");
    }
    // A cgroup made after the start is mapped within a second or so.
    let late = g.procs("kvs").parent().unwrap().with_file_name("late");
    std::fs::create_dir(&late).unwrap();
    assert!(
        wait_for(|| said("mapped bill:102"), 5),
        "{}",
        stderr.lock().unwrap()
    );
    assert_eq!(connect_from(&late.join("cgroup.procs"), port), Ok(()));

    // SIGINT: the final counters, after the periodic ones.
    // SAFETY: kill(2) on our own child's pid, which it still is (not reaped).
    unsafe { libc::kill(i32::try_from(child.0.id()).unwrap(), libc::SIGINT) };
    let status = wait_exit(&mut child.0, 10).expect("sikker l4 stops on SIGINT");
    assert!(status.success(), "{}", stderr.lock().unwrap());
    let lines = json_lines(&mut child);
    assert!(lines.len() >= 2, "{lines:?}");
    assert_eq!(lines[0]["final"], false, "{lines:?}");
    let last = lines.last().unwrap();
    assert_eq!(last["final"], true, "{last}");
    let pair = |from: serde_json::Value, to: &str| {
        last["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["from"] == from && p["to"] == to)
            .cloned()
            .unwrap_or_else(|| panic!("no pair {from} → {to} in {last}"))
    };
    assert_eq!(pair("bill".into(), "kvs")["connects_allowed"], 2, "{last}");
    assert_eq!(pair("eve".into(), "kvs")["connects_denied"], 1, "{last}");
    assert_eq!(
        pair(serde_json::Value::Null, "kvs")["connects_denied"],
        1,
        "{last}"
    );
    assert_eq!(last["connects_paced"], 2, "{last}");
    // Its programs went with it: the refused cgroup connects again.
    assert_eq!(connect_from(&g.procs("eve"), port), Ok(()));
}

#[test]
fn a_malformed_l4_address_and_an_unknown_host_are_refused_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let pol = dir.path().join("policy.toml");
    std::fs::write(
        &pol,
        "[[service]]\nname = \"kvs\"\ndomains = [\"Get\"]\n[[service.process]]\nid = 3\ncgroup = \"/x\"\n",
    )
    .unwrap();
    let placement = dir.path().join("placement.toml");
    std::fs::write(
        &placement,
        "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\"]\nl4 = { \"kvs:3\" = \"10.9.0.300:8080\" }\n",
    )
    .unwrap();
    let l4 = |host: &str| {
        bin()
            .args(["sikker", "l4", "--host", host, "--policy"])
            .arg(&pol)
            .arg("--placement")
            .arg(&placement)
            .output()
            .unwrap()
    };
    let o = l4("h1");
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("placement.toml:4:") && err.contains("`10.9.0.300:8080` is not IP:PORT"),
        "{err}"
    );
    assert!(err.contains("1 problem(s) found"), "{err}");

    std::fs::write(
        &placement,
        "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\"]\nl4 = { \"kvs:3\" = \"10.9.0.3:8080\" }\n",
    )
    .unwrap();
    let o = l4("h7");
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("host `h7` is not in the placement (its hosts: h1)"),
        "{err}"
    );
}

/// `sidecore sikker agent --l4`: the agent feeds L4 mode from its policy and
/// its placement as they change. eve may not connect to kvs's L4 address;
/// the placement moves that address to another port, and within a bound the
/// new port is refused to eve and the old one no longer is; the policy file
/// is rewritten to grant eve a portal, and within a bound eve connects; a
/// broken policy is refused and the maps keep the last good one.
#[test]
fn the_agent_feeds_l4_mode_and_a_live_policy_update_reaches_plain_tcp() {
    let Some((_s, g)) = root_groups("l4-agent", &["kvs", "bill", "eve"]) else {
        return;
    };
    let listen = || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                drop(s);
            }
        });
        port
    };
    let (first, port) = (listen(), listen());
    let dir = tempfile::tempdir().unwrap();
    let pol = dir.path().join("policy.toml");
    let base = policy(&g);
    std::fs::write(&pol, &base).unwrap();
    let placement = dir.path().join("placement.toml");
    let place = |at: u16| {
        std::fs::write(
            &placement,
            format!(
                "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\", \"bill:101\", \"eve:1\"]\n\
                 l4 = {{ \"kvs:3\" = \"127.0.0.1:{at}\" }}\n"
            ),
        )
        .unwrap();
    };
    place(first);
    let top = g
        .procs("kvs")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let (_child, stderr) = start_agent(&pol, &placement, &dir.path().join("agent.sock"), &top);
    let said = |what: &str| stderr.lock().unwrap().contains(what);
    assert!(
        wait_for(
            || said("Ctrl-C stops it") && said("sikker agent for host h1"),
            20
        ),
        "{}",
        stderr.lock().unwrap()
    );
    assert_eq!(connect_from(&g.procs("bill"), first), Ok(()));
    let e = connect_from(&g.procs("eve"), first).unwrap_err();
    assert!(e.contains("Operation not permitted"), "{e}");
    assert_eq!(connect_from(&g.procs("eve"), port), Ok(()), "not kvs's yet");
    // kvs moves its L4 address: the maps follow the placement.
    place(port);
    assert!(
        wait_for(
            || connect_from(&g.procs("eve"), port)
                .is_err_and(|e| e.contains("Operation not permitted")),
            10
        ),
        "{}",
        stderr.lock().unwrap()
    );
    assert_eq!(
        connect_from(&g.procs("eve"), first),
        Ok(()),
        "no longer kvs's"
    );
    assert_eq!(connect_from(&g.procs("bill"), port), Ok(()));
    assert!(
        said("maps follow the new placement's L4 addresses"),
        "{}",
        stderr.lock().unwrap()
    );
    // Grant eve the portal: the agent applies it, and the maps follow.
    std::fs::write(
        &pol,
        format!("{base}\n[[grant]]\nfrom = \"eve\"\nto = \"kvs\"\nportal = \"ForBill\"\n"),
    )
    .unwrap();
    assert!(
        wait_for(|| connect_from(&g.procs("eve"), port).is_ok(), 10),
        "{}",
        stderr.lock().unwrap()
    );
    assert!(
        said("maps follow the new policy"),
        "{}",
        stderr.lock().unwrap()
    );
    // A broken policy: refused, and eve still connects (the last good one holds).
    std::fs::write(&pol, format!("{base}\n[[grant]]\nfrom = \"nobody\"\n")).unwrap();
    assert!(
        wait_for(|| said("policy.toml:"), 10),
        "{}",
        stderr.lock().unwrap()
    );
    assert_eq!(connect_from(&g.procs("eve"), port), Ok(()));
}

/// A port on loopback that accepts and drops every connection.
fn listen() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s);
        }
    });
    port
}

/// The standalone `sikker l4` follows its files: kvs's L4 address moved in
/// the placement is enforced at the new port and freed at the old; a grant
/// added to the policy lets eve connect; a placement that does not parse is
/// refused with its location and the last good pair keeps enforcing.
#[test]
fn the_standalone_l4_mode_follows_its_policy_and_placement_files() {
    let Some((_s, g)) = root_groups("l4-files", &["kvs", "bill", "late", "eve"]) else {
        return;
    };
    let (first, port) = (listen(), listen());
    let dir = tempfile::tempdir().unwrap();
    let (pol, placement) = (
        dir.path().join("policy.toml"),
        dir.path().join("placement.toml"),
    );
    let base = policy(&g);
    std::fs::write(&pol, &base).unwrap();
    let place = |l4: &str| {
        let text = format!(
            "[[host]]\nname = \"h1\"\nprocesses = [\"kvs:3\", \"bill:101\", \"eve:1\"]\nl4 = {{ {l4} }}\n"
        );
        std::fs::write(&placement, text).unwrap();
    };
    place(&format!("\"kvs:3\" = \"127.0.0.1:{first}\""));
    let top = g
        .procs("kvs")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let (_child, stderr) = start(&pol, &placement, &top);
    let said = |what: &str| stderr.lock().unwrap().contains(what);
    assert!(
        wait_for(|| said("Ctrl-C stops it"), 20),
        "{}",
        stderr.lock().unwrap()
    );
    let eve = g.procs("eve");
    let refused =
        |p: u16| connect_from(&eve, p).is_err_and(|e| e.contains("Operation not permitted"));
    assert!(refused(first));
    assert_eq!(connect_from(&eve, port), Ok(()), "not kvs's yet");
    // kvs moves: the maps follow the placement file.
    place(&format!("\"kvs:3\" = \"127.0.0.1:{port}\""));
    assert!(wait_for(|| refused(port), 10), "{}", stderr.lock().unwrap());
    assert_eq!(connect_from(&eve, first), Ok(()), "no longer kvs's");
    assert!(said("maps follow the new placement's L4 addresses"));
    // A grant for eve: the maps follow the policy file.
    std::fs::write(
        &pol,
        format!("{base}\n[[grant]]\nfrom = \"eve\"\nto = \"kvs\"\nportal = \"ForBill\"\n"),
    )
    .unwrap();
    assert!(
        wait_for(|| connect_from(&eve, port).is_ok(), 10),
        "{}",
        stderr.lock().unwrap()
    );
    // A placement naming a process the policy lacks: refused, located, and
    // the last good pair stays.
    place("\"kvs:9\" = \"127.0.0.1:1\"");
    assert!(
        wait_for(|| said("placement.toml:4:"), 10),
        "{}",
        stderr.lock().unwrap()
    );
    assert!(said("the last good pair stays"));
    assert_eq!(connect_from(&eve, port), Ok(()));
    assert!(connect_from(&g.procs("bill"), port).is_ok());
}
