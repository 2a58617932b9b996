//! OR-4: the monitor's own CPU time at 100 sensors, for refresh periods of 1, 10 and
//! 100 ms and for a tight fetch loop (period 0). A publisher thread updates 100
//! counters in a Sensor Box every millisecond; the monitor thread fetches the box
//! (100 explicit sensors, plus the implicit `/proc/stat` and a cgroup's `cpu.stat`)
//! and runs a [`SlopeDetector`] per sensor at each refresh. Its CPU time is the
//! thread's own clock (`CLOCK_THREAD_CPUTIME_ID`) over a fixed wall-clock span, so
//! the publisher and the rest of the machine are not counted.
//!
//! Run: `cargo bench -p sidecore-orion --bench monitor_cpu`
//! (`ORION_MONITOR_SECS`, default 10 per period).
#![allow(clippy::unwrap_used, clippy::expect_used)] // benchmark code: a failed unwrap is a failed run

use sidecore_orion::detect::{LivenessConfig, SlopeDetector};
use sidecore_orion::implicit::ImplicitSource;
use sidecore_orion::monitor::MonitorBox;
use sidecore_orion::sensor::{SensorKind, SensorSpec};
use sidecore_orion::shm::{SbParams, SharedBox, now_ns};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SENSORS: u32 = 100;

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// Runs the monitor for `span` at `period` (zero: a tight loop); returns
/// (CPU fraction, fetches, sensors seen in the last view).
fn monitor(sb: SharedBox, period: Duration, span: Duration, implicit: bool) -> (f64, u64, usize) {
    let mut mb = MonitorBox::from_shared(sb);
    if implicit {
        mb.add_implicit(ImplicitSource::ProcStat);
        mb.add_implicit(ImplicitSource::CgroupCpu("/sys/fs/cgroup/unified".into()));
    }
    let cfg = LivenessConfig::new(period.as_nanos().max(1) as u64, 3).unwrap();
    let mut det: Vec<SlopeDetector> = (0..SENSORS).map(|_| SlopeDetector::new(cfg)).collect();
    let cpu0 = thread_cpu_ns();
    let start = Instant::now();
    let mut next = start;
    let (mut fetches, mut seen) = (0u64, 0usize);
    while start.elapsed() < span {
        if !period.is_zero() {
            next += period;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
        let v = mb.fetch();
        for (d, s) in det.iter_mut().zip(&v.sensors) {
            let _ = d.observe(v.at_ns, Some(s.value[0]));
        }
        seen = v.sensors.len();
        fetches += 1;
    }
    let cpu = thread_cpu_ns() - cpu0;
    (
        cpu as f64 / start.elapsed().as_nanos() as f64,
        fetches,
        seen,
    )
}

fn main() {
    let secs: u64 = std::env::var("ORION_MONITOR_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let span = Duration::from_secs(secs);
    let sb = Arc::new(
        SharedBox::create(
            "monitor-cpu",
            SbParams {
                sensors: SENSORS,
                log_records: 16,
                period_us: 1000,
            },
        )
        .expect("box"),
    );
    let handles: Vec<_> = (0..SENSORS)
        .map(|i| {
            sb.add_sensor(
                &SensorSpec::new("monitor-cpu", &format!("s{i}"), SensorKind::Counter).unwrap(),
            )
            .unwrap()
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (sb, stop) = (sb.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut v = 0u64;
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                for h in &handles {
                    sb.update(*h, [v, now_ns()]).unwrap();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    println!(
        "monitor thread CPU at {SENSORS} sensors (publisher updating all every 1 ms), {secs} s per row"
    );
    println!(
        "| period | CPU, box only | fetches/s | CPU, box + /proc/stat + cpu.stat | fetches/s | seed (OR-4) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (p_ms, seed) in [
        (0u64, "46% (tight loop)"),
        (1, "-"),
        (10, "~5%"),
        (100, "< 1%"),
    ] {
        let period = Duration::from_millis(p_ms);
        let dup = || SharedBox::attach(sb.dup_fd().unwrap(), "dup").unwrap();
        let (c1, f1, n1) = monitor(dup(), period, span, false);
        let (c2, f2, n2) = monitor(dup(), period, span, true);
        assert_eq!((n1, n2), (SENSORS as usize, SENSORS as usize));
        let label = if p_ms == 0 {
            "tight loop".to_owned()
        } else {
            format!("{p_ms} ms")
        };
        println!(
            "| {label} | {:.2}% | {:.0} | {:.2}% | {:.0} | {seed} |",
            c1 * 100.0,
            f1 as f64 / secs as f64,
            c2 * 100.0,
            f2 as f64 / secs as f64
        );
    }
    stop.store(true, Ordering::Relaxed);
    publisher.join().unwrap();
}
