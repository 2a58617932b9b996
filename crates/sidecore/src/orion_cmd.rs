//! `sidecore orion status|query|watch`: Orion (sidecore-orion) from the command line —
//! the exported Sensor Boxes, one fetch of a box with the host's implicit sensors, and a
//! monitor loop that judges liveness by counter slope and, with `--heal`, repairs fork
//! bombs in a cgroup from outside it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Subcommand;
use sidecore_observe::exporters::OrionWatch;
use sidecore_orion::actions::ActionLog;
use sidecore_orion::aggregate::Rate;
use sidecore_orion::detect::{Liveness, LivenessConfig, SlopeDetector, Transition};
use sidecore_orion::implicit::ImplicitSource;
use sidecore_orion::monitor::{MonitorBox, View};
use sidecore_orion::policy::{VictimScope, Whitelist};
use sidecore_orion::repair::{Healer, HealerConfig, TreeSource};
use sidecore_orion::sbox::ExportRecord;

/// Where boxes are exported when no `--dir` is given.
pub const DEFAULT_DIR: &str = "/run/sidecore/orion";

#[derive(Debug, Subcommand)]
pub enum OrionCommand {
    /// The Sensor Boxes exported in the directory, with their owners and counters.
    Status {
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// One JSON object per box.
        #[arg(long)]
        json: bool,
    },
    /// One fetch of a box (or of the host's implicit sensors alone with --host).
    Query {
        /// The box's name.
        #[arg(required_unless_present = "host")]
        name: Option<String>,
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// Implicit sensors only: /proc/stat and /proc/vmstat.
        #[arg(long)]
        host: bool,
        /// Also read this cgroup's cpu.stat, pids.current and memory use.
        #[arg(long)]
        cgroup: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Fetch every refresh period, judge liveness by counter slope (k refreshes without
    /// progress declare the target dead), and print changes; --heal repairs fork bombs.
    Watch {
        /// A box to fetch (default: implicit sensors only).
        name: Option<String>,
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// A cgroup v2 directory to watch (its cpu.stat is the default liveness sensor).
        #[arg(long)]
        cgroup: Option<PathBuf>,
        /// The liveness sensor (default: cpu.usage_usec with --cgroup, else stat.ctxt).
        #[arg(long)]
        sensor: Option<String>,
        #[arg(long, default_value_t = 25)]
        refresh_ms: u64,
        #[arg(short, default_value_t = 3)]
        k: u32,
        /// Stop after this many seconds (default: run until killed).
        #[arg(long)]
        seconds: Option<u64>,
        /// Run the monitor loop at SCHED_FIFO (lowest real-time priority), so
        /// CPU-bound load on the machine cannot delay its views past the
        /// deadline (the seed's monitor sat on a NIC the host's load never
        /// reached). Needs CAP_SYS_NICE; refused with a clear error without it.
        #[arg(long)]
        realtime: bool,
        /// Repair fork bombs in --cgroup (freeze, kill the culprit's subtree, thaw).
        #[arg(long, requires = "cgroup")]
        heal: bool,
        /// With --heal, also repair memory hogs: the cgroup's memory limit
        /// (e.g. 400MiB); a hog is killed (by --scope) once use passes the
        /// healer's share of it.
        #[arg(long, requires = "heal")]
        memory_limit: Option<bytesize::ByteSize>,
        /// Command names never killed (comma-separated).
        #[arg(long, value_delimiter = ',')]
        whitelist: Vec<String>,
        /// Memory-hog victim scope: process-group, uid or cgroup.
        #[arg(long, default_value = "process-group")]
        scope: String,
        /// Append the action log here as JSON lines.
        #[arg(long)]
        log: Option<PathBuf>,
        #[command(flatten)]
        metrics: crate::args::MetricsArgs,
    },
}

pub fn run(cmd: OrionCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        OrionCommand::Status { dir, json } => status(&dir, json),
        OrionCommand::Query {
            name,
            dir,
            host,
            cgroup,
            json,
        } => {
            let mut mon = open(name.as_deref().filter(|_| !host), &dir, cgroup.as_ref())?;
            let view = mon.fetch();
            mon.flush(&view);
            if json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print_view(&view);
            }
            Ok(ExitCode::SUCCESS)
        }
        watch @ OrionCommand::Watch { .. } => run_watch(watch),
    }
}

fn open(
    name: Option<&str>,
    dir: &std::path::Path,
    cgroup: Option<&PathBuf>,
) -> anyhow::Result<MonitorBox> {
    let mut mon = match name {
        Some(n) => MonitorBox::discover(dir, n)?,
        None => MonitorBox::implicit_only("host")?,
    };
    mon.add_implicit(ImplicitSource::ProcStat);
    mon.add_implicit(ImplicitSource::VmStat);
    if let Some(cg) = cgroup {
        mon.add_implicit(ImplicitSource::CgroupCpu(cg.clone()));
        mon.add_implicit(ImplicitSource::CgroupPids(cg.clone()));
        // Its memory use (v2 memory.current, or the v1 twin's usage), for the
        // memory-hog repair; a machine without it reports the sensor unread.
        mon.add_implicit(ImplicitSource::CgroupMemory(cg.clone()));
    }
    Ok(mon)
}

fn status(dir: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let (records, bad) = match ExportRecord::list(dir) {
        Ok(r) => r,
        Err(_) if !dir.exists() => {
            if json {
                println!(r#"{{"boxes": [], "skipped": []}}"#);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "no sensor boxes exported ({} does not exist)",
                dir.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        return status_json(dir, &records, &bad);
    }
    println!(
        "{:<24} {:>8} {:>8} {:>10} {:>10} {:>8}  STATE",
        "BOX", "PID", "SENSORS", "UPDATES", "UNFLUSHED", "DROPPED"
    );
    for r in &records {
        match MonitorBox::discover(dir, &r.name) {
            Ok(mut m) => {
                let v = m.fetch();
                println!(
                    "{:<24} {:>8} {:>8} {:>10} {:>10} {:>8}  exported, period {} µs",
                    r.name,
                    r.pid,
                    v.sensors.len(),
                    v.info.updates,
                    v.info.head - v.info.tail,
                    v.info.dropped,
                    r.period_us
                );
            }
            Err(e) => println!("{:<24} {:>8}  unreachable: {e}", r.name, r.pid),
        }
    }
    for b in bad {
        println!("skipped: {b}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `orion status --json`: the boxes as a JSON array.
fn status_json(
    dir: &std::path::Path,
    records: &[ExportRecord],
    bad: &[String],
) -> anyhow::Result<ExitCode> {
    let boxes: Vec<serde_json::Value> = records
        .iter()
        .map(|r| match MonitorBox::discover(dir, &r.name) {
            Ok(mut m) => {
                let v = m.fetch();
                serde_json::json!({
                    "name": r.name, "pid": r.pid, "period_us": r.period_us,
                    "sensors": v.sensors.len(), "updates": v.info.updates,
                    "unflushed": v.info.head - v.info.tail, "dropped": v.info.dropped,
                })
            }
            Err(e) => serde_json::json!({"name": r.name, "pid": r.pid, "error": e.to_string()}),
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({"boxes": boxes, "skipped": bad}))?
    );
    Ok(ExitCode::SUCCESS)
}

fn print_view(v: &View) {
    println!(
        "box `{}` (owner {}): {} sensor(s), {} event(s) unflushed, {} dropped",
        v.info.name,
        v.info.owner_pid,
        v.sensors.len(),
        v.events.len(),
        v.info.dropped
    );
    for s in &v.sensors {
        println!(
            "  {:<32} {:<8} {:>20} {:>20}  updates {}",
            s.name,
            s.kind.name(),
            s.value[0],
            s.value[1],
            s.updates
        );
    }
    for e in &v.events {
        println!(
            "  event #{} sensor {} = ({}, {})",
            e.pos, e.handle.id, e.value[0], e.value[1]
        );
    }
    for (k, val) in &v.implicit {
        println!("  {k:<32} implicit {val:>20}");
    }
    for e in &v.errors {
        println!("  unread: {e}");
    }
}

/// The healer `--heal` asks for, repairing in cgroup `cg`.
fn healer(
    cg: &std::path::Path,
    whitelist: Vec<String>,
    scope: &str,
    log: Option<PathBuf>,
) -> anyhow::Result<Healer> {
    let mut hc = HealerConfig::new(cg);
    hc.whitelist = Whitelist {
        names: whitelist.into_iter().collect(),
        ..Whitelist::default()
    };
    hc.scope = scope.parse::<VictimScope>()?;
    let h = Healer::new(hc, ActionLog::new(log)).context("--heal")?;
    match h.source() {
        TreeSource::Kernel { attach } => {
            eprintln!(
                "orion: shadow process tree from the kernel's fork/exec/exit events ({attach})"
            );
        }
        TreeSource::ProcScan { why } => {
            eprintln!("orion: shadow process tree from /proc scans ({why})");
        }
    }
    Ok(h)
}

/// Prints a liveness transition of `sensor`.
fn print_transition(t: &Transition, sensor: &str, k: u32) {
    match t {
        Transition::Declared {
            at_ns,
            last_progress_ns,
            value,
        } => println!(
            "DEAD: `{sensor}` stuck at {value:?} for {} ms ({k} refreshes)",
            (at_ns - last_progress_ns) / 1_000_000
        ),
        Transition::Recovered { .. } => {
            println!("RECOVERED: `{sensor}` moves again (the declaration was a false positive)");
        }
    }
}

/// One fork-bomb check and repair, reported.
/// One repair pass (fork bomb; memory hog when the use and limit are known);
/// returns how many processes it killed, if it repaired.
fn heal_once(h: &mut Healer, memory: Option<(u64, u64)>) -> Option<usize> {
    let bomb = heal_bomb(h);
    let hog = memory.and_then(|(usage, limit)| match h.check_memory(usage, limit) {
        Ok(Some(r)) => {
            println!(
                "REPAIRED memory hog: {} used of {limit} bytes, culprit {}, {} killed in {:.1} ms",
                usage,
                r.culprit,
                r.killed.len(),
                r.total_ms
            );
            Some(r.killed.len())
        }
        Ok(None) => None,
        Err(e) => {
            println!("heal: {e}");
            None
        }
    });
    match (bomb, hog) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

/// One fork-bomb check.
fn heal_bomb(h: &mut Healer) -> Option<usize> {
    match h.check_fork_bomb() {
        Ok(Some(r)) => {
            println!(
                "REPAIRED fork bomb: culprit {}, {} killed in {:.1} ms ({} pass(es))",
                r.culprit,
                r.killed.len(),
                r.total_ms,
                r.passes
            );
            Some(r.killed.len())
        }
        Ok(None) => None,
        Err(e) => {
            println!("heal: {e}");
            None
        }
    }
}

/// Copies what the watch saw into what `--metrics` shows.
fn publish(
    shown: &Mutex<OrionWatch>,
    view: &View,
    value: Option<u64>,
    state: Liveness,
    transition: bool,
    killed: Option<usize>,
) {
    let mut w = shown
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    w.value = value;
    w.implicit.clone_from(&view.implicit);
    w.explicit_sensors = view.sensors.len();
    w.state = match state {
        Liveness::Alive => "alive",
        Liveness::Suspect { .. } => "suspect",
        Liveness::Dead { .. } => "dead",
    };
    w.fetches += 1;
    w.transitions += u64::from(transition);
    if let Some(k) = killed {
        w.repairs += 1;
        w.killed += k as u64;
    }
}

/// SCHED_FIFO for the calling thread (`watch --realtime`), or why not.
fn realtime_boost() -> anyhow::Result<sidecore_orion::repair::FifoBoost> {
    sidecore_orion::repair::FifoBoost::try_new().map_err(|e| {
        anyhow::anyhow!(
            "--realtime: cannot run the monitor at SCHED_FIFO ({e}); run as root or with CAP_SYS_NICE"
        )
    })
}

fn run_watch(cmd: OrionCommand) -> anyhow::Result<ExitCode> {
    let OrionCommand::Watch {
        name,
        dir,
        cgroup,
        sensor,
        refresh_ms,
        k,
        seconds,
        realtime,
        heal,
        whitelist,
        scope,
        log,
        metrics,
        memory_limit,
    } = cmd
    else {
        bail!("not a watch command");
    };
    let cfg = LivenessConfig::new(refresh_ms.saturating_mul(1_000_000), k)?;
    let sensor = sensor.unwrap_or_else(|| {
        if cgroup.is_some() {
            "cpu.usage_usec"
        } else {
            "stat.ctxt"
        }
        .to_owned()
    });
    let mut mon = open(name.as_deref(), &dir, cgroup.as_ref())?;
    let mut healer = match (&cgroup, heal) {
        (Some(cg), true) => Some(healer(cg, whitelist, &scope, log)?),
        _ => None,
    };
    let mut det = SlopeDetector::new(cfg);
    let shown = Arc::new(Mutex::new(OrionWatch {
        target: cgroup
            .as_ref()
            .map_or_else(|| "host".to_string(), |c| c.display().to_string()),
        sensor: sensor.clone(),
        ..OrionWatch::default()
    }));
    let watched = Arc::clone(&shown);
    // Copied each refresh only when someone can scrape it.
    let shown = metrics.metrics.is_some().then_some(shown);
    let _metrics = metrics.start(Arc::new(move || {
        sidecore_observe::exporters::orion(
            &watched
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }))?;
    let mut rate = Rate::new(1_000_000_000);
    println!(
        "watching `{sensor}` every {refresh_ms} ms, k = {k}: a target without progress for {} ms is declared dead",
        refresh_ms * u64::from(k)
    );
    // Boosted last, so threads started above (metrics, sensors) keep their
    // normal policy (a new thread inherits its creator's).
    let _rt = realtime.then(realtime_boost).transpose()?;
    let start = Instant::now();
    let mut next_print = Instant::now();
    while seconds.is_none_or(|s| start.elapsed() < Duration::from_secs(s)) {
        let view = mon.fetch();
        mon.flush(&view);
        let value = view.value(&sensor);
        if let Some(v) = value {
            rate.push(view.at_ns, v);
        }
        let t = det.observe(view.at_ns, value);
        if let Some(t) = &t {
            print_transition(t, &sensor, k);
        }
        let memory = memory_limit
            .zip(view.value("memory.usage_bytes"))
            .map(|(l, u)| (u, l.as_u64()));
        let killed = healer.as_mut().and_then(|h| heal_once(h, memory));
        if let Some(shown) = &shown {
            publish(shown, &view, value, det.state(), t.is_some(), killed);
        }
        if Instant::now() >= next_print {
            next_print += Duration::from_secs(1);
            let r = rate
                .per_second()
                .map_or("-".to_owned(), |r| format!("{r:.0}/s"));
            println!(
                "{sensor} = {} ({r}), {:?}",
                value.map_or("unread".to_owned(), |v| v.to_string()),
                det.state()
            );
            for e in &view.errors {
                println!("  unread: {e}");
            }
        }
        std::thread::sleep(Duration::from_millis(refresh_ms));
    }
    Ok(ExitCode::SUCCESS)
}
