//! Restarts owned by the supervisor, through the real runtime: a pipeline
//! `record-source → fault-injector → inet-checksum` planned by the real
//! solver onto this machine's cores and threads, whose middle fails on
//! purpose. With `restart = "on-failure"` it is restarted on its PE with its
//! channels still attached, and every record still arrives once, in order;
//! past its limit it stays failed; a watchdog expiry restarts it too; without
//! a policy nothing changes (HYDRA's watchdog disposes of it).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::path::Path;
use std::time::Duration;

use common::{inventory, kinds, offcode, serial, wait};
use sidecore_offcode::Registry;
use sidecore_runtime::{AppState, EventKind, OffcodeState, Runtime, RuntimeConfig};

/// The pipeline, `records` records, the middle with `fault` fields.
fn pipeline(app: &str, records: u64, fault: &str) -> String {
    let oc = |name: &str, n: u32, imp: &str, extra: &str| {
        format!(
            "[[offcode]]\nname = \"{name}\"\nid = \"00000000-0000-4000-8000-{n:012}\"\nimpl = \"{imp}\"\ncpu = 0.1\n{extra}\n[[offcode.target]]\nkind = \"core\"\n[[offcode.target]]\nkind = \"host\"\n"
        )
    };
    let records = if records == 0 {
        String::new()
    } else {
        format!(", records = {records}")
    };
    format!(
        "[app]\nname = \"{app}\"\n{}{}{}\
         [[channel]]\nname = \"a\"\nfrom = \"source.out\"\nto = \"fault.in\"\nslots = 256\n\
         [[channel]]\nname = \"b\"\nfrom = \"fault.out\"\nto = \"sum.in\"\nslots = 256\n",
        oc(
            "source",
            1,
            "record-source",
            &format!("outputs = [\"out\"]\nparams = {{ record_size = 64{records} }}")
        ),
        oc(
            "fault",
            2,
            "fault-injector",
            &format!("inputs = [\"in\"]\noutputs = [\"out\"]\n{fault}")
        ),
        oc("sum", 3, "inet-checksum", "inputs = [\"in\"]"),
    )
}

fn deploy(rt: &Runtime, dir: &Path, text: &str) -> u64 {
    let p = dir.join("m.toml");
    std::fs::write(&p, text).unwrap();
    let m = sidecore_manifest::load(&p).unwrap_or_else(|e| panic!("{}", e.render(false)));
    let mut reg = Registry::new();
    sidecore_builtins::register(&mut reg);
    let plan =
        sidecore_runtime::plan_manifest(&m, &inventory(), &reg, &Default::default()).unwrap();
    rt.deploy(&plan).unwrap()
}

/// The sum of the checksums of records 0..n, as `inet-checksum` keeps it.
fn checksum_sum(n: u64) -> u64 {
    let mut rec = [0u8; 64];
    (0..n)
        .map(|i| {
            sidecore_builtins::source::fill_record(i, &mut rec);
            u64::from(sidecore_builtins::checksum::inet_checksum(&rec))
        })
        .sum()
}

#[test]
fn a_failing_offcode_is_restarted_on_its_pe_and_the_pipeline_resumes() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 20_000;
    let text = pipeline(
        "rs",
        N,
        "params = { fail_after = 3000, failing_lives = 2 }\nrestart = \"on-failure\"\nrestart_limit = 3\nrestart_backoff_ms = 20",
    );
    let rt = Runtime::new(RuntimeConfig::default());
    let id = deploy(&rt, dir.path(), &text);
    let pe = offcode(&rt, "fault").pe;
    assert!(
        rt.wait_finished(id, Duration::from_secs(60)),
        "{:#?}",
        rt.events().of_app("rs")
    );
    let (f, sum) = (offcode(&rt, "fault"), offcode(&rt, "sum"));
    let k = kinds(&rt, "rs", "fault");
    // Two lives failed, each restarted; the third ran to the end.
    assert_eq!(f.restarts, 2, "{k:#?}");
    assert_eq!(f.state, OffcodeState::Done, "{k:#?}");
    assert_eq!(f.pe, pe, "restarted on the PE it was placed on");
    assert_eq!(f.metrics["lives"], 3);
    let failed = k
        .iter()
        .filter(|e| matches!(e, EventKind::Failed { .. }))
        .count();
    assert_eq!(failed, 2, "{k:#?}");
    let restarting: Vec<(u32, u64)> = k
        .iter()
        .filter_map(|e| match e {
            EventKind::Restarting {
                attempt,
                limit: 3,
                backoff_ms,
                ..
            } => Some((*attempt, *backoff_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(restarting, [(1, 20), (2, 40)], "doubling backoff: {k:#?}");
    let restarted: Vec<u64> = k
        .iter()
        .filter_map(|e| match e {
            EventKind::Restarted { restarts } => Some(*restarts),
            _ => None,
        })
        .collect();
    assert_eq!(restarted, [1, 2], "{k:#?}");
    // Each restart re-initialised and restarted it: Failed → Restarting →
    // Initialized → Started → Restarted.
    let first_fail = k
        .iter()
        .position(|e| matches!(e, EventKind::Failed { .. }))
        .unwrap();
    assert!(
        matches!(
            &k[first_fail + 1..first_fail + 5],
            [
                EventKind::Restarting { .. },
                EventKind::Initialized,
                EventKind::Started,
                EventKind::Restarted { restarts: 1 }
            ]
        ),
        "{k:#?}"
    );
    // The channels stayed attached: every record arrived once, in order.
    assert_eq!(f.metrics["records"], N);
    assert_eq!(sum.metrics["records"], N, "{sum:?}");
    assert_eq!(sum.metrics["sequence_gaps"], 0, "{sum:?}");
    assert_eq!(sum.metrics["checksum_sum"], checksum_sum(N));
    assert_eq!(rt.status()[0].state, AppState::Finished);
    rt.stop_app(id);
    rt.shutdown();
}

#[test]
fn past_its_limit_a_failing_offcode_stays_failed() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // An endless source; the middle fails in every life.
    let text = pipeline(
        "lim",
        0,
        "params = { fail_after = 500 }\nrestart = \"on-failure\"\nrestart_limit = 2\nrestart_backoff_ms = 10",
    );
    let rt = Runtime::new(RuntimeConfig::default());
    let id = deploy(&rt, dir.path(), &text);
    let gave_up = || {
        kinds(&rt, "lim", "fault")
            .iter()
            .any(|e| matches!(e, EventKind::RestartLimit { .. }))
    };
    assert!(wait(gave_up, 30), "{:#?}", rt.events().of_app("lim"));
    assert!(
        wait(|| offcode(&rt, "fault").state == OffcodeState::Failed, 10),
        "{:?}",
        offcode(&rt, "fault")
    );
    // It stays failed: no restart after the limit, however long we look.
    std::thread::sleep(Duration::from_millis(300));
    let f = offcode(&rt, "fault");
    let k = kinds(&rt, "lim", "fault");
    assert_eq!(f.state, OffcodeState::Failed, "{k:#?}");
    assert_eq!(f.restarts, 2, "{k:#?}");
    assert_eq!(f.metrics["lives"], 3, "{k:#?}");
    assert!(
        f.stop_reason
            .as_deref()
            .is_some_and(|r| r.contains("restart limit")),
        "{f:?}"
    );
    assert!(
        matches!(
            k.last(),
            Some(EventKind::Stopped { reason }) if reason.contains("restart limit")
        ),
        "{k:#?}"
    );
    assert_eq!(
        k.iter()
            .filter(|e| matches!(e, EventKind::RestartLimit { restarts: 2, .. }))
            .count(),
        1
    );
    assert!(
        !k.iter()
            .any(|e| matches!(e, EventKind::Restarted { restarts: 3 }))
    );
    // What the three lives forwarded reached the sink, in order.
    let sum = offcode(&rt, "sum");
    assert_eq!(sum.metrics["records"], f.metrics["records"]);
    assert_eq!(sum.metrics["sequence_gaps"], 0);
    assert!(f.metrics["records"] >= 1500, "{f:?}");
    // Let go, its channel ends close as without a policy: its sender fails
    // (nobody receives), its receiver drains and finishes, the app ends.
    assert!(
        wait(|| rt.status()[0].state == AppState::Finished, 10),
        "{:#?}",
        rt.status()
    );
    let src = offcode(&rt, "source");
    assert!(
        src.state == OffcodeState::Failed
            && src
                .stop_reason
                .as_deref()
                .is_some_and(|r| r.contains("gone away")),
        "{src:?}"
    );
    assert_eq!(offcode(&rt, "sum").state, OffcodeState::Done);
    rt.stop_app(id);
    rt.shutdown();
}

#[test]
fn a_watchdog_expiry_restarts_it_too() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 5_000;
    let text = pipeline(
        "wdr",
        N,
        "params = { fail_after = 1000, fail = \"stall\", stall_ms = 200, failing_lives = 1 }\nwatchdog_ms = 50\nrestart = \"on-failure\"",
    );
    let rt = Runtime::new(RuntimeConfig::default());
    let id = deploy(&rt, dir.path(), &text);
    assert!(
        rt.wait_finished(id, Duration::from_secs(60)),
        "{:#?}",
        rt.events().of_app("wdr")
    );
    let k = kinds(&rt, "wdr", "fault");
    let at = |f: fn(&EventKind) -> bool| k.iter().position(f).unwrap_or(usize::MAX);
    let wd = at(|e| matches!(e, EventKind::WatchdogExpired { period_ms: 50, .. }));
    let rs = at(|e| matches!(e, EventKind::Restarting { attempt: 1, .. }));
    let rd = at(|e| matches!(e, EventKind::Restarted { restarts: 1 }));
    assert!(wd < rs && rs < rd && rd < k.len(), "{k:#?}");
    let f = offcode(&rt, "fault");
    assert_eq!((f.restarts, f.state), (1, OffcodeState::Done), "{k:#?}");
    let sum = offcode(&rt, "sum");
    assert_eq!(sum.metrics["records"], N);
    assert_eq!(sum.metrics["sequence_gaps"], 0);
    rt.stop_app(id);
    rt.shutdown();
}

#[test]
fn without_a_policy_a_failed_offcode_is_disposed_of_as_before() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let text = pipeline("never", 0, "params = { fail_after = 200 }");
    let rt = Runtime::new(RuntimeConfig::default());
    let id = deploy(&rt, dir.path(), &text);
    assert!(
        wait(|| offcode(&rt, "fault").state == OffcodeState::Failed, 30),
        "{:#?}",
        rt.events().of_app("never")
    );
    std::thread::sleep(Duration::from_millis(200));
    let k = kinds(&rt, "never", "fault");
    assert!(
        !k.iter().any(|e| matches!(
            e,
            EventKind::Restarting { .. }
                | EventKind::Restarted { .. }
                | EventKind::RestartLimit { .. }
        )),
        "{k:#?}"
    );
    assert!(
        matches!(k.last(), Some(EventKind::Stopped { reason }) if reason.contains("injected fault")),
        "{k:#?}"
    );
    let f = offcode(&rt, "fault");
    assert_eq!(
        (f.state, f.restarts, f.metrics["lives"]),
        (OffcodeState::Failed, 0, 1)
    );
    rt.stop_app(id);
    rt.shutdown();
}
