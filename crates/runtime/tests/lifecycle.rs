//! The deployment life cycle through the real runtime: manifests are planned by
//! the real solver onto this machine's real cores and threads, offcodes run on
//! pinned executors, and the assertions read the runtime's event log and
//! status. Covered: two-phase start, priority order, host fallback, watchdog
//! (a slow turn and a turn stuck right now), obsolete-time reaping, rollback
//! of a failed deployment, teardown that leaves no thread behind, and the
//! checksum pipeline end to end.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{inventory, kinds, serial};
use sidecore_offcode::{
    Implementation, InitCx, Interfaces, Offcode, OffcodeError, Progress, Registry, RunCx,
};
use sidecore_pe::Inventory;
use sidecore_runtime::{AppState, EventKind, OffcodeState, Runtime, RuntimeConfig};
use sidecore_types::PeKind;

/// An offcode that idles (and can be told to stall or fail).
struct Probe {
    stall_until: Option<Arc<AtomicBool>>,
    stall_for: Option<Duration>,
    fail_init: bool,
    stalled: bool,
}

impl Offcode for Probe {
    fn initialize(&mut self, _cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        if self.fail_init {
            return Err(OffcodeError::failed("cannot open the device"));
        }
        Ok(())
    }
    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        if !self.stalled {
            if let Some(d) = self.stall_for {
                self.stalled = true;
                std::thread::sleep(d);
            }
            if let Some(flag) = &self.stall_until {
                self.stalled = true;
                // Stuck until the watchdog has noticed (bounded for safety).
                let t0 = Instant::now();
                while !flag.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        Ok(Progress::Idle)
    }
}

fn registry(stall_flag: Option<Arc<AtomicBool>>) -> Registry {
    let mut r = Registry::new();
    sidecore_builtins::register(&mut r);
    let mk = move |name: &str,
                   stall_for: Option<Duration>,
                   stall_until: Option<Arc<AtomicBool>>,
                   fail_init: bool| Implementation {
        name: name.into(),
        description: "test probe".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: None,
        outputs: None,
        factory: Arc::new(move |_| {
            Ok(Box::new(Probe {
                stall_until: stall_until.clone(),
                stall_for,
                fail_init,
                stalled: false,
            }))
        }),
        validate: None,
        interfaces: Interfaces::default(),
    };
    r.register(mk("probe", None, None, false));
    r.register(mk("slow", Some(Duration::from_millis(300)), None, false));
    r.register(mk("stuck", None, stall_flag, false));
    r.register(mk("broken", None, None, true));
    r
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn offcode(name: &str, n: u32, imp: &str, extra: &str, kinds: &[&str]) -> String {
    let cpu = if extra.contains("cpu =") {
        ""
    } else {
        "cpu = 0.1\n"
    };
    let mut s = format!(
        "[[offcode]]\nname = \"{name}\"\nid = \"00000000-0000-4000-8000-{n:012}\"\nimpl = \"{imp}\"\n{cpu}{extra}\n"
    );
    for k in kinds {
        s.push_str(&format!("[[offcode.target]]\nkind = \"{k}\"\n"));
    }
    s
}

fn deploy(rt: &Runtime, reg: &Registry, manifest: &Path) -> Result<u64, String> {
    let m = sidecore_manifest::load(manifest).map_err(|e| e.render(false))?;
    let plan = sidecore_runtime::plan_manifest(&m, &inventory(), reg, &Default::default())
        .map_err(|e| e.to_string())?;
    rt.deploy(&plan).map_err(|e| e.to_string())
}

fn position(rt: &Runtime, app: &str, offcode: &str, want: &EventKind) -> usize {
    rt.events()
        .of_app(app)
        .iter()
        .position(|e| e.offcode == offcode && &e.kind == want)
        .unwrap_or_else(|| panic!("no {want:?} for {offcode}: {:#?}", rt.events().of_app(app)))
}

/// Executor threads alive in this process (named `sc-<PE>` by the runtime).
/// Counted by name, because the test harness starts and ends its own threads.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("sc-") && !name.starts_with("sc-supervisor"))
        .count()
}

#[test]
fn two_phase_start_waits_for_the_whole_group_and_goes_by_priority() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // Declared low, normal, high; a, b, c are related through imports; d is alone.
    let text = format!(
        "[app]\nname = \"phases\"\n{}{}{}{}",
        offcode(
            "a",
            1,
            "probe",
            "priority = \"low\"\n[[offcode.import]]\noffcode = \"b\"",
            &["host"]
        ),
        offcode(
            "b",
            2,
            "probe",
            "priority = \"normal\"\n[[offcode.import]]\noffcode = \"c\"\nconstraint = \"link\"",
            &["host"]
        ),
        offcode("c", 3, "probe", "priority = \"high\"", &["host"]),
        offcode("d", 4, "probe", "priority = \"normal\"", &["host"]),
    );
    let m = write(dir.path(), "phases.toml", &text);
    let rt = Runtime::new(RuntimeConfig::default());
    let reg = registry(None);
    let id = deploy(&rt, &reg, &m).unwrap();

    // Priority order of landing: c (high), then b and d (normal, manifest order), then a (low).
    let init: Vec<String> = rt
        .events()
        .of_app("phases")
        .into_iter()
        .filter(|e| e.kind == EventKind::Initialized)
        .map(|e| e.offcode)
        .collect();
    assert_eq!(init, vec!["c", "b", "d", "a"]);

    // Two phases: no member of {a, b, c} starts before all three are initialized.
    let last_init = ["a", "b", "c"]
        .iter()
        .map(|o| position(&rt, "phases", o, &EventKind::Initialized))
        .max()
        .unwrap();
    for o in ["a", "b", "c"] {
        assert!(
            position(&rt, "phases", o, &EventKind::Started) > last_init,
            "{o} started early"
        );
    }
    // d is unrelated: it starts as soon as it has landed, before a lands.
    assert!(
        position(&rt, "phases", "d", &EventKind::Started)
            < position(&rt, "phases", "a", &EventKind::Initialized)
    );
    let st = rt.status();
    assert!(
        st[0]
            .offcodes
            .iter()
            .all(|o| o.state == OffcodeState::Running)
    );
    rt.stop_app(id).unwrap();
    rt.shutdown();
}

#[test]
fn falls_back_to_the_host_when_no_pe_fits() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // Wants a GPU (none here, or no implementation for it) and then a core that does not exist.
    let text = format!(
        "{}[[offcode.target]]\nkind = \"core\"\nrequire = {{ cpu = 4095 }}\n",
        offcode("x", 1, "probe", "", &["gpu"])
    );
    let m = write(dir.path(), "fb.toml", &text);
    let reg = registry(None);
    let manifest = sidecore_manifest::load(&m).unwrap();
    let plan = sidecore_runtime::plan_manifest(&manifest, &inventory(), &reg, &Default::default())
        .unwrap();
    assert_eq!(plan.offcodes[0].pe, "host");
    let why = plan.offcodes[0]
        .fallback
        .clone()
        .expect("a fallback reason");
    assert!(why.contains("gpu"), "{why}");
    assert!(
        why.contains("cpu = 4095") || why.contains("required 4095"),
        "{why}"
    );
    let rt = Runtime::new(RuntimeConfig::default());
    let id = rt.deploy(&plan).unwrap();
    assert!(
        kinds(&rt, "fb", "x")
            .iter()
            .any(|k| matches!(k, EventKind::Fallback { .. }))
    );
    assert_eq!(rt.status()[0].offcodes[0].state, OffcodeState::Running);
    rt.stop_app(id);
    rt.shutdown();
}

#[test]
fn watchdog_stops_an_offcode_whose_turn_overran_its_period() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[app]\nname = \"wd\"\n{}{}",
        offcode("slow", 1, "slow", "watchdog_ms = 50", &["host"]),
        offcode("fine", 2, "probe", "watchdog_ms = 50", &["host"]),
    );
    let m = write(dir.path(), "wd.toml", &text);
    let rt = Runtime::new(RuntimeConfig::default());
    let reg = registry(None);
    let id = deploy(&rt, &reg, &m).unwrap();
    let t0 = Instant::now();
    while rt.status()[0].offcodes[0].state != OffcodeState::Failed
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = rt.status();
    assert_eq!(
        st[0].offcodes[0].state,
        OffcodeState::Failed,
        "{:#?}",
        rt.events().of_app("wd")
    );
    assert!(
        kinds(&rt, "wd", "slow")
            .iter()
            .any(|k| matches!(k, EventKind::WatchdogExpired { period_ms: 50, .. }))
    );
    // Reported, then stopped once its turn returned.
    let t0 = Instant::now();
    while !kinds(&rt, "wd", "slow")
        .iter()
        .any(|k| matches!(k, EventKind::Stopped { .. }))
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stopped = kinds(&rt, "wd", "slow");
    assert!(
        stopped
            .iter()
            .any(|k| matches!(k, EventKind::Stopped { reason } if reason.contains("watchdog"))),
        "{stopped:?}"
    );
    // Its neighbour keeps running.
    assert_eq!(rt.status()[0].offcodes[1].state, OffcodeState::Running);
    rt.stop_app(id);
    rt.shutdown();
}

#[test]
fn watchdog_catches_an_offcode_stuck_in_its_turn_now() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[app]\nname = \"stuck\"\n{}",
        offcode("s", 1, "stuck", "watchdog_ms = 30", &["core", "host"])
    );
    let m = write(dir.path(), "stuck.toml", &text);
    let flag = Arc::new(AtomicBool::new(false));
    let rt = Runtime::new(RuntimeConfig::default());
    let f = Arc::clone(&flag);
    rt.events().subscribe(move |e| {
        if e.offcode == "s" && matches!(e.kind, EventKind::WatchdogExpired { .. }) {
            f.store(true, Ordering::Release);
        }
    });
    let reg = registry(Some(Arc::clone(&flag)));
    let id = deploy(&rt, &reg, &m).unwrap();
    // The offcode stays stuck until the supervisor reports it, so reaching
    // `Stopped` proves the report came while it was stuck.
    assert!(
        rt.wait_finished(id, Duration::from_secs(30)),
        "{:#?}",
        rt.events().of_app("stuck")
    );
    assert!(flag.load(Ordering::Acquire));
    let k = kinds(&rt, "stuck", "s");
    let wd = k
        .iter()
        .position(|k| matches!(k, EventKind::WatchdogExpired { .. }))
        .unwrap();
    let stop = k
        .iter()
        .position(|k| matches!(k, EventKind::Stopped { .. }))
        .unwrap();
    assert!(wd < stop, "{k:?}");
    assert_eq!(rt.status()[0].offcodes[0].state, OffcodeState::Failed);
    assert_eq!(rt.status()[0].state, AppState::Finished);
    rt.stop_app(id);
    rt.shutdown();
}

#[test]
fn obsolete_offcodes_are_reaped() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[app]\nname = \"old\"\n{}{}",
        offcode("short", 1, "probe", "obsolete_ms = 100", &["host"]),
        offcode("long", 2, "probe", "", &["host"]),
    );
    let m = write(dir.path(), "old.toml", &text);
    let rt = Runtime::new(RuntimeConfig::default());
    let reg = registry(None);
    let id = deploy(&rt, &reg, &m).unwrap();
    let t0 = Instant::now();
    while !rt.status()[0].offcodes[0].state.is_final() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = rt.status();
    assert_eq!(st[0].offcodes[0].state, OffcodeState::Stopped);
    assert!(
        st[0].offcodes[0]
            .stop_reason
            .as_deref()
            .unwrap()
            .contains("obsolete after 100 ms")
    );
    assert!(kinds(&rt, "old", "short").contains(&EventKind::Obsolete { lifetime_ms: 100 }));
    assert_eq!(
        st[0].offcodes[1].state,
        OffcodeState::Running,
        "the other one lives on"
    );
    rt.stop_app(id);
    rt.shutdown();
}

#[test]
fn a_failed_deployment_rolls_back_everything() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[app]\nname = \"bad\"\n{}{}",
        offcode("ok", 1, "probe", "priority = \"high\"", &["core", "host"]),
        offcode("bad", 2, "broken", "", &["host"]),
    );
    let m = write(dir.path(), "bad.toml", &text);
    let rt = Runtime::new(RuntimeConfig::default());
    let before = threads();
    let reg = registry(None);
    let e = deploy(&rt, &reg, &m).unwrap_err();
    assert!(
        e.contains("offcode `bad`") && e.contains("cannot open the device"),
        "{e}"
    );
    assert!(rt.tree().live().is_empty(), "{:?}", rt.tree().live());
    assert!(rt.status().is_empty());
    assert!(rt.oob().names().is_empty(), "{:?}", rt.oob().names());
    assert_eq!(threads(), before, "no executor thread left behind");
    rt.shutdown();
}

#[test]
fn stopping_an_app_releases_threads_cores_and_endpoints() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[app]\nname = \"td\"\n{}{}{}",
        offcode("a", 1, "probe", "", &["core"]),
        offcode("b", 2, "probe", "", &["core", "host"]),
        offcode("c", 3, "probe", "", &["host"]),
    );
    let m = write(dir.path(), "td.toml", &text);
    let rt = Runtime::new(RuntimeConfig::default());
    let before = threads();
    let reg = registry(None);
    let id = deploy(&rt, &reg, &m).unwrap();
    assert!(threads() > before);
    assert_eq!(rt.oob().names().len(), 3);
    let released = rt.stop_app(id).unwrap();
    // Children before parents: every offcode before its executor, the app last.
    assert_eq!(released.last().map(String::as_str), Some("app td"));
    let pos = |s: &str| {
        released
            .iter()
            .position(|r| r.starts_with(s))
            .unwrap_or_else(|| panic!("{s} in {released:?}"))
    };
    assert!(pos("offcode a") < pos("executor core:"));
    assert!(pos("offcode c") < pos("executor host/c"));
    assert!(rt.tree().live().is_empty());
    assert!(rt.oob().names().is_empty());
    assert_eq!(threads(), before, "every executor thread joined");
    rt.shutdown();
}

#[test]
fn checksum_pipeline_checksums_every_record_on_two_cores() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 200_000;
    let text = format!(
        "[app]\nname = \"cs\"\n{}{}[[channel]]\nname = \"records\"\nfrom = \"source.out\"\nto = \"sum.in\"\nslots = 1024\nbandwidth = \"1 Gbit/s\"\n",
        offcode(
            "source",
            1,
            "record-source",
            &format!(
                "cpu = 1.0\noutputs = [\"out\"]\nparams = {{ record_size = 64, records = {N} }}"
            ),
            &["core", "host"]
        ),
        offcode(
            "sum",
            2,
            "inet-checksum",
            "cpu = 1.0\ninputs = [\"in\"]",
            &["core", "host"]
        ),
    );
    let m = write(dir.path(), "cs.toml", &text);
    let rt = Runtime::new(RuntimeConfig::default());
    let reg = registry(None);
    let id = deploy(&rt, &reg, &m).unwrap();
    assert!(
        rt.wait_finished(id, Duration::from_secs(60)),
        "{:#?}",
        rt.events().of_app("cs")
    );
    let st = rt.status();
    let sum = &st[0].offcodes[1];
    assert_eq!(sum.state, OffcodeState::Done);
    assert_eq!(sum.metrics["records"], N);
    assert_eq!(sum.metrics["sequence_gaps"], 0);
    let mut expect = 0u64;
    let mut rec = [0u8; 64];
    for i in 0..N {
        sidecore_builtins::source::fill_record(i, &mut rec);
        expect += sidecore_builtins::checksum::inet_checksum(&rec) as u64;
    }
    assert_eq!(
        sum.metrics["checksum_sum"], expect,
        "every record checksummed exactly once"
    );
    let cores = sidecore_pe::cores::allowed_cpus().len();
    if cores >= 2 {
        assert!(
            st[0].offcodes.iter().all(|o| o.pe.starts_with("core:")),
            "{:?}",
            st[0].offcodes
        );
        assert_ne!(
            st[0].offcodes[0].pe, st[0].offcodes[1].pe,
            "each on its own core"
        );
    }
    rt.stop_app(id);
    rt.shutdown();
}

#[test]
fn the_final_status_of_a_stopped_app_is_read_at_rest() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // An endless source: its counters are moving when the app is stopped.
    let text = format!(
        "[app]\nname = \"rest\"\n{}{}[[channel]]\nname = \"records\"\nfrom = \"source.out\"\nto = \"sum.in\"\nslots = 256\n",
        offcode(
            "source",
            1,
            "record-source",
            "outputs = [\"out\"]\nparams = { record_size = 64 }",
            &["host"]
        ),
        offcode("sum", 2, "inet-checksum", "inputs = [\"in\"]", &["host"]),
    );
    let m = write(dir.path(), "rest.toml", &text);
    let rt = Runtime::new(RuntimeConfig::default());
    let reg = registry(None);
    let id = deploy(&rt, &reg, &m).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (released, last) = rt.stop_app_with_status(id).unwrap();
    assert_eq!(released.last().map(String::as_str), Some("app rest"));
    assert_eq!(last.state, AppState::Stopped);
    let by = |n: &str| last.offcodes.iter().find(|o| o.name == n).unwrap();
    let (src, sum) = (by("source"), by("sum"));
    assert!(src.state != OffcodeState::Running && sum.state != OffcodeState::Running);
    let got = sum.metrics["records"];
    assert!(got > 0, "{last:?}");
    // Read at rest: the sink can never be ahead of its source, and the ring holds
    // at most its 256 slots of what the source sent.
    assert!(src.metrics["records"] >= got, "{last:?}");
    // The source's own count is what actually left it, even when the stop came in
    // the middle of a batch.
    assert_eq!(src.metrics["records"], src.sent, "{last:?}");
    assert!(src.metrics["records"] - got <= 256, "{last:?}");
    assert_eq!(sum.metrics["sequence_gaps"], 0);
    assert!(rt.status().is_empty(), "the stopped app is forgotten");
    assert!(rt.stop_app_with_status(id).is_none());
    rt.shutdown();
}

#[test]
fn unreliable_channels_count_drops_reliable_ones_never_drop() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    for (delivery, name) in [("unreliable", "unrel"), ("reliable", "rel")] {
        let text = format!(
            "[app]\nname = \"{name}\"\n{}{}[[channel]]\nname = \"records\"\nfrom = \"source.out\"\nto = \"sum.in\"\nslots = 16\ndelivery = \"{delivery}\"\n",
            offcode(
                "source",
                1,
                "record-source",
                "outputs = [\"out\"]\nparams = { record_size = 64, records = 100000 }",
                &["host"]
            ),
            offcode(
                "sum",
                2,
                "inet-checksum",
                "inputs = [\"in\"]\nparams = { check_sequence = true }",
                &["host"]
            ),
        );
        let m = write(dir.path(), &format!("{name}.toml"), &text);
        let rt = Runtime::new(RuntimeConfig::default());
        let reg = registry(None);
        let id = deploy(&rt, &reg, &m).unwrap();
        assert!(rt.wait_finished(id, Duration::from_secs(60)));
        let st = rt.status();
        let (src, sum) = (&st[0].offcodes[0], &st[0].offcodes[1]);
        let received = sum.metrics["records"];
        assert_eq!(src.metrics["records"], 100_000);
        if delivery == "reliable" {
            assert_eq!(src.dropped, 0);
            assert_eq!(received, 100_000);
            assert_eq!(sum.metrics["sequence_gaps"], 0);
        } else {
            assert_eq!(
                received + src.dropped,
                100_000,
                "every record is received or counted as dropped"
            );
        }
        rt.stop_app(id);
        rt.shutdown();
    }
}

/// The machine's PEs plus a peer node at `addr` (as discovery would list a
/// peer that answered its hello).
fn inventory_with_peer(addr: &str) -> Inventory {
    let mut inv = inventory();
    let mut props = std::collections::BTreeMap::new();
    props.insert("name".into(), sidecore_types::PropValue::Str("peer".into()));
    props.insert("addr".into(), sidecore_types::PropValue::Str(addr.into()));
    inv.pes.push(sidecore_pe::Pe {
        id: "node:peer".into(),
        kind: PeKind::Node,
        props,
        capacity: sidecore_pe::Capacity {
            cpu: 2.0,
            memory_bytes: 1 << 30,
            slots: None,
        },
        link: None,
        detail: "test peer".into(),
    });
    inv
}

#[test]
fn remote_parts_refuse_unsupported_channels_and_vanished_peers() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(None);
    // A port nobody listens on: the peer went away after discovery.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = gone.local_addr().unwrap().to_string();
    drop(gone);
    let inv = inventory_with_peer(&addr);
    let rt = Runtime::new(RuntimeConfig::default());
    let try_deploy = |text: &str| -> String {
        let m = write(dir.path(), "remote.toml", text);
        let manifest = sidecore_manifest::load(&m).unwrap();
        let plan =
            sidecore_runtime::plan_manifest(&manifest, &inv, &reg, &Default::default()).unwrap();
        rt.deploy(&plan).map(|_| ()).unwrap_err().to_string()
    };
    let src = "[[offcode]]\nname = \"src\"\nid = \"00000000-0000-4000-8000-000000000001\"\nimpl = \"record-source\"\noutputs = [\"out\"]\n[[offcode.target]]\nkind = \"host\"\n";
    let sink = |name: &str, n: u32, kind: &str| {
        format!(
            "[[offcode]]\nname = \"{name}\"\nid = \"00000000-0000-4000-8000-{n:012}\"\nimpl = \"inet-checksum\"\ninputs = [\"in\"]\n[[offcode.target]]\nkind = \"{kind}\"\n"
        )
    };

    // Multicast to one receiver here and one on the peer.
    let e = try_deploy(&format!(
        "{src}{}{}[[channel]]\nname = \"fan\"\nfrom = \"src.out\"\nto = [\"a.in\", \"b.in\"]\ncast = \"multicast\"\n",
        sink("a", 2, "host"),
        sink("b", 3, "node")
    ));
    assert!(
        e.contains("channel `fan`") && e.contains("receivers are on different machines"),
        "{e}"
    );

    // A plain pipeline onto the vanished peer: refused with the peer named,
    // and nothing of it is left running here.
    let e = try_deploy(&format!(
        "{src}{}[[channel]]\nname = \"p\"\nfrom = \"src.out\"\nto = \"a.in\"\n",
        sink("a", 2, "node")
    ));
    assert!(
        e.contains("peer node:peer") && e.contains("cannot reach"),
        "{e}"
    );
    assert!(rt.status().is_empty());
    rt.shutdown();
}

/// A kernel PE that answered its probe still takes no offcode this build
/// cannot load: an artifact for the kernel with no BPF loader registered is
/// refused at planning, with the reason, and never reaches a deployment.
#[test]
fn no_placement_where_the_artifact_cannot_load() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(None);
    let mut inv = inventory();
    inv.pes.push(sidecore_pe::Pe {
        id: "kernel".into(),
        kind: PeKind::Kernel,
        props: Default::default(),
        capacity: sidecore_pe::Capacity {
            cpu: 2.0,
            memory_bytes: 1 << 30,
            slots: None,
        },
        link: None,
        detail: "test kernel".into(),
    });
    std::fs::write(dir.path().join("fw.bpf.o"), b"\x7fELF").unwrap();
    let m = write(
        dir.path(),
        "kernel.toml",
        &format!(
            "{}module = \"fw.bpf.o\"\n",
            offcode("fw", 1, "firewall", "", &["kernel"])
        ),
    );
    let manifest = sidecore_manifest::load(&m).unwrap();
    let e = sidecore_runtime::plan_manifest(&manifest, &inv, &reg, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("offcode `fw`")
            && e.contains("kernel: this sidecore has no loader for kernel modules"),
        "{e}"
    );
}
