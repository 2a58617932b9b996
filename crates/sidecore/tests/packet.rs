//! The kernel PE and the SCIRON firewall through the `sidecore` binary:
//! `fw analyze|check` on known rule sets, `testbed up|status|down` leaving
//! nothing behind, and a firewall deployed by a background daemon onto the
//! kernel PE (XDP), shown by `ps`, reloaded live by `fw load` and unloaded by
//! `down`. The testbed parts run as root (CI does).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code

mod common;

use sidecore_testbed::testing::{Cleanup, root};
use std::path::{Path, PathBuf};

use common::testbed::{probe, xdp_attached};
use common::{DaemonGuard, run, serial, text};

fn repo(p: &str) -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../..")
        .join(p)
}

/// Serialises the test, and removes its testbed (prefix `tag` + pid) even if it
/// fails; `None` when not root (see `root`).
fn testbed_test(tag: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Cleanup, String)> {
    if !root() {
        return None;
    }
    let g = serial();
    let prefix = format!("{tag}{}", std::process::id());
    Some((g, Cleanup(prefix.clone()), prefix))
}

#[test]
fn analyze_names_every_anomaly_of_the_papers_policy_with_lines() {
    let fig2 = repo("examples/firewall/fig2.rules");
    let o = run(&["fw", "analyze", fig2.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let has = |anomaly: &str, first: u64, second: u64| {
        v.as_array().unwrap().iter().any(|f| {
            f["anomaly"] == anomaly
                && f["first"]["number"] == first
                && f["second"]["number"] == second
                // Table layout: rule n is on line n + 1 (after the header).
                && f["first"]["line"] == first + 1
                && f["second"]["line"] == second + 1
        })
    };
    assert!(has("shadowing", 3, 4), "{v:#}");
    assert!(has("redundancy", 6, 7), "{v:#}");
    assert!(has("generalization", 1, 2), "{v:#}");
    assert!(has("correlation", 1, 3), "{v:#}");
    // Text: file:line, level and both rules named.
    let o = run(&["fw", "analyze", fig2.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(
        out.contains(
            "fig2.rules:5: error: shadowing: rule 4 (line 5) is shadowed by rule 3 (line 4)"
        ),
        "{out}"
    );
    assert!(out.contains("12 rules, 16 findings (5 errors)"), "{out}");
}

#[test]
fn check_fails_on_errors_and_bad_files_with_their_location() {
    let o = run(&[
        "fw",
        "check",
        repo("examples/firewall/web.toml").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(text(&o).0.contains("3 rules, 0 findings"), "{}", text(&o).0);
    // Shadowed and redundant rules make the policy wrong.
    let o = run(&[
        "fw",
        "check",
        repo("examples/firewall/fig2.rules").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.rules");
    std::fs::write(
        &bad,
        "1 tcp any any 10.0.0.1 80 accept\n2 tcp 10.0.0.300 any any 80 deny\n",
    )
    .unwrap();
    let o = run(&["fw", "check", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = text(&o).1;
    assert!(
        err.contains("bad.rules:2:7") && err.contains("10.0.0.300"),
        "{err}"
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[rule]]\nproto = \"tcp\"\naction = \"maybe\"\n").unwrap();
    let o = run(&["fw", "check", bad.to_str().unwrap()]);
    let err = text(&o).1;
    assert!(
        !o.status.success() && err.contains("bad.toml:3") && err.contains("maybe"),
        "{err}"
    );
    let o = run(&["fw", "check", "/nonexistent/rules.toml"]);
    assert!(
        text(&o)
            .1
            .contains("cannot read rule file /nonexistent/rules.toml")
    );
}

#[test]
fn testbed_up_status_down_leaves_nothing() {
    let Some((_g, _bed, prefix)) = testbed_test("sct") else {
        return;
    };
    let o = run(&["testbed", "up", "--prefix", &prefix, "--json"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hosts"].as_array().unwrap().len(), 3, "{v:#}");
    // Up twice is refused; the first stays.
    let o = run(&["testbed", "up", "--prefix", &prefix]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("already up"), "{}", text(&o).1);
    let o = run(&["testbed", "status", "--prefix", &prefix]);
    let (out, _) = text(&o);
    assert!(
        o.status.success() && out.contains(&format!("{prefix}-middlebox")),
        "{out}"
    );
    assert!(out.contains("10.201.1.2/24"), "{out}");
    let o = run(&["testbed", "status", "--prefix", &prefix, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let spaces = j.as_array().unwrap();
    assert_eq!(spaces.len(), 3, "{j:#}");
    assert!(
        spaces
            .iter()
            .any(|n| n["namespace"] == format!("{prefix}-middlebox")),
        "{j:#}"
    );
    assert!(j.to_string().contains("10.201.1.2/24"), "{j:#}");
    let o = run(&["testbed", "down", "--prefix", &prefix]);
    assert!(o.status.success(), "{}", text(&o).1);
    let names: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(names.is_empty(), "{names:?}");
    let o = run(&["testbed", "status", "--prefix", &prefix]);
    assert_eq!(o.status.code(), Some(1));
    // A bad topology is refused with its location, and nothing is made.
    let dir = tempfile::tempdir().unwrap();
    let topo = dir.path().join("t.toml");
    std::fs::write(&topo, "[[link]]\na = \"x\"\nb = \"x\"\n").unwrap();
    let o = run(&[
        "testbed",
        "up",
        "--prefix",
        &prefix,
        "--topology",
        topo.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("t.toml"), "{}", text(&o).1);
    assert_eq!(
        run(&["testbed", "status", "--prefix", &prefix])
            .status
            .code(),
        Some(1)
    );
}

/// A manifest of one firewall offcode that may go to the kernel (XDP, generic
/// mode) or stay on the host, filtering the middlebox of testbed `prefix`.
fn fw_manifest(dir: &Path, prefix: &str, rules: &Path) -> PathBuf {
    let manifest = dir.join("fw.toml");
    std::fs::write(
        &manifest,
        format!(
            r#"[app]
name = "fw"

[[offcode]]
name = "firewall"
id = "1f6a2c3e-8d41-4b7a-9e55-3c0d2a1b4f02"
impl = "firewall"
params = {{ rules = "{}", netns = "{prefix}-middlebox", ingress = "to-client", xdp_mode = "generic" }}

  [[offcode.target]]
  kind = "kernel"

  [[offcode.target]]
  kind = "host"
"#,
            rules.display()
        ),
    )
    .unwrap();
    manifest
}

#[test]
fn a_daemon_killed_outright_leaves_no_program_attached() {
    let Some((_g, _bed, prefix)) = testbed_test("sck") else {
        return;
    };
    assert!(
        run(&["testbed", "up", "--prefix", &prefix])
            .status
            .success()
    );
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("a.rules");
    std::fs::write(&rules, "1 udp any any 10.201.1.2 5000 accept\n").unwrap();
    let manifest = fw_manifest(dir.path(), &prefix, &rules);
    let sock = dir.path().join("d.sock");
    let s = sock.to_str().unwrap();
    let mut daemon = common::Guard(
        common::bin()
            .args(["daemon", "--socket", s])
            .spawn()
            .unwrap(),
    );
    assert!(common::wait_for(|| sock.exists(), 10));
    let o = run(&["up", "-d", manifest.to_str().unwrap(), "--socket", s]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(common::wait_for(|| xdp_attached(&prefix), 10));
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5000]);
    // SIGKILL: no clean-up code runs; the kernel closes the daemon's BPF link.
    daemon.0.kill().unwrap();
    daemon.0.wait().unwrap();
    assert!(
        common::wait_for(|| !xdp_attached(&prefix), 5),
        "XDP still attached"
    );
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5000, 5001]);
}

#[test]
fn a_daemon_runs_the_firewall_on_the_kernel_reloads_it_live_and_unloads_it() {
    let Some((_g, _bed, prefix)) = testbed_test("scd") else {
        return;
    };
    assert!(
        run(&["testbed", "up", "--prefix", &prefix])
            .status
            .success()
    );
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("a.rules");
    std::fs::write(&rules, "1 udp any any 10.201.1.2 5000 accept\n").unwrap();
    let manifest = fw_manifest(dir.path(), &prefix, &rules);
    // The layout puts it on the kernel.
    let o = run(&["layout", manifest.to_str().unwrap()]);
    assert!(
        text(&o).0.contains("firewall         → kernel"),
        "{}",
        text(&o).0
    );

    let sock = dir.path().join("d.sock");
    let s = sock.to_str().unwrap();
    let _daemon = DaemonGuard(sock.clone());
    let o = run(&["up", "-d", manifest.to_str().unwrap(), "--socket", s]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(common::wait_for(|| xdp_attached(&prefix), 10));
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5000]);
    let ps = run(&["ps", "--json", "--socket", s]);
    let v: serde_json::Value = serde_json::from_slice(&ps.stdout).unwrap();
    assert_eq!(v[0]["offcodes"][0]["pe"], "kernel", "{v:#}");
    assert_eq!(v[0]["offcodes"][0]["state"], "running", "{v:#}");

    // Live reload: 5001 now, not 5000; the program stays attached.
    let b = dir.path().join("b.rules");
    std::fs::write(&b, "1 udp any any 10.201.1.2 5001 accept\n").unwrap();
    let o = run(&[
        "fw",
        "load",
        b.to_str().unwrap(),
        "--app",
        "fw",
        "--socket",
        s,
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(
        text(&o).0.contains("fw/firewall: loaded 1 rules"),
        "{}",
        text(&o).0
    );
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5001]);
    // A bad file is refused before it reaches the daemon; the rules in force stay.
    let bad = dir.path().join("bad.rules");
    std::fs::write(&bad, "1 udp any any 10.201.1.2 99999 accept\n").unwrap();
    let o = run(&[
        "fw",
        "load",
        bad.to_str().unwrap(),
        "--app",
        "fw",
        "--socket",
        s,
    ]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("bad.rules:1"), "{}", text(&o).1);
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5001]);
    // Unknown app or offcode: said so.
    let o = run(&[
        "fw",
        "load",
        b.to_str().unwrap(),
        "--app",
        "nope",
        "--socket",
        s,
    ]);
    assert!(text(&o).1.contains("no app `nope`"), "{}", text(&o).1);
    let o = run(&[
        "fw",
        "load",
        b.to_str().unwrap(),
        "--app",
        "fw",
        "--offcode",
        "x",
        "--socket",
        s,
    ]);
    assert!(text(&o).1.contains("has no offcode `x`"), "{}", text(&o).1);

    // down unloads it: nothing attached, traffic flows unfiltered.
    let o = run(&["down", "--daemon", "--socket", s]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(!xdp_attached(&prefix));
    assert_eq!(probe(&prefix, &[5000, 5001]), vec![5000, 5001]);
}

#[test]
fn the_firewall_demo_measures_what_it_claims() {
    let Some((_g, _bed, prefix)) = testbed_test("scm") else {
        return;
    };
    let o = run(&[
        "demo",
        "firewall",
        "--seconds",
        "0.3",
        "--rate-pps",
        "20000",
        "--json",
        "--prefix",
        &prefix,
        "--firewalls",
        "xdp,user-space,nftables,none",
        "--discard",
        "100,50",
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows.len(), 8);
    let row = |fw: &str, discard: u64| {
        rows.iter()
            .find(|r| r["firewall"] == fw && r["discard_pct"] == discard)
            .unwrap()
    };
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
    for fw in ["xdp", "user-space", "nftables", "none"] {
        for d in [100, 50] {
            let r = row(fw, d);
            // The offered load is the one asked for.
            assert!((f(r, "offered_pps") - 20000.0).abs() < 3000.0, "{r}");
            assert!(f(r, "cpu_ns_per_packet") > 0.0, "{r}");
            // The generator's report: Mb/s are the frames' bits, its departures
            // are on average one period apart, its CPU share is a share.
            let mbps = f(r, "offered_pps") * 64.0 * 8.0 / 1e6;
            assert!((f(r, "offered_mbps") - mbps).abs() < 0.01 * mbps, "{r}");
            let period_ns = 1e9 / f(r, "offered_pps");
            assert!(
                (f(r, "generator_iat_mean_ns") - period_ns).abs() < 0.2 * period_ns,
                "{r}"
            );
            assert!(f(r, "generator_iat_std_ns") >= 0.0, "{r}");
            let cpu = f(r, "generator_cpu_pct");
            assert!(cpu > 0.0 && cpu <= 105.0, "{r}");
            assert!(
                ["af_xdp", "af_xdp_zerocopy", "af_packet"]
                    .contains(&r["generator_path"].as_str().unwrap()),
                "{r}"
            );
            let share = f(r, "delivered_pps") / f(r, "offered_pps");
            match (fw, d) {
                // A firewall that denies everything delivers nothing.
                (_, 100) if fw != "none" => assert_eq!(f(r, "delivered_pps"), 0.0, "{r}"),
                // The user-space forwarder may lose accepted frames under
                // load (its socket overflows, counted by the kernel), but it
                // never delivers a denied one: at most half, and some.
                ("user-space", 50) => assert!(
                    share > 0.0 && share <= 0.55,
                    "user-space at 50%: delivered share {share}: {r}"
                ),
                _ => {
                    // The receiver keeps up at this rate: everything accepted
                    // arrives.
                    let want = if fw == "none" { 1.0 } else { 0.5 };
                    assert!(
                        (share - want).abs() < 0.1,
                        "{fw} at {d}%: delivered share {share}: {r}"
                    );
                }
            }
            if f(r, "delivered_pps") > 0.0 {
                assert!(f(r, "arrival_iat_mean_ns") > 0.0, "{r}");
            }
        }
    }
    assert_eq!(row("xdp", 100)["pe"], "kernel");
    assert!(
        row("user-space", 100)["pe"]
            .as_str()
            .unwrap()
            .starts_with("core:"),
        "{}",
        row("user-space", 100)
    );
    assert_eq!(row("nftables", 100)["pe"], "host");
    // The demo removes its testbed.
    assert_eq!(
        run(&["testbed", "status", "--prefix", &prefix])
            .status
            .code(),
        Some(1)
    );
}
