//! The daemon's reaction to a dedicated core declared dead, through a real `Daemon`
//! (its runtime, executors pinned to real cores):
//!
//! - a core declared dead when no other PE can take its offcode: the offcode fails
//!   with the declaration as the reason, and the app stays stopped with an error event
//!   saying why it cannot be re-placed — no panic;
//! - a dead core whose offcode has somewhere to go, beside a lower-priority
//!   survivor on the other core: only the dead core's offcode moves (to the
//!   host), the survivor keeps its core although a free re-solve would have
//!   given that core to the moved, higher-priority offcode;
//! - Orion's real core monitor over an offcode that stalls inside its turn (blocked,
//!   not starved) for far longer than the monitor's deadline: a stuck offcode, said
//!   as such, never a dead core.
//!
//! Both share the process's health board, so they run one at a time.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sidecore_control::{Daemon, DaemonOptions};
use sidecore_offcode::Registry;
use sidecore_orion::core_monitor::CoreMonitor;
use sidecore_orion::core_watch::CoreNote;
use sidecore_orion::detect::LivenessConfig;
use sidecore_orion::health::{self, Declaration};
use sidecore_pe::DiscoverOptions;
use sidecore_types::{AppState, PeKind};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The built-ins, and a checksum that runs on dedicated cores only.
fn registry() -> Registry {
    let mut r = Registry::new();
    sidecore_builtins::register(&mut r);
    let mut only_core = r.get("inet-checksum").unwrap().clone();
    only_core.name = "core-only-checksum".into();
    only_core.kinds = vec![PeKind::Core];
    r.register(only_core);
    r
}

fn daemon() -> Arc<Daemon> {
    let opts = DaemonOptions {
        discover: DiscoverOptions {
            probe_kernel: false,
            probe_wasm: false,
            housekeeping: Some(vec![]),
            ..Default::default()
        },
        ..Default::default()
    };
    let d = Daemon::new(registry(), opts);
    d.follow_health();
    d
}

/// The highest dedicated core of this machine.
fn a_core(d: &Daemon) -> u32 {
    let inv = d.inventory();
    let cores: Vec<u32> = inv
        .pes
        .iter()
        .filter_map(|p| p.id.strip_prefix("core:")?.parse().ok())
        .collect();
    *cores
        .iter()
        .max()
        .unwrap_or_else(|| panic!("no dedicated core on this machine: {inv:?}"))
}

/// source (host) → `relay` (impl `imp`, pinned to `cpu`) → back (host).
fn manifest(dir: &Path, imp: &str, params: &str, cpu: u32) -> PathBuf {
    let p = dir.join(format!("{imp}.toml"));
    std::fs::write(
        &p,
        format!(
            r#"
[app]
name = "pipeline"

[[offcode]]
name = "source"
id = "7d3f1c74-ae63-4a2d-88f4-9d7a0e2b3d01"
impl = "record-source"
outputs = ["out"]
params = {{ record_size = 64, records = 0, rate = 2000 }}
  [[offcode.target]]
  kind = "host"

[[offcode]]
name = "relay"
id = "7d3f1c74-ae63-4a2d-88f4-9d7a0e2b3d02"
impl = "{imp}"
inputs = ["in"]
outputs = ["out"]
params = {{ {params} }}
  [[offcode.target]]
  kind = "core"
  require = {{ cpu = {cpu} }}

[[offcode]]
name = "back"
id = "7d3f1c74-ae63-4a2d-88f4-9d7a0e2b3d03"
impl = "inet-checksum"
inputs = ["in"]
  [[offcode.target]]
  kind = "host"

[[channel]]
name = "records"
from = "source.out"
to = "relay.in"
slot_size = 128

[[channel]]
name = "sums"
from = "relay.out"
to = "back.in"
slot_size = 64
"#
        ),
    )
    .unwrap();
    p
}

fn wait_for(cond: impl Fn() -> bool, secs: u64) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn logged(d: &Daemon, what: &str) -> Option<String> {
    d.runtime()
        .events()
        .snapshot()
        .into_iter()
        .map(|e| e.to_string())
        .find(|l| l.contains(what))
}

#[test]
fn a_dead_core_with_nowhere_to_go_stops_its_app_with_a_clear_error() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon();
    let cpu = a_core(&d);
    let pe = format!("core:{cpu}");
    let r = d
        .up(&manifest(dir.path(), "core-only-checksum", "", cpu))
        .unwrap();
    assert!(
        r.placements
            .iter()
            .any(|(o, at, _)| o == "relay" && *at == pe),
        "{:?}",
        r.placements
    );
    assert!(health::declare(Declaration {
        pe: pe.clone(),
        by: "test".into(),
        dead: true,
        evidence: format!("core {cpu}: declared by the test"),
    }));
    let failed = format!(
        "pipeline/relay: failed: {pe} declared dead by the Orion monitor of test: core {cpu}: declared by the test"
    );
    assert!(
        wait_for(|| logged(&d, &failed).is_some(), 10),
        "{:#?}",
        d.runtime().events().snapshot()
    );
    let nowhere = format!("cannot re-place without {pe}: ");
    assert!(
        wait_for(|| logged(&d, &nowhere).is_some(), 20),
        "{:#?}",
        d.runtime().events().snapshot()
    );
    let line = logged(&d, &nowhere).unwrap();
    assert!(
        line.contains("`relay`") && line.contains("no PE can run it"),
        "{line}"
    );
    assert!(
        !d.runtime()
            .status()
            .iter()
            .any(|a| a.name == "pipeline" && a.state == AppState::Running),
        "{:?}",
        d.runtime().status()
    );
    // The core back, for the other test.
    health::declare(Declaration {
        pe,
        by: "test".into(),
        dead: false,
        evidence: String::new(),
    });
    d.stop_all();
}

#[test]
fn an_offcode_stalled_inside_its_turn_is_not_a_dead_core() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon();
    let cpu = a_core(&d);
    let notes = Arc::new(Mutex::new(Vec::new()));
    let n = Arc::clone(&notes);
    // Deadline 8 × 25 ms = 200 ms; the offcode stalls (blocked) for 1.5 s.
    let cfg = LivenessConfig::new(25_000_000, 8).unwrap();
    let _monitor = CoreMonitor::start(
        cfg,
        "test",
        Box::new(move |note: &CoreNote| n.lock().unwrap().push(note.clone())),
    )
    .unwrap();
    let params = r#"fail_after = 200, fail = "stall", stall_ms = 1500, failing_lives = 1"#;
    d.up(&manifest(dir.path(), "fault-injector", params, cpu))
        .unwrap();
    let stuck = |n: &CoreNote| matches!(n, CoreNote::Stuck { cpu: c, .. } if *c == cpu);
    assert!(
        wait_for(|| notes.lock().unwrap().iter().any(stuck), 20),
        "the stall was never seen: {:?}",
        notes.lock().unwrap()
    );
    // Well past the stall's end.
    std::thread::sleep(Duration::from_millis(2000));
    let pe = format!("core:{cpu}");
    assert!(!health::is_dead(&pe), "{:?}", notes.lock().unwrap());
    assert!(
        !notes
            .lock()
            .unwrap()
            .iter()
            .any(|n| matches!(n, CoreNote::Declared { .. })),
        "{:?}",
        notes.lock().unwrap()
    );
    d.stop_all();
}

/// source (host) → `low` (a core, or the host) → `high` (a core, or the host) →
/// back (host), each relay wanting a whole core.
fn two_relays(dir: &Path) -> PathBuf {
    let p = dir.join("two.toml");
    let relay = |name: &str, n: u32, priority: &str| {
        format!(
            "[[offcode]]\nname = \"{name}\"\nid = \"7d3f1c74-ae63-4a2d-88f4-9d7a0e2b3e{n:02}\"\n\
             impl = \"inet-checksum\"\npriority = \"{priority}\"\ncpu = 1.0\n\
             inputs = [\"in\"]\noutputs = [\"out\"]\n\
             [[offcode.target]]\nkind = \"core\"\n[[offcode.target]]\nkind = \"host\"\n"
        )
    };
    let text = format!(
        "[app]\nname = \"two\"\n\
         [[offcode]]\nname = \"source\"\nid = \"7d3f1c74-ae63-4a2d-88f4-9d7a0e2b3e01\"\n\
         impl = \"record-source\"\noutputs = [\"out\"]\n\
         params = {{ record_size = 64, records = 0, rate = 2000 }}\n\
         [[offcode.target]]\nkind = \"host\"\n\
         {}{}\
         [[offcode]]\nname = \"back\"\nid = \"7d3f1c74-ae63-4a2d-88f4-9d7a0e2b3e04\"\n\
         impl = \"inet-checksum\"\ninputs = [\"in\"]\n[[offcode.target]]\nkind = \"host\"\n\
         [[channel]]\nname = \"a\"\nfrom = \"source.out\"\nto = \"low.in\"\nslot_size = 128\n\
         [[channel]]\nname = \"b\"\nfrom = \"low.out\"\nto = \"high.in\"\nslot_size = 64\n\
         [[channel]]\nname = \"c\"\nfrom = \"high.out\"\nto = \"back.in\"\nslot_size = 64\n",
        relay("low", 2, "low"),
        relay("high", 3, "high"),
    );
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_dead_core_moves_only_its_offcode_and_the_survivor_keeps_its_core() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon();
    let cores: Vec<String> = d
        .inventory()
        .pes
        .iter()
        .filter(|p| p.kind == PeKind::Core)
        .map(|p| p.id.clone())
        .collect();
    if cores.len() < 2 {
        eprintln!("skipped: needs two dedicated cores, found {cores:?}");
        return;
    }
    let r = d.up(&two_relays(dir.path())).unwrap();
    let at = |name: &str| {
        d.runtime().status_of(r.id).and_then(|a| {
            a.offcodes
                .iter()
                .find(|o| o.name == name)
                .map(|o| o.pe.clone())
        })
    };
    let (low, high) = (at("low").unwrap(), at("high").unwrap());
    assert!(
        low.starts_with("core:") && high.starts_with("core:") && low != high,
        "{:?}",
        r.placements
    );
    let handled = |name: &str| {
        d.runtime()
            .status_of(r.id)
            .and_then(|a| {
                a.offcodes
                    .iter()
                    .find(|o| o.name == name)
                    .map(|o| o.handled)
            })
            .unwrap_or(0)
    };
    assert!(wait_for(|| handled("back") > 100, 20));
    assert!(health::declare(Declaration {
        pe: high.clone(),
        by: "test".into(),
        dead: true,
        evidence: "declared by the test".into(),
    }));
    let moved = format!(
        "re-placed only the offcodes on {high} (id {} kept, the rest ran on): high → host",
        r.id
    );
    let ok = wait_for(|| logged(&d, &moved).is_some(), 20);
    // The core back, for the other tests, before any assertion can fail.
    health::declare(Declaration {
        pe: high.clone(),
        by: "test".into(),
        dead: false,
        evidence: String::new(),
    });
    assert!(ok, "{:#?}", d.runtime().events().snapshot());
    assert_eq!(
        at("low").as_deref(),
        Some(low.as_str()),
        "the survivor kept its core"
    );
    let h = handled("back");
    assert!(
        wait_for(|| handled("back") > h + 100, 20),
        "records never flowed again: {:?}",
        d.runtime().status_of(r.id)
    );
    d.stop_all();
}
