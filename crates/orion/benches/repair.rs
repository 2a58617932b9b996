//! OR-7 (seed Table 3.4): the time to repair a fork bomb of 100, 500, 1,000 and 1,500
//! processes. A real process tree of that size (perl, each process forking two
//! children until the count is reached, then sleeping: depth ~log2 n) runs in a test
//! cgroup with a v1 `pids.max` above it. Three ways to kill it, in the same run,
//! rotated per trial:
//!
//! - **orion**: the existing [`Healer`] (`check_fork_bomb`: scan, then freeze → walk
//!   /proc → kill the culprit's subtree through pidfds → thaw, a 20 ms settle and a
//!   verification scan, repeated while the thresholds trip). Reported: the time frozen
//!   (freeze → walk → kill → thaw, summed over passes), the healer's total, and the
//!   time from the start of the repair until the cgroup is empty.
//! - **cgroup.kill**: the kernel kills the whole cgroup (`echo 1 > cgroup.kill`);
//!   time until the cgroup is empty.
//! - **walk+kill**: walk the cgroup's processes in /proc (the same scan) and SIGKILL
//!   each, without freezing; time until empty. Safe here only because the tree is
//!   static — a live bomb refills what is not frozen.
//!
//! Run (root): `cargo bench -p sidecore-orion --bench repair`
//! (`ORION_REPAIR_TRIALS`, default 3; `ORION_REPAIR_SIZES`, default 100,500,1000,1500).
#![allow(clippy::unwrap_used, clippy::expect_used)] // benchmark code: a failed unwrap is a failed run

mod common;

use common::TestCgroup;
use sidecore_orion::actions::ActionLog;
use sidecore_orion::policy::{ForkBombThresholds, Whitelist};
use sidecore_orion::procscan::scan_cgroup;
use sidecore_orion::repair::{Healer, HealerConfig};
use std::time::{Duration, Instant};

/// Each process owns a subtree of `k` (itself included): it forks two children owning
/// halves of the rest, then sleeps.
const TREE: &str = r#"
$SIG{__DIE__} = sub { exit 1 };
sub grow { my $k = shift; my $r = $k - 1; my $a = int($r / 2);
  for my $c ($a, $r - $a) { next unless $c > 0; my $p = fork(); die unless defined $p;
    if ($p == 0) { grow($c); } }
  sleep 1000; exit 0; }
grow($ARGV[0]);
"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    Orion,
    CgroupKill,
    WalkKill,
}

#[derive(Default)]
struct Samples {
    frozen: Vec<f64>,
    settle: Vec<f64>,
    healer_total: Vec<f64>,
    gone: Vec<f64>,
    passes: Vec<u32>,
    killed: Vec<usize>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One repair of an `n`-process tree; for Orion, a note of where the
/// frozen time went.
fn one(n: usize, method: Method, out: &mut Samples) -> Option<String> {
    let mut note = None;
    let cg = TestCgroup::new("repair", n as u64 + 64, 8 << 30);
    let mut root = cg.spawn(&["perl", "-e", TREE, &n.to_string()]);
    assert!(
        cg.wait_count(n, Duration::from_secs(60)),
        "tree of {n} never complete ({} processes)",
        cg.procs().len()
    );
    std::thread::sleep(Duration::from_millis(200)); // let the forks settle
    match method {
        Method::Orion => {
            let mut cfg = HealerConfig::new(&cg.v2);
            cfg.thresholds = ForkBombThresholds {
                max_count: n / 2,
                max_depth: 64,
                max_breadth: 100_000,
                max_rate_per_s: 1e9,
            };
            cfg.whitelist = Whitelist::default();
            let mut healer = Healer::new(cfg, ActionLog::new(None)).expect("healer");
            let r = healer
                .check_fork_bomb()
                .expect("check")
                .expect("bomb detected");
            let end = Instant::now();
            let start = end - Duration::from_secs_f64(r.total_ms / 1e3);
            let left = cg.wait_empty(Duration::from_secs(30)).expect("emptied");
            out.frozen.push(r.frozen_ms);
            out.settle.push(
                healer
                    .log()
                    .entries()
                    .iter()
                    .filter(|a| a.kind == "freeze")
                    .filter_map(|a| a.evidence["settled_ms"].as_f64())
                    .sum(),
            );
            let sum = |kind: &str, key: &str| -> f64 {
                healer
                    .log()
                    .entries()
                    .iter()
                    .filter(|a| a.kind == kind)
                    .filter_map(|a| a.evidence[key].as_f64())
                    .sum()
            };
            note = Some(format!(
                "n={n} where the frozen time went (ms): freeze settle {:.1}, walk {:.1}, kill {:.1}, thaw {:.1}; frozen {:.1}",
                sum("freeze", "settled_ms"),
                sum("kill", "walk_ms"),
                sum("kill", "kill_ms"),
                sum("thaw", "thaw_ms"),
                r.frozen_ms
            ));
            out.healer_total.push(r.total_ms);
            out.gone.push(ms(end + left - start));
            out.passes.push(r.passes);
            out.killed.push(r.killed.len());
        }
        Method::CgroupKill => {
            let start = Instant::now();
            std::fs::write(cg.v2.join("cgroup.kill"), "1").expect("cgroup.kill");
            let issued = start.elapsed();
            let gone = cg.wait_empty(Duration::from_secs(30)).expect("emptied");
            out.frozen.push(ms(issued));
            out.gone.push(ms(issued + gone));
        }
        Method::WalkKill => {
            use rustix::process::{Pid, Signal, kill_process};
            let start = Instant::now();
            let procs = scan_cgroup(&cg.v2).expect("scan");
            for p in &procs {
                let _ = kill_process(Pid::from_raw(p.pid as i32).unwrap(), Signal::KILL);
            }
            let issued = start.elapsed();
            let gone = cg.wait_empty(Duration::from_secs(30)).expect("emptied");
            out.frozen.push(ms(issued));
            out.gone.push(ms(issued + gone));
            out.killed.push(procs.len());
        }
    }
    let _ = root.wait();
    note
}

fn main() {
    if let Some(why) = common::unavailable() {
        eprintln!("repair bench skipped: {why}");
        return;
    }
    let trials: usize = std::env::var("ORION_REPAIR_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let sizes: Vec<usize> = std::env::var("ORION_REPAIR_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100, 500, 1000, 1500]);
    let seed = |n: usize| match n {
        100 => "140",
        500 => "263",
        1000 => "350",
        1500 => "426",
        _ => "-",
    };
    println!("repair of a static perl process tree, {trials} trials per cell, medians (ms)");
    println!(
        "| processes | seed (Tab. 3.4) | orion frozen | of which freeze settling | orion healer total | orion until empty | passes | killed | cgroup.kill until empty | walk+SIGKILL issue | walk+SIGKILL until empty |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut plot: [Vec<f64>; 4] = Default::default();
    let runs = (sizes.len() * trials * 3) as u64;
    let bar = sidecore_plot::progress::Progress::bar(runs, "repair");
    for &n in &sizes {
        let methods = [Method::Orion, Method::CgroupKill, Method::WalkKill];
        let mut s: Vec<Samples> = (0..3).map(|_| Samples::default()).collect();
        for t in 0..trials {
            for i in 0..3 {
                let m = methods[(i + t) % 3];
                bar.say(format!("{n} processes, trial {t}, {m:?}"));
                let idx = methods.iter().position(|x| *x == m).unwrap();
                if let Some(note) = one(n, m, &mut s[idx]) {
                    bar.suspend(|| eprintln!("{note}"));
                }
                bar.step("repair");
            }
        }
        let (o, c, w) = (&s[0], &s[1], &s[2]);
        bar.suspend(|| eprintln!(
            "n={n} orion frozen {:?} gone {:?} passes {:?} killed {:?}; cgroup.kill gone {:?}; walk gone {:?}",
            o.frozen, o.gone, o.passes, o.killed, c.gone, w.gone
        ));
        plot[0].push(seed(n).parse().unwrap_or(f64::NAN));
        plot[1].push(median(&o.healer_total));
        plot[2].push(median(&c.gone));
        plot[3].push(median(&w.gone));
        bar.suspend(|| {
            println!(
                "| {n} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.1} | {:.1} | {:.1} |",
                seed(n),
                median(&o.frozen),
                median(&o.settle),
                median(&o.healer_total),
                median(&o.gone),
                o.passes.iter().max().unwrap_or(&0),
                o.killed.iter().min().unwrap_or(&0),
                median(&c.gone),
                median(&w.frozen),
                median(&w.gone),
            );
        });
    }
    drop(bar);
    let svg = sidecore_plot::out_dir().join("orion-repair.svg");
    let groups: Vec<String> = sizes.iter().map(|n| format!("{n} processes")).collect();
    let [seed_ms, healer, cgkill, walk] = plot;
    match sidecore_plot::grouped_bars(
        &svg,
        "Repair of a process tree (OR-7, Table 3.4), median ms",
        "ms",
        &groups,
        &[
            sidecore_plot::Series::new("seed (Tab. 3.4)", seed_ms),
            sidecore_plot::Series::new("orion healer", healer),
            sidecore_plot::Series::new("cgroup.kill until empty", cgkill),
            sidecore_plot::Series::new("walk+SIGKILL until empty", walk),
        ],
    ) {
        Ok(()) => println!("plot: {}", svg.display()),
        Err(e) => eprintln!("plot not written: {e}"),
    }
}
