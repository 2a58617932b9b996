//! The `/metrics` endpoints of the services that run as their own commands,
//! each scraped while it works on real input and checked by promtool:
//! `tcps serve` answering HTTP, `orion watch` watching this machine, and
//! `filewall run` in front of a real nfs-ganesha with libnfs clients. (The
//! Sikker agent's endpoint is checked in `sikker_agent.rs`, beside its
//! traffic.)

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

#[path = "../../filewall/tests/common/mod.rs"]
mod fw;

use std::process::Stdio;
use std::time::Duration;

use common::{Guard, bin, free_port, http_get, promtool_ok, sample, serial, wait_for};

#[test]
fn tcps_serve_exports_its_ppes_and_queues() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("index.html"), "hello\n").unwrap();
    let (port, metrics) = (free_port(), format!("127.0.0.1:{}", free_port()));
    let _srv = Guard(
        bin()
            .args(["tcps", "serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--root")
            .arg(&root)
            .args([
                "--allowed",
                "1",
                "--master",
                "1",
                "--app-cpu",
                "0",
                "--for",
                "30s",
            ])
            .arg("--control")
            .arg(dir.path().join("tcps.sock"))
            .args(["--metrics", &metrics])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| !http_get(&metrics, "/metrics").is_empty(), 10));
    let addr = format!("127.0.0.1:{port}");
    for _ in 0..5 {
        assert!(http_get(&addr, "/index.html").contains("hello"));
    }
    let m = http_get(&metrics, "/metrics");
    let accepted = sample(
        &m,
        "sidecore_tcps_accepted_total{ppe=\"1\",master=\"true\"}",
    );
    assert!(accepted.is_some_and(|v| v >= 5.0), "{m}");
    assert!(m.contains("sidecore_tcps_receive_queue_full_total"), "{m}");
    promtool_ok(&m);
    assert_eq!(
        http_get(&metrics, "/nope").trim(),
        "no such page; try /metrics"
    );
    daemon_scrapes_tcps(dir.path(), &metrics);
}

/// A daemon told of the service scrapes it, shows it and says it is up; one
/// that is not there is shown down.
fn daemon_scrapes_tcps(dir: &std::path::Path, metrics: &str) {
    let gone = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let _d = Guard(
        bin()
            .arg("daemon")
            .arg("--socket")
            .arg(dir.join("d.sock"))
            .args(["--http", &http, "--service", &format!("tcps={metrics}")])
            .args(["--service", &format!("gone={gone}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = || serde_json::from_str::<serde_json::Value>(&http_get(&http, "/api/status")).ok();
    assert!(
        wait_for(
            || status().is_some_and(|s| s["services"][0]["up"] == true),
            10
        ),
        "{:?}",
        status()
    );
    let s = status().unwrap();
    assert_eq!(s["services"][0]["name"], "tcps");
    assert!(
        s["services"][0]["samples"]
            .to_string()
            .contains("sidecore_tcps_accepted_total"),
        "{s}"
    );
    assert_eq!(s["services"][1]["up"], false);
    let dm = http_get(&http, "/metrics");
    assert!(
        dm.contains(&format!(
            "sidecore_service_up{{service=\"tcps\",addr=\"{metrics}\"}} 1"
        )),
        "{dm}"
    );
    assert!(
        dm.contains(&format!(
            "sidecore_service_up{{service=\"gone\",addr=\"{gone}\"}} 0"
        )),
        "{dm}"
    );
    // Its capability panel (TCPServers: the PPE and its queues), and its key
    // families relayed with its name.
    let cap = &s["services"][0]["capability"];
    assert_eq!(cap["kind"], "tcps", "{s}");
    let keys: Vec<&str> = cap["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["key"].as_str())
        .collect();
    for k in ["PPE 1", "PPE 1: connections", "PPE 1: receive queue full"] {
        assert!(keys.contains(&k), "{k} not in {keys:?}");
    }
    let relayed = sample(
        &dm,
        "sidecore_tcps_accepted_total{service=\"tcps\",ppe=\"1\",master=\"true\"}",
    );
    assert!(relayed.is_some_and(|v| v >= 5.0), "{dm}");
    promtool_ok(&dm);
}

#[test]
fn orion_watch_exports_sensors_and_liveness() {
    let _s = serial();
    let metrics = format!("127.0.0.1:{}", free_port());
    let _w = Guard(
        bin()
            .args(["orion", "watch", "--seconds", "20", "--metrics", &metrics])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let fetches = || {
        sample(
            &http_get(&metrics, "/metrics"),
            "sidecore_orion_fetches_total{target=\"host\"}",
        )
    };
    assert!(wait_for(|| fetches().is_some_and(|v| v > 0.0), 10));
    let first = fetches().unwrap_or(0.0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        fetches().unwrap_or(0.0) > first,
        "the watch stopped fetching"
    );
    let m = http_get(&metrics, "/metrics");
    // The machine is alive: its context switches keep moving.
    assert_eq!(
        sample(
            &m,
            "sidecore_orion_target_state{target=\"host\",state=\"alive\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert!(
        sample(
            &m,
            "sidecore_orion_liveness_sensor{target=\"host\",sensor=\"stat.ctxt\"}"
        )
        .is_some_and(|v| v > 0.0),
        "{m}"
    );
    promtool_ok(&m);
    let o = common::run(&[
        "orion",
        "status",
        "--json",
        "--dir",
        "/nonexistent-orion-dir",
    ]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["boxes"], serde_json::json!([]), "{j}");
}

#[test]
fn filewall_run_exports_operations_and_latency() {
    let _s = serial();
    let Some(g) = fw::ganesha::Ganesha::start() else {
        return;
    };
    std::fs::write(g.export.join("f.txt"), "through filewall\n").unwrap();
    let (nfs, mnt) = (free_port(), free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let _p = Guard(
        bin()
            .args([
                "filewall",
                "run",
                "--nfs-listen",
                &format!("127.0.0.1:{nfs}"),
            ])
            .args(["--mount-listen", &format!("127.0.0.1:{mnt}")])
            .args(["--server-nfs", &g.nfs_addr().to_string()])
            .args(["--server-mount", &g.mount_addr().to_string()])
            .arg("--control")
            .arg(dir.path().join("fw.sock"))
            .args(["--metrics", &metrics])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(|| !http_get(&metrics, "/metrics").is_empty(), 10));
    let url = fw::ganesha::nfs_url(&g.export, "f.txt", nfs, mnt);
    let out = fw::ganesha::libnfs("nfs-cat", &[&url]);
    assert!(
        out.status.success(),
        "nfs-cat: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        g.log_tail()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through filewall\n");
    let m = http_get(&metrics, "/metrics");
    let reads = sample(
        &m,
        "sidecore_filewall_operations_total{proxy=\"filewall\",op=\"NFSv3 Read\",kind=\"call\"}",
    );
    assert!(reads.is_some_and(|v| v >= 1.0), "{m}");
    let lat = sample(
        &m,
        "sidecore_filewall_operation_latency_seconds_count{proxy=\"filewall\",op=\"NFSv3 Read\"}",
    );
    assert!(lat.is_some_and(|v| v >= 1.0), "{m}");
    assert!(
        m.contains("sidecore_filewall_operation_latency_seconds_bucket{le=\"+Inf\""),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "sidecore_filewall_denials_total{proxy=\"filewall\",reason=\"refused\"}"
        ),
        Some(0.0),
        "{m}"
    );
    promtool_ok(&m);
    // The same counters through the control socket, as JSON and as text.
    let ctl = dir.path().join("fw.sock");
    let o = common::run(&[
        "filewall",
        "stats",
        "--json",
        "--control",
        ctl.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{:?}", common::text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["proxy"], "filewall");
    assert!(
        v[0]["ops"]["NFSv3 Read"]["calls"].as_u64().unwrap() >= 1,
        "{v}"
    );
    assert!(
        v[0]["latency"]["NFSv3 Read"]["count"].as_u64().unwrap() >= 1,
        "{v}"
    );
    let o = common::run(&["filewall", "stats", "--control", ctl.to_str().unwrap()]);
    assert!(
        common::text(&o).0.contains("[filewall] op NFSv3 Read"),
        "{:?}",
        common::text(&o)
    );
}

#[path = "../../orion/benches/common/mod.rs"]
mod orion_cg;

/// `orion watch --heal` on `cg` (sparing `sleep`) with `extra` flags and its
/// own `--metrics`, once that answers. Not in a Guard: its output is read at
/// the end, and `--seconds` ends it anyway.
fn healing_watch(cg: &orion_cg::TestCgroup, extra: &[&str]) -> (std::process::Child, String) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let watch = bin()
        .args(["orion", "watch", "--cgroup"])
        .arg(&cg.v2)
        .args(["--heal", "--whitelist", "sleep", "--metrics", &metrics])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(|| !http_get(&metrics, "/metrics").is_empty(), 10));
    (watch, metrics)
}

/// True once `orion watch --metrics` at `metrics` counts a repair in `cg`.
fn repaired(metrics: &str, cg: &orion_cg::TestCgroup) -> bool {
    sample(
        &http_get(metrics, "/metrics"),
        &format!(
            "sidecore_orion_repairs_total{{target=\"{}\"}}",
            cg.v2.display()
        ),
    )
    .is_some_and(|v| v >= 1.0)
}

#[test]
fn orion_watch_heals_a_memory_hog_and_spares_bystanders() {
    let _s = serial();
    if let Some(why) = orion_cg::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    // The kernel's own limit is far above the healer's, so Orion acts first.
    let cg = orion_cg::TestCgroup::new("watch-hog", 256, 1 << 30);
    let mut bystander = cg.spawn(&["sleep", "30"]);
    let (mut watch, metrics) = healing_watch(&cg, &["--memory-limit", "128MiB", "--seconds", "15"]);
    let mut hog = cg.spawn(&["perl", "-e", "my $x = 'x' x (150 << 20); sleep 30"]);
    let t0 = std::time::Instant::now();
    assert!(
        wait_for(|| repaired(&metrics, &cg), 10),
        "{}",
        http_get(&metrics, "/metrics")
    );
    eprintln!("repaired after {:?}", t0.elapsed());
    let hog_pid = hog.id();
    assert!(
        wait_for(|| !cg.procs().contains(&hog_pid), 5),
        "the hog still runs"
    );
    let _ = hog.wait();
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the whitelisted bystander was killed"
    );
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("REPAIRED memory hog"), "{text}");
    let _ = bystander.kill();
    cg.empty();
}

#[test]
fn orion_watch_repairs_a_c_fork_bomb() {
    let _s = serial();
    if let Some(why) = orion_cg::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    // A compiled bomb forks far faster than a shell one; pids.max caps it.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("bomb.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\nint main(void) { for (;;) { fork(); usleep(1000); } }\n",
    )
    .unwrap();
    let exe = dir.path().join("bomb");
    let cc = std::process::Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc (clang or gcc; scripts/setup.sh installs clang)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let cg = orion_cg::TestCgroup::new("watch-cbomb", 300, 1 << 30);
    let mut keeper = cg.spawn(&["sleep", "30"]);
    let (mut watch, metrics) = healing_watch(&cg, &["--seconds", "20"]);
    let mut bomb = cg.spawn(&[exe.to_str().unwrap()]);
    assert!(
        wait_for(|| repaired(&metrics, &cg), 10),
        "{}",
        http_get(&metrics, "/metrics")
    );
    let keeper_pid = keeper.id();
    assert!(
        wait_for(|| cg.procs() == vec![keeper_pid], 10),
        "left in the cgroup: {:?}",
        cg.procs()
    );
    let _ = bomb.wait();
    assert!(
        keeper.try_wait().unwrap().is_none(),
        "the whitelisted keeper was killed"
    );
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("REPAIRED fork bomb"), "{text}");
    let _ = keeper.kill();
    cg.empty();
}
