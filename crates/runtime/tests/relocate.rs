//! Moving one PE's offcodes out of a running app (`Runtime::relocate`), through
//! the real runtime and solver: `record-source (host) → relay (a core) →
//! inet-checksum (host)`. The app is planned again without the relay's core and
//! only the relay moves; the source and the sink are rewired in place, so they
//! never stop, restart or lose their counts, and records flow through the new
//! relay. Relocations that cannot be done alone are refused with the reason,
//! and leave the app as it was.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{inventory, kinds, offcode, serial, wait};
use sidecore_offcode::Registry;
use sidecore_pe::Inventory;
use sidecore_runtime::{EventKind, Plan, RelocateError, Runtime, RuntimeConfig};

const MANIFEST: &str = r#"
[app]
name = "moving"

[[offcode]]
name = "source"
id = "00000000-0000-4000-8000-000000000001"
impl = "record-source"
cpu = 0.1
outputs = ["out"]
params = { record_size = 64, rate = 20000 }
  [[offcode.target]]
  kind = "host"

[[offcode]]
name = "relay"
id = "00000000-0000-4000-8000-000000000002"
impl = "inet-checksum"
cpu = 0.1
inputs = ["in"]
outputs = ["out"]
  [[offcode.target]]
  kind = "core"
  [[offcode.target]]
  kind = "host"

[[offcode]]
name = "sum"
id = "00000000-0000-4000-8000-000000000003"
impl = "inet-checksum"
cpu = 0.1
inputs = ["in"]
  [[offcode.target]]
  kind = "host"

[[channel]]
name = "a"
from = "source.out"
to = "relay.in"

[[channel]]
name = "b"
from = "relay.out"
to = "sum.in"
"#;

fn plan(dir: &Path, inv: &Inventory) -> Plan {
    let p = dir.join("moving.toml");
    std::fs::write(&p, MANIFEST).unwrap();
    let m = sidecore_manifest::load(&p).unwrap_or_else(|e| panic!("{}", e.render(false)));
    let mut reg = Registry::new();
    sidecore_builtins::register(&mut reg);
    sidecore_runtime::plan_manifest(&m, inv, &reg, &Default::default()).unwrap()
}

/// How many times offcode `o` of the app started.
fn started(rt: &Runtime, o: &str) -> usize {
    kinds(rt, "moving", o)
        .iter()
        .filter(|k| matches!(k, EventKind::Started))
        .count()
}

/// Deploys the pipeline; returns the runtime, the app, the relay's core and a
/// plan made without that core.
fn deployed(dir: &Path) -> (Arc<Runtime>, u64, String, Plan) {
    let rt = Runtime::new(RuntimeConfig::default());
    let inv = inventory();
    let first = plan(dir, &inv);
    let id = rt.deploy(&first).unwrap();
    let core = offcode(&rt, "relay").pe;
    assert!(core.starts_with("core:"), "relay on {core}");
    assert!(
        wait(|| offcode(&rt, "sum").handled > 1_000, 20),
        "{:?}",
        rt.status()
    );
    let mut without = inv.clone();
    without.pes.retain(|p| p.id != core);
    let second = plan(dir, &without);
    (rt, id, core, second)
}

#[test]
fn only_the_moved_offcode_restarts_and_its_neighbours_run_on() {
    let _s = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (rt, id, core, second) = deployed(dir);
    let before = (offcode(&rt, "source"), offcode(&rt, "sum"));

    let moved = rt.relocate(id, &core, &second).unwrap();
    let to = second.offcodes[1].pe.clone();
    assert_ne!(to, core);
    assert_eq!(moved, [("relay".to_string(), to.clone())]);

    // Records flow through the new relay into the same sink.
    let relay = offcode(&rt, "relay");
    assert_eq!(relay.pe, to);
    assert!(
        wait(|| offcode(&rt, "relay").handled > 1_000, 20),
        "the new relay never carried records: {:?}",
        rt.status()
    );
    let after = (offcode(&rt, "source"), offcode(&rt, "sum"));
    assert!(
        after.1.handled > before.1.handled + 1_000,
        "{before:?} {after:?}"
    );
    // The neighbours never stopped: counters and uptimes went on.
    assert!(after.0.sent > before.0.sent, "{before:?} {after:?}");
    assert!(
        after.0.uptime_ms > before.0.uptime_ms,
        "{before:?} {after:?}"
    );
    assert_eq!(rt.status().len(), 1);
    assert_eq!(rt.status()[0].id, id);
    for o in ["source", "sum"] {
        assert_eq!(started(&rt, o), 1, "{o} started again");
    }
    // The relay started twice: once on the core, once where it moved. The old
    // one ended: its input closed when the source was rewired (done), or it was
    // told to stop first, with the reason.
    assert_eq!(
        started(&rt, "relay"),
        2,
        "{:?}",
        kinds(&rt, "moving", "relay")
    );
    let old_ended = |k: &EventKind| match k {
        EventKind::Done => true,
        EventKind::Stopped { reason } => reason == &format!("re-placed off {core}"),
        _ => false,
    };
    assert!(
        wait(|| kinds(&rt, "moving", "relay").iter().any(old_ended), 10),
        "{:?}",
        kinds(&rt, "moving", "relay")
    );
    assert_eq!(
        offcode(&rt, "relay").state,
        sidecore_runtime::OffcodeState::Running
    );

    // Moved again, off the PE it moved to: the resources of the first move are
    // found under its own node and let go too.
    let mut neither = inventory();
    neither.pes.retain(|p| p.id != core && p.id != to);
    let third = plan(dir, &neither);
    let again = rt.relocate(id, &to, &third).unwrap();
    let last = third.offcodes[1].pe.clone();
    assert_eq!(again, [("relay".to_string(), last.clone())]);
    let h = offcode(&rt, "sum").handled;
    assert!(
        wait(|| offcode(&rt, "relay").handled > 1_000, 20)
            && wait(|| offcode(&rt, "sum").handled > h + 1_000, 20),
        "{:?}",
        rt.status()
    );
    for o in ["source", "sum"] {
        assert_eq!(started(&rt, o), 1, "{o} started again");
    }
    // No executor is left on either core it left.
    assert!(
        wait(
            || !rt
                .tree()
                .live()
                .iter()
                .any(|(_, l, _)| l.starts_with(&format!("executor {core}"))
                    || l.starts_with(&format!("executor {to}"))),
            10
        ),
        "{:?}",
        rt.tree().live()
    );
    rt.stop_app(id).unwrap();
    rt.shutdown();
}

#[test]
fn relocations_that_cannot_be_done_alone_are_refused_and_change_nothing() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let (rt, id, core, second) = deployed(dir.path());
    let refused = |plan: &Plan, dead: &str| match rt.relocate(id, dead, plan) {
        Err(RelocateError::NotAlone(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    };

    // The new layout would move a neighbour too.
    let mut survivor_moves = second.clone();
    survivor_moves.offcodes[0].pe = core.clone();
    let why = refused(&survivor_moves, &core);
    assert!(
        why.contains(&format!("also moves `source` from host to {core}")),
        "{why}"
    );
    // The new layout keeps the relay where it was.
    let mut stays = second.clone();
    stays.offcodes[1].pe = core.clone();
    let why = refused(&stays, &core);
    assert_eq!(why, format!("the new layout keeps `relay` on {core}"));
    // Nothing ran on that PE.
    let why = refused(&second, "node:nowhere");
    assert_eq!(why, "no offcode of it ran on node:nowhere");
    // A plan of another app.
    let mut other = second.clone();
    other.app = "another".into();
    let why = refused(&other, &core);
    assert!(why.contains("not the running app's"), "{why}");

    // The app is as it was: the relay still on its core, records flowing.
    assert_eq!(offcode(&rt, "relay").pe, core);
    let h = offcode(&rt, "sum").handled;
    assert!(wait(|| offcode(&rt, "sum").handled > h + 1_000, 20));
    rt.stop_app(id).unwrap();
    rt.shutdown();
}
