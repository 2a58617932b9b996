//! Timing for a shared core's scheduler: `period_ms`, `wcet_us` and the app's
//! `scheduler`, good and bad, each bad one located.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

use std::time::Duration;

use sidecore_manifest::parse_str;
use sidecore_types::SchedPolicy;

fn manifest(app: &str, fields: &str) -> String {
    format!(
        "[app]\nname = \"t\"\n{app}\n[[offcode]]\nname = \"a\"\nid = \"4b1c2d3e-0000-4000-8000-000000000001\"\n{fields}\n[[offcode.target]]\nkind = \"core\"\n"
    )
}

fn err(app: &str, fields: &str) -> String {
    match parse_str("m.toml", &manifest(app, fields)) {
        Ok(_) => panic!("should be refused: {fields}"),
        Err(e) => e.render(false),
    }
}

#[test]
fn a_periodic_offcode_gets_its_share_and_the_scheduler_is_read() {
    let m = parse_str(
        "m.toml",
        &manifest("scheduler = \"cyclic\"", "period_ms = 4\nwcet_us = 500"),
    )
    .unwrap();
    assert_eq!(m.scheduler, SchedPolicy::Cyclic);
    let o = &m.offcodes[0];
    assert_eq!(o.timing.period, Some(Duration::from_millis(4)));
    assert_eq!(o.timing.wcet, Some(Duration::from_micros(500)));
    assert!((o.cpu - 0.125).abs() < 1e-12, "cpu = e/p, got {}", o.cpu);
    let m = parse_str("m.toml", &manifest("", "wcet_us = 20")).unwrap();
    assert_eq!(m.scheduler, SchedPolicy::EdfPlusPlus, "the default");
    assert_eq!(m.offcodes[0].timing.period, None);
    assert!(
        (m.offcodes[0].cpu - 1.0).abs() < 1e-12,
        "non-periodic keeps the default share"
    );
}

#[test]
fn bad_timing_is_refused_where_it_is_written() {
    let e = err("", "period_ms = 5");
    assert!(
        e.contains("a periodic offcode (every 5 ms) needs `wcet_us`"),
        "{e}"
    );
    assert!(e.contains("m.toml:7:"), "{e}");
    let e = err("", "period_ms = 1\nwcet_us = 2000");
    assert!(
        e.contains("`wcet_us` (2000 µs) exceeds the period (1000 µs)"),
        "{e}"
    );
    assert!(e.contains("m.toml:8:"), "{e}");
    let e = err("", "period_ms = -1\nwcet_us = 1");
    assert!(e.contains("`period_ms` must be a positive time"), "{e}");
    let e = err("", "period_ms = 1\nwcet_us = 500\ncpu = 0.25");
    assert!(
        e.contains("`cpu` = 0.25 is below the share its timing needs (wcet/period = 0.5000)"),
        "{e}"
    );
    let e = err("scheduler = \"fifo\"", "");
    assert!(e.contains("unknown scheduler `fifo`"), "{e}");
    assert!(e.contains("`round-robin` `edf` `edf++` `cyclic`"), "{e}");
}
