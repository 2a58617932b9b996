//! OR-8 (seed §3.7.1): a probe job that takes about 5 s on an idle machine, run beside
//! a fork bomb, with and without Orion's repair. The probe is a single-threaded CPU loop
//! (calibrated at the start of the run to 5 s idle) in this process, outside the bomb's
//! test cgroup (v1 `pids.max` = 200 as the safety net). The bombs:
//!
//! - **CPU-bound**: every process forks, counts to 100,000 and forks again (perl), so
//!   the cgroup fills to `pids.max` with spinners;
//! - **I/O-bound**: every process forks, then writes a 1 MiB file, fsyncs and deletes
//!   it, and forks again (perl, files in the temporary directory).
//!
//! "Repaired" runs the production [`Healer`] (kernel fork/exec/exit sensors, default
//! thresholds) every 25 ms on a thread of this process while the bomb and the probe
//! run; "not repaired" leaves the bomb to its `pids.max` (a probe still unfinished
//! after 30 s is stopped and its time extrapolated from the pace it kept). Each row gives the probe's time
//! and its ratio to the idle time measured in the same run, rows alternated per trial.
//!
//! Run (root): `cargo bench -p sidecore-orion --bench probe` (`ORION_PROBE_TRIALS`,
//! default 2; `ORION_PROBE_S`, default 5).
#![allow(clippy::unwrap_used, clippy::expect_used)] // benchmark code: a failed unwrap is a failed run

mod common;

use common::TestCgroup;
use sidecore_orion::actions::ActionLog;
use sidecore_orion::repair::{Healer, HealerConfig};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const CPU_BOMB: &str = "my $x = 0; while (1) { fork; for (1 .. 100_000) { $x++ } }";
const IO_BOMB: &str = r#"use IO::Handle; my $b = 'x' x (1 << 20);
while (1) { fork; my $f = "$ARGV[0]/io.$$"; open(my $h, '>', $f) or exit 1; print $h $b;
$h->flush; $h->sync; close $h; unlink $f }"#;

/// The probe: `iters` turns of a dependent integer loop, given up at `cap`. Returns the
/// time taken, or the time it would have taken at the pace it kept until the cap.
fn probe_capped(iters: u64, cap: Duration) -> (Duration, bool) {
    const CHUNK: u64 = 1 << 20;
    let t = Instant::now();
    let mut x: u64 = 1;
    let mut done = 0;
    while done < iters {
        for i in done..(done + CHUNK).min(iters) {
            x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
        done = (done + CHUNK).min(iters);
        if t.elapsed() > cap && done < iters {
            black_box(x);
            return (t.elapsed().mul_f64(iters as f64 / done as f64), false);
        }
    }
    black_box(x);
    (t.elapsed(), true)
}

fn probe(iters: u64) -> Duration {
    probe_capped(iters, Duration::MAX).0
}

/// Iterations that take `secs` here, idle.
fn calibrate(secs: f64) -> u64 {
    let n = 50_000_000;
    let t = probe(n).as_secs_f64();
    (n as f64 * secs / t) as u64
}

#[derive(Clone, Copy, PartialEq)]
enum Bomb {
    None,
    Cpu,
    Io,
}

/// One probe run beside `bomb`, repaired or not; the probe's time, and the repairs made.
fn run(iters: u64, bomb: Bomb, repaired: bool) -> (Duration, usize) {
    if bomb == Bomb::None {
        return (probe(iters), 0);
    }
    let cg = TestCgroup::new("probe", 200, 1 << 30);
    let dir = tempfile_dir();
    let script = if bomb == Bomb::Cpu { CPU_BOMB } else { IO_BOMB };
    let stop = Arc::new(AtomicBool::new(false));
    let repairs = Arc::new(AtomicUsize::new(0));
    let healer = repaired.then(|| {
        let cfg = HealerConfig::new(&cg.v2);
        let mut h = Healer::new(cfg, ActionLog::new(None)).expect("healer");
        let (stop, repairs) = (Arc::clone(&stop), Arc::clone(&repairs));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                if let Ok(Some(_)) = h.check_fork_bomb() {
                    repairs.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        })
    });
    let mut root = cg.spawn(&["perl", "-e", script, dir.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(100)); // let it grow
    // Unrepaired, the probe shares 2 CPUs with ~200 spinners: it is given up after
    // 30 s and its time extrapolated from the pace it kept.
    let (took, finished) = probe_capped(iters, Duration::from_secs(30));
    if !finished {
        eprintln!(
            "probe given up after 30 s; extrapolated to {:.1} s",
            took.as_secs_f64()
        );
    }
    stop.store(true, Ordering::Release);
    if let Some(h) = healer {
        let _ = h.join();
    }
    drop(cg); // kills what is left
    let _ = root.wait();
    let _ = std::fs::remove_dir_all(&dir);
    (took, repairs.load(Ordering::Relaxed))
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("orion-probe-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn main() {
    if let Some(why) = common::unavailable() {
        eprintln!("probe bench skipped: {why}");
        return;
    }
    let trials: usize = std::env::var("ORION_PROBE_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let secs: f64 = std::env::var("ORION_PROBE_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let iters = calibrate(secs);
    let rows = [
        ("idle", Bomb::None, false),
        ("CPU-bound bomb, not repaired", Bomb::Cpu, false),
        ("CPU-bound bomb, repaired", Bomb::Cpu, true),
        ("I/O-bound bomb, not repaired", Bomb::Io, false),
        ("I/O-bound bomb, repaired", Bomb::Io, true),
    ];
    let mut times: Vec<Vec<(f64, usize)>> = vec![Vec::new(); rows.len()];
    let bar = sidecore_plot::progress::Progress::bar((trials * rows.len()) as u64, "probe");
    for t in 0..trials {
        for k in 0..rows.len() {
            let i = (k + t) % rows.len();
            let (name, bomb, repaired) = rows[i];
            bar.say(format!("trial {t}: beside {name}"));
            let (d, n) = run(iters, bomb, repaired);
            times[i].push((d.as_secs_f64(), n));
            bar.step("probe");
        }
    }
    drop(bar);
    let mean = |v: &[(f64, usize)]| v.iter().map(|x| x.0).sum::<f64>() / v.len() as f64;
    let idle = mean(&times[0]);
    println!("OR-8: a {secs} s probe job beside fork bombs ({trials} trials per row, rotated)");
    println!("| beside | probe s (each trial) | mean / idle | repairs |");
    println!("|---|---|---:|---|");
    for (i, (name, _, _)) in rows.iter().enumerate() {
        let each: Vec<String> = times[i].iter().map(|x| format!("{:.2}", x.0)).collect();
        let reps: Vec<String> = times[i].iter().map(|x| x.1.to_string()).collect();
        println!(
            "| {name} | {} | {:.2} | {} |",
            each.join(", "),
            mean(&times[i]) / idle,
            reps.join(", ")
        );
    }
}
