//! Several offcodes on one dedicated core, through the real binary: under
//! <EDF>++ a periodic offcode runs one job per period while a busy
//! non-periodic one fills the slack (under round-robin the same manifest
//! runs the periodic one every turn); a task set that could miss a deadline
//! is refused at deployment, naming its tasks and the test that failed.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::path::Path;

use common::*;

/// A `ticker` every 5 ms (declaring 500 us, working `work_us`) beside a
/// busy record source, both pinned to CPU 1, under `scheduler`.
fn manifest(dir: &Path, scheduler: &str, work_us: u64) -> std::path::PathBuf {
    let p = dir.join("sched.toml");
    std::fs::write(
        &p,
        format!(
            r#"
[app]
name = "sched-demo"
scheduler = "{scheduler}"

[[offcode]]
name = "tick"
id = "4b1c2d3e-0000-4000-8000-000000000001"
impl = "ticker"
period_ms = 5
wcet_us = 500
params = {{ work_us = {work_us} }}
  [[offcode.target]]
  kind = "core"
  require = {{ cpu = 1 }}

[[offcode]]
name = "busy"
id = "4b1c2d3e-0000-4000-8000-000000000002"
impl = "record-source"
cpu = 0.5
outputs = ["out"]
params = {{ records = 0, batch = 16 }}
  [[offcode.target]]
  kind = "core"
  require = {{ cpu = 1 }}
"#
        ),
    )
    .unwrap();
    p
}

/// Runs it for `secs` and returns (ticker jobs, busy turns, the ticker's
/// uptime in seconds: from when it landed, before its first release, to the
/// final status, after its last job).
fn run_for(dir: &Path, scheduler: &str, secs: u64) -> (u64, u64, f64) {
    let (tick, busy) = statuses(dir, scheduler, secs, 200);
    (
        tick["metrics"]["jobs"].as_u64().unwrap(),
        busy["turns"].as_u64().unwrap(),
        // ms, rounded down: one more covers the rest.
        (tick["uptime_ms"].as_u64().unwrap() + 1) as f64 / 1000.0,
    )
}

/// Runs it for `secs`; the final status of the ticker and of the busy one.
fn statuses(
    dir: &Path,
    scheduler: &str,
    secs: u64,
    work_us: u64,
) -> (serde_json::Value, serde_json::Value) {
    let m = manifest(dir, scheduler, work_us);
    let o = bin()
        .args([
            "up",
            "--json",
            "--quiet",
            "--for",
            &format!("{secs}s"),
            "--socket",
        ])
        .arg(dir.join("s.sock"))
        .arg(&m)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let find = |n: &str| {
        v["status"][0]["offcodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == n)
            .unwrap()
            .clone()
    };
    let (tick, busy) = (find("tick"), find("busy"));
    assert_eq!(tick["pe"], "core:1", "{v}");
    assert_eq!(busy["pe"], "core:1", "{v}");
    (tick, busy)
}

#[test]
fn a_periodic_offcode_that_runs_past_its_wcet_is_counted_missing_deadlines() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    // It declares 500 us and works 8 ms per 5 ms period: admission passes,
    // every job ends late, and the misses are counted, not hidden.
    let (tick, _) = statuses(dir.path(), "edf++", 1, 8_000);
    let jobs = tick["metrics"]["jobs"].as_u64().unwrap();
    let misses = tick["deadline_misses"].as_u64().unwrap();
    assert!(jobs >= 2, "{tick}");
    assert!(
        misses >= jobs - 1 && misses <= jobs,
        "{misses} misses in {jobs} jobs: {tick}"
    );
}

#[test]
fn a_periodic_offcode_runs_once_per_period_beside_a_busy_one() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let (jobs, busy_turns, secs) = run_for(dir.path(), "edf++", 2);
    // No more jobs than releases: one every 5 ms, the first when the
    // ticker starts (a neighbour starting later releases none)...
    let released = (secs * 1000.0 / 5.0).floor() as u64 + 1;
    assert!(
        jobs <= released,
        "{jobs} jobs, only {released} released in {secs} s"
    );
    // ...and most of them ran, although the core is never idle.
    assert!(jobs >= released / 2, "{jobs} of {released} jobs ran");
    assert!(
        busy_turns > jobs * 10,
        "the busy offcode filled the slack: {busy_turns} turns"
    );
    // The same manifest under round-robin runs the ticker every turn.
    let (rr_jobs, _, rr_secs) = run_for(dir.path(), "round-robin", 1);
    let rr_released = (rr_secs * 1000.0 / 5.0).floor() as u64 + 1;
    assert!(
        rr_jobs > 2 * rr_released,
        "round-robin ignores periods: {rr_jobs} jobs in {rr_secs} s"
    );
}

#[test]
fn a_set_that_could_miss_a_deadline_is_refused_with_its_tasks_named() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    // 0.3 + 0.2 of the core, but `slow`'s 2 ms job can hold `fast` past its
    // 1 ms deadline: the non-preemptive test refuses it.
    let path = manifest(dir.path(), "edf++", 200);
    let t = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            "period_ms = 5\nwcet_us = 500",
            "period_ms = 1\nwcet_us = 300",
        )
        .replace("name = \"tick\"", "name = \"fast\"")
        .replace(
            "cpu = 0.5\noutputs = [\"out\"]",
            "period_ms = 10\nwcet_us = 2000\noutputs = [\"out\"]",
        )
        .replace("name = \"busy\"", "name = \"slow\"");
    std::fs::write(&path, t).unwrap();
    let o = bin()
        .args(["up", "--quiet", "--for", "2s", "--socket"])
        .arg(dir.path().join("s.sock"))
        .arg(&path)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}\n{err}");
    for want in [
        "core:1",
        "refuses it",
        "non-preemptive EDF test",
        "`slow`",
        "`fast`",
    ] {
        assert!(err.contains(want), "expected `{want}` in:\n{err}");
    }
}
