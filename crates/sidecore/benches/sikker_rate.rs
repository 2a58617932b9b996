//! SE-TRE on real time, measured: three `sidecore sikker agent`s in three
//! network namespaces, linked over mutual TLS, hold `src → dst` at 4 MB/s while
//! senders in three cgroups offer load in RateSim-like phases (all three, all
//! on one, on the other two, all three). The receiver counts bytes per 50 ms.
//! Per phase it reports the steady aggregate, the time until the aggregate
//! (over a sliding 250 ms) stays within 2% of the limit, and the overshoot
//! (the largest sliding 250 ms aggregate above the limit). Beside each, the
//! same code on simulated time (`sikker-agent::rate::sim`: the same agents'
//! rate control with a 50 µs network and no CPU noise) — the prediction.
//!
//! Run (as root): `cargo bench -p sidecore --bench sikker_rate`.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // benchmark code: a failed unwrap is a failed run

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::cgroups::*;
use common::*;
use sidecore_sikker_agent::rate::sim::Sim;
use sidecore_sikker_policy::{Nos, parse_placement, parse_policy};
use sidecore_testbed::Testbed;
use sidecore_testbed::topology::{HostSpec, LinkSpec, Topology};

const LIMIT_BPS: f64 = 4_000_000.0;
const SIZE: usize = 8192;
const WIN_MS: u128 = 50;
const SLIDE: usize = 5; // 5 × 50 ms = 250 ms
const PHASE_MS: u64 = 3000;
const PORT: u16 = 7411;

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Bed(Testbed);
impl Drop for Bed {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

fn policy_text(g: Option<&Groups>) -> String {
    let cg = |s: &str| g.map_or_else(|| format!("/none/{s}"), |g| g.path(s));
    format!(
        "[[service]]\nname = \"src\"\n[[service.process]]\nid = 0\ncgroup = \"{}\"\n[[service.process]]\nid = 1\ncgroup = \"{}\"\n[[service.process]]\nid = 2\ncgroup = \"{}\"\n\
         [[service]]\nname = \"dst\"\ndomains = [\"In\"]\n[[service.process]]\nid = 9\ncgroup = \"{}\"\n\
         [[grant]]\nfrom = \"src\"\nto = \"dst\"\nprocesses = [9]\ndomains = [\"In\"]\n\
         [[rate_limit]]\nfrom = \"src\"\nto = \"dst\"\ngbps = 0.032\nbucket_bytes = 32768\n",
        cg("s0"),
        cg("s1"),
        cg("s2"),
        cg("sink")
    )
}

const PLACEMENT: &str = "[[host]]\nname = \"h0\"\nprocesses = [\"src:0\", \"dst:9\"]\n[[host]]\nname = \"h1\"\nprocesses = [\"src:1\"]\n[[host]]\nname = \"h2\"\nprocesses = [\"src:2\"]\n";

/// (steady aggregate, convergence ms, overshoot) of one phase's 50-ms windows.
fn metrics(w: &[f64]) -> (f64, Option<u128>, f64) {
    let per_win = LIMIT_BPS * WIN_MS as f64 / 1000.0;
    let slide: Vec<f64> = w
        .windows(SLIDE)
        .map(|x| x.iter().sum::<f64>() / (per_win * SLIDE as f64))
        .collect();
    let steady_from = w.len() / 2;
    let steady = w[steady_from..].iter().sum::<f64>() / (per_win * (w.len() - steady_from) as f64);
    // The first sliding window from which every later one is within 2%.
    let conv = (0..slide.len())
        .find(|&i| slide[i..].iter().all(|r| (r - 1.0).abs() <= 0.02))
        .map(|i| (i + SLIDE) as u128 * WIN_MS);
    let over = slide.iter().copied().fold(0.0f64, f64::max) - 1.0;
    (steady, conv, over.max(0.0))
}

fn predicted(phases: &[[bool; 3]]) -> Vec<(f64, Option<u128>, f64)> {
    let policy = parse_policy("p.toml", &policy_text(None)).unwrap();
    let placement = parse_placement("h.toml", PLACEMENT, &policy).unwrap();
    let nos = Nos::compile(policy, &placement).unwrap();
    let step = 50_000.0;
    let mut sim = Sim::new(&nos, 3, 0, SIZE, step);
    let per_win = (WIN_MS as f64 * 1e6 / step) as usize;
    phases
        .iter()
        .map(|a| {
            let bytes = sim.run(a, PHASE_MS as f64 / 1000.0);
            let w: Vec<f64> = bytes
                .chunks(per_win)
                .map(|c| c.iter().sum::<usize>() as f64)
                .collect();
            metrics(&w)
        })
        .collect()
}

fn main() {
    if !sidecore_testbed::testing::root() {
        println!("the Sikker rate benchmark needs root (namespaces and cgroups)");
        return;
    }
    let phases = [
        [true, true, true],
        [true, false, false],
        [false, true, true],
        [true, true, true],
    ];
    let cg = cgroup2_root().expect("cgroup v2");
    let g = Groups::new(&cg, "sikker-rate-bench", &["s0", "s1", "s2", "sink"]);
    let host = |n: &str| HostSpec { name: n.into() };
    let link = |a: &str, b: &str| LinkSpec {
        hosts: [a.into(), b.into()],
    };
    let topo = Topology {
        subnet: "10.208.0.0/16".into(),
        hosts: vec![host("h0"), host("h1"), host("h2")],
        links: vec![link("h0", "h1"), link("h1", "h2"), link("h0", "h2")],
    };
    let bed = Bed(Testbed::up(&topo, &format!("scsr{}", std::process::id() % 100_000)).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, policy_text(Some(&g))).unwrap();
    let placement = dir.path().join("placement.toml");
    std::fs::write(&placement, PLACEMENT).unwrap();
    let tls = dir.path().join("tls");
    assert!(
        run(&[
            "sikker",
            "certs",
            "--out",
            tls.to_str().unwrap(),
            "h0",
            "h1",
            "h2"
        ])
        .status
        .success()
    );
    let sock = |h: &str| dir.path().join(format!("{h}.sock"));
    let log = |h: &str| dir.path().join(format!("{h}.err"));
    let mut agents = Vec::new();
    for h in ["h0", "h1", "h2"] {
        let mut args: Vec<String> = vec![
            "netns".into(),
            "exec".into(),
            format!("{}-{h}", bed.0.prefix),
            env!("CARGO_BIN_EXE_sidecore").into(),
            "sikker".into(),
            "agent".into(),
            "--policy".into(),
            policy.display().to_string(),
            "--placement".into(),
            placement.display().to_string(),
            "--host".into(),
            h.into(),
            "--socket".into(),
            sock(h).display().to_string(),
            "--listen".into(),
            format!("0.0.0.0:{PORT}"),
            "--tls".into(),
            tls.display().to_string(),
        ];
        for p in ["h0", "h1", "h2"].into_iter().filter(|p| *p != h) {
            args.push("--peer".into());
            args.push(format!("{p}={}:{PORT}", bed.0.iface(p, h).unwrap().addr));
        }
        let err = std::fs::File::create(log(h)).unwrap();
        agents.push(Kill(
            Command::new("ip")
                .args(&args)
                .stdout(Stdio::null())
                .stderr(err)
                .spawn()
                .unwrap(),
        ));
    }
    let linked = |h: &str, n: usize| {
        std::fs::read_to_string(log(h)).is_ok_and(|s| s.matches("linked to host").count() >= n)
    };
    assert!(wait_for(
        || ["h0", "h1", "h2"].iter().all(|h| linked(h, 2)),
        10
    ));
    let total_ms = PHASE_MS * phases.len() as u64 + 2000;
    let meter = spawn_in(
        &g.procs("sink"),
        &[
            "sikker",
            "meter",
            "--socket",
            sock("h0").to_str().unwrap(),
            "--window-ms",
            &WIN_MS.to_string(),
            "--duration-ms",
            &total_ms.to_string(),
        ],
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut starts = Vec::new();
    for a in &phases {
        let t0 = unix_ms();
        starts.push(t0);
        let loads: Vec<Kill> = (0..3)
            .filter(|&i| a[i])
            .map(|i| {
                Kill(spawn_in(
                    &g.procs(&format!("s{i}")),
                    &[
                        "sikker",
                        "load",
                        "--socket",
                        sock(&format!("h{i}")).to_str().unwrap(),
                        "--to",
                        "dst:9:In",
                        "--size",
                        &SIZE.to_string(),
                        "--duration-ms",
                        &PHASE_MS.to_string(),
                    ],
                ))
            })
            .collect();
        for mut l in loads {
            let _ = wait_exit(&mut l.0, 20);
        }
    }
    let out = meter.wait_with_output().unwrap();
    drop(agents);
    let windows: Vec<(u128, f64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                u128::from(v["t_ms"].as_u64().unwrap()),
                v["bytes"].as_u64().unwrap() as f64,
            )
        })
        .collect();
    let pred = predicted(&phases);
    println!(
        "limit 4 MB/s, 8 KiB messages, phases of {PHASE_MS} ms; sliding {} ms",
        SLIDE as u128 * WIN_MS
    );
    println!(
        "| phase (senders) | steady x limit | converged after ms | overshoot | predicted steady | predicted converged ms | predicted overshoot |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (k, a) in phases.iter().enumerate() {
        // The first whole window after the phase starts, to its end.
        let t0 = starts[k];
        let w: Vec<f64> = windows
            .iter()
            .filter(|x| {
                x.0 >= t0.div_ceil(WIN_MS) * WIN_MS && x.0 + WIN_MS <= t0 + u128::from(PHASE_MS)
            })
            .map(|x| x.1)
            .collect();
        let (s, c, o) = metrics(&w);
        let (ps, pc, po) = pred[k];
        let who: Vec<String> = (0..3).filter(|&i| a[i]).map(|i| format!("s{i}")).collect();
        let ms = |c: Option<u128>| c.map_or_else(|| "never".to_string(), |c| c.to_string());
        println!(
            "| {k} ({}) | {s:.4} | {} | {:.1}% | {ps:.4} | {} | {:.1}% |",
            who.join(","),
            ms(c),
            o * 100.0,
            ms(pc),
            po * 100.0
        );
    }
}
