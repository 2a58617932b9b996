//! An offcode's restart policy: the default (never), `on-failure` with its
//! defaults and with every key set, and each bad value refused at its
//! file:line:column.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use sidecore_manifest::{RestartMode, RestartPolicy, parse_str};

fn manifest(fields: &str) -> String {
    format!(
        "[app]\nname = \"t\"\n[[offcode]]\nname = \"a\"\nid = \"4b1c2d3e-0000-4000-8000-000000000001\"\n{fields}\n[[offcode.target]]\nkind = \"core\"\n"
    )
}

fn err(fields: &str) -> String {
    match parse_str("m.toml", &manifest(fields)) {
        Ok(_) => panic!("should be refused: {fields}"),
        Err(e) => e.render(false),
    }
}

#[test]
fn never_by_default_and_on_failure_with_defaults_or_keys() {
    let m = parse_str("m.toml", &manifest("")).unwrap();
    assert_eq!(m.offcodes[0].restart, RestartPolicy::NEVER);
    let m = parse_str("m.toml", &manifest("restart = \"never\"")).unwrap();
    assert!(!m.offcodes[0].restart.restarts());
    let m = parse_str("m.toml", &manifest("restart = \"on-failure\"")).unwrap();
    assert_eq!(m.offcodes[0].restart, RestartPolicy::ON_FAILURE);
    let m = parse_str(
        "m.toml",
        &manifest(
            "restart = \"on-failure\"\nrestart_limit = 3\nrestart_window_ms = 2000\nrestart_backoff_ms = 0\nrestart_backoff_max_ms = 50",
        ),
    )
    .unwrap();
    assert_eq!(
        m.offcodes[0].restart,
        RestartPolicy {
            mode: RestartMode::OnFailure,
            limit: 3,
            window_ms: 2000,
            backoff_ms: 0,
            backoff_max_ms: 50,
        }
    );
    // A first delay beyond the default cap raises the cap with it.
    let m = parse_str(
        "m.toml",
        &manifest("restart = \"on-failure\"\nrestart_backoff_ms = 20000"),
    )
    .unwrap();
    assert_eq!(m.offcodes[0].restart.backoff_max_ms, 20_000);
}

#[test]
fn bad_policies_are_refused_where_they_are_written() {
    // The offcode's fields start on line 6 of the manifest.
    let e = err("restart = \"always\"");
    assert!(
        e.contains("m.toml:6:11")
            && e.contains("unknown restart policy `always`")
            && e.contains("`on-failure`"),
        "{e}"
    );
    let e = err("restart_limit = 3");
    assert!(
        e.contains("m.toml:6:17")
            && e.contains("`restart_limit` has no effect without `restart = \"on-failure\"`"),
        "{e}"
    );
    let e = err("restart = \"on-failure\"\nrestart_limit = 0");
    assert!(
        e.contains("m.toml:7:17") && e.contains("`restart_limit` must be from 1 to 1000, got 0"),
        "{e}"
    );
    let e = err("restart = \"on-failure\"\nrestart_window_ms = -5");
    assert!(
        e.contains("m.toml:7") && e.contains("`restart_window_ms` must be from 1 ms"),
        "{e}"
    );
    let e = err("restart = \"on-failure\"\nrestart_backoff_ms = 500\nrestart_backoff_max_ms = 100");
    assert!(
        e.contains("m.toml:8:26")
            && e.contains(
                "`restart_backoff_ms` (500 ms) exceeds `restart_backoff_max_ms` (100 ms)"
            ),
        "{e}"
    );
    let e = err("restart = \"on-failure\"\nrestart_limit = \"five\"");
    assert!(e.contains("m.toml:7"), "{e}");
    let e = err("restart = 1");
    assert!(e.contains("m.toml:6"), "{e}");
}
