//! OR-1 / OR-6 on real time: how long the monitor takes to declare a stopped target
//! dead, at refresh periods of 10, 25 and 100 ms with k = 3, and how many false
//! positives it raises while the target runs under a CPU-bound load.
//!
//! The target is a real process (this binary re-run with `--target`) in a test cgroup:
//! CPU-bound, it publishes a `tick` counter into an exported Sensor Box every 1 ms.
//! The monitor (this process, another process than the target) fetches the box and the
//! cgroup's `cpu.stat` at each refresh and runs two production [`SlopeDetector`]s on
//! the same view: the explicit `tick` counter and the implicit `cpu.usage_usec`. Each
//! trial waits a random fraction of a refresh, stops the target — alternately by
//! `cgroup.freeze` and by SIGSTOP — and records the time from the stop to the
//! declaration; then resumes it and waits for the recovery.
//!
//! False positives: the target runs beside four CPU-bound spinners (their own test
//! cgroup) on this 2-CPU machine for `ORION_DETECT_LOAD_S` seconds (default 60, not
//! the 10 minutes), and declarations are counted at 25 ms × 3. With
//! `ORION_DETECT_PROTECT=1` the run is configured as an operator would protect a
//! monitored service: the monitor loop at SCHED_FIFO (`orion watch --realtime`)
//! and the target in a v1 `cpu` cgroup with the largest `cpu.shares` (this VM's
//! cgroup v2 has no cpu controller), so neither waits behind the spinners.
//!
//! Run (root): `cargo bench -p sidecore-orion --bench detect`
//! (`ORION_DETECT_TRIALS`, default 20 per period; `ORION_DETECT_LOAD_S`, default 60;
//! `ORION_DETECT_PROTECT`, default 0).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // benchmark code: a failed unwrap is a failed run; scenarios read top to bottom

mod common;

use common::TestCgroup;
use sidecore_orion::client::Publisher;
use sidecore_orion::detect::{LivenessConfig, SlopeDetector, Transition};
use sidecore_orion::implicit::ImplicitSource;
use sidecore_orion::monitor::MonitorBox;
use sidecore_orion::sbox::SensorBox;
use sidecore_orion::shm::{SbParams, now_ns};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;
const BOX: &str = "detect-bench";

/// A v1 `cpu` cgroup holding one process with the given `cpu.shares`; the
/// process goes back to the root group and the cgroup is removed on drop.
struct CpuShares(PathBuf);

impl CpuShares {
    fn new(pid: u32, shares: u64) -> CpuShares {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/cpu/orion-bench-detect-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("v1 cpu cgroup");
        std::fs::write(dir.join("cpu.shares"), shares.to_string()).expect("cpu.shares");
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("move the target");
        CpuShares(dir)
    }
}

impl Drop for CpuShares {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/cpu/cgroup.procs", p);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The target: spin, publishing `tick` every millisecond.
fn target(dir: &Path) -> ! {
    let p = Publisher::attach(dir, BOX).expect("attach to the bench's box");
    let tick = p.counter("tick").expect("register tick");
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            tick.add(1).expect("publish");
            next += Duration::from_millis(1);
        }
        std::hint::spin_loop();
    }
}

/// A tiny xorshift for the stop phase (reproducible).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

struct Monitor {
    mb: MonitorBox,
    refresh_ns: u64,
    next_ns: u64,
    tick: SlopeDetector,
    cpu: SlopeDetector,
}

#[derive(Default, Debug, Clone, Copy)]
struct Step {
    tick: Option<Transition>,
    cpu: Option<Transition>,
}

impl Monitor {
    fn new(mb: MonitorBox, refresh_ns: u64) -> Monitor {
        let cfg = LivenessConfig::new(refresh_ns, 3).unwrap();
        Monitor {
            mb,
            refresh_ns,
            next_ns: now_ns(),
            tick: SlopeDetector::new(cfg),
            cpu: SlopeDetector::new(cfg),
        }
    }

    /// Sleeps to the next refresh and takes one view.
    fn step(&mut self) -> Step {
        self.next_ns += self.refresh_ns;
        let now = now_ns();
        if self.next_ns > now {
            std::thread::sleep(Duration::from_nanos(self.next_ns - now));
        } else {
            self.next_ns = now; // late: do not try to catch up
        }
        let v = self.mb.fetch();
        Step {
            tick: self.tick.observe(v.at_ns, v.value("tick")),
            cpu: self.cpu.observe(v.at_ns, v.value("cpu.usage_usec")),
        }
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--target") {
        target(Path::new(&args[2]));
    }
    if let Some(why) = common::unavailable() {
        eprintln!("detect bench skipped: {why}");
        return;
    }
    let trials: usize = std::env::var("ORION_DETECT_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let load_s: u64 = std::env::var("ORION_DETECT_LOAD_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);

    let dir: PathBuf = std::env::temp_dir().join(format!("orion-detect-{}", std::process::id()));
    let mut sb = SensorBox::create(
        BOX,
        SbParams {
            sensors: 4,
            log_records: 16,
            period_us: 1000,
        },
    )
    .expect("box");
    sb.export(&dir).expect("export");
    let cg = TestCgroup::new("detect", 64, 1 << 30);
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let mut tgt = cg.spawn(&[exe, "--target", dir.to_str().unwrap()]);
    let t0 = Instant::now();
    while sb.shared().find("tick").is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "target never registered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = rustix::process::Pid::from_raw(tgt.id() as i32).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);

    println!(
        "detection latency, k = 3, {trials} trials per period (half cgroup.freeze, half SIGSTOP), ms from the stop to the declaration"
    );
    println!(
        "| refresh | bound k·r .. (k+1)·r | tick p50 | tick max | cpu.usage p50 | cpu.usage max | seed (OR-1, 100 ms × 3) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let periods: &[u64] = if trials == 0 { &[] } else { &[10, 25, 100] };
    let bar = sidecore_plot::progress::Progress::bar((periods.len() * trials) as u64, "detect");
    for &r_ms in periods {
        let refresh = r_ms * MS;
        let mut mb = MonitorBox::from_shared(
            sidecore_orion::monitor::open_exported(&dir, BOX).expect("monitor attach"),
        );
        mb.add_implicit(ImplicitSource::CgroupCpu(cg.v2.clone()));
        let mut m = Monitor::new(mb, refresh);
        let (mut lat_tick, mut lat_cpu) = (Vec::new(), Vec::new());
        for t in 0..trials {
            bar.step(format!("refresh {r_ms} ms, trial {t}"));
            // Warm up: both detectors alive for a few views.
            for _ in 0..5 {
                m.step();
            }
            std::thread::sleep(Duration::from_nanos(rng.below(refresh)));
            let freeze = t % 2 == 0;
            if freeze {
                std::fs::write(cg.v2.join("cgroup.freeze"), "1").unwrap();
            } else {
                rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
            }
            let stop = now_ns();
            let (mut dt, mut dc) = (None, None);
            let give_up = Instant::now() + Duration::from_secs(5);
            while (dt.is_none() || dc.is_none()) && Instant::now() < give_up {
                let s = m.step();
                if let Some(Transition::Declared { at_ns, .. }) = s.tick {
                    dt = Some((at_ns.saturating_sub(stop)) as f64 / MS as f64);
                }
                if let Some(Transition::Declared { at_ns, .. }) = s.cpu {
                    dc = Some((at_ns.saturating_sub(stop)) as f64 / MS as f64);
                }
            }
            lat_tick.push(dt.unwrap_or(f64::INFINITY));
            lat_cpu.push(dc.unwrap_or(f64::INFINITY));
            if freeze {
                std::fs::write(cg.v2.join("cgroup.freeze"), "0").unwrap();
            } else {
                rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
            }
            // Until both recover.
            let (mut rt, mut rc) = (false, false);
            let give_up = Instant::now() + Duration::from_secs(5);
            while !(rt && rc) && Instant::now() < give_up {
                let s = m.step();
                rt |= matches!(s.tick, Some(Transition::Recovered { .. }));
                rc |= matches!(s.cpu, Some(Transition::Recovered { .. }));
            }
            assert!(rt && rc, "target did not recover");
        }
        bar.suspend(|| eprintln!("r={r_ms} ms tick {lat_tick:?}\n      cpu {lat_cpu:?}"));
        bar.suspend(|| {
            println!(
                "| {r_ms} ms | {}..{} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                3 * r_ms,
                4 * r_ms,
                pct(&lat_tick, 0.5),
                pct(&lat_tick, 1.0),
                pct(&lat_cpu, 0.5),
                pct(&lat_cpu, 1.0),
                if r_ms == 100 { "all within 400" } else { "-" }
            );
        });
    }
    drop(bar);

    // False positives under a CPU-bound load.
    let load = TestCgroup::new("detect-load", 16, 1 << 30);
    let spinners: Vec<_> = (0..4)
        .map(|_| load.spawn(&["perl", "-e", "1 while 1"]))
        .collect();
    let mut mb = MonitorBox::from_shared(
        sidecore_orion::monitor::open_exported(&dir, BOX).expect("monitor attach"),
    );
    mb.add_implicit(ImplicitSource::CgroupCpu(cg.v2.clone()));
    let mut m = Monitor::new(mb, 25 * MS);
    let protect = std::env::var("ORION_DETECT_PROTECT").is_ok_and(|v| v == "1");
    let _shares = protect.then(|| CpuShares::new(tgt.id(), 262_144));
    let _rt = protect.then(|| {
        sidecore_orion::repair::FifoBoost::try_new()
            .expect("ORION_DETECT_PROTECT: the monitor could not take SCHED_FIFO")
    });
    let (mut fp_tick, mut fp_cpu, mut views, mut late) = (0, 0, 0u64, 0u64);
    let mut worst_gap = 0u64;
    let mut last = now_ns();
    let mut gaps: std::collections::VecDeque<f64> = std::collections::VecDeque::new();
    let mut fps: Vec<String> = Vec::new();
    let begin = Instant::now();
    let end = begin + Duration::from_secs(load_s);
    while Instant::now() < end {
        let s = m.step();
        let now = now_ns();
        worst_gap = worst_gap.max(now - last);
        if now - last > 35 * MS {
            late += 1;
        }
        gaps.push_back((now - last) as f64 / MS as f64);
        if gaps.len() > 4 {
            gaps.pop_front();
        }
        last = now;
        views += 1;
        let (dt, dc) = (
            matches!(s.tick, Some(Transition::Declared { .. })),
            matches!(s.cpu, Some(Transition::Declared { .. })),
        );
        fp_tick += usize::from(dt);
        fp_cpu += usize::from(dc);
        if dt || dc {
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            fps.push(format!(
                "at {:.1} s ({}{}): last view gaps {:?} ms, loadavg {}",
                begin.elapsed().as_secs_f64(),
                if dt { "tick " } else { "" },
                if dc { "cpu.usage" } else { "" },
                gaps.iter()
                    .map(|g| (g * 10.0).round() / 10.0)
                    .collect::<Vec<_>>(),
                load.split_whitespace()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
    }
    println!();
    println!(
        "false positives at 25 ms × 3 over {load_s} s beside 4 CPU-bound spinners on 2 CPUs{} ({views} views, {late} more than 35 ms apart, widest gap {:.1} ms)",
        if protect {
            ", monitor at SCHED_FIFO, target cpu.shares 262144"
        } else {
            ""
        },
        worst_gap as f64 / MS as f64
    );
    println!("| sensor | declarations (false positives) |");
    println!("|---|---:|");
    println!("| tick (explicit counter, every 1 ms) | {fp_tick} |");
    println!("| cgroup cpu.usage_usec (implicit) | {fp_cpu} |");
    for f in &fps {
        println!("- {f}");
    }
    drop(spinners);
    drop(load);
    let _ = tgt.kill();
    let _ = tgt.wait();
    drop(cg);
    drop(sb);
    let _ = std::fs::remove_dir_all(&dir);
}
