//! The `sim` command as the `sidecore` binary mounts it: small real runs of both
//! simulators, and the error of each kind of bad option.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use clap::Parser;
use sidecore_sikker_sim::{SimCommand, run};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: SimCommand,
}

fn sim(args: &[&str]) -> anyhow::Result<()> {
    let mut v = vec!["sim"];
    v.extend_from_slice(args);
    run(Cli::try_parse_from(v)?.cmd)
}

#[test]
fn sikker_small_run_prints_tables() {
    // A small Memory control: the default 256 MiB takes seconds to build in debug.
    sim(&[
        "sikker",
        "--hosts",
        "1024",
        "--checks",
        "5000",
        "--memory-mib",
        "8",
    ])
    .unwrap();
    sim(&[
        "sikker",
        "--hosts",
        "1024",
        "--checks",
        "5000",
        "--batch",
        "8",
        "--json",
        "--memory-mib",
        "4",
    ])
    .unwrap();
}

#[test]
fn rate_small_run() {
    sim(&[
        "rate",
        "--algorithms",
        "ne,se-tre",
        "--interval",
        "2000",
        "--no-1ms",
        "--buckets",
        "2000",
    ])
    .unwrap();
}

#[test]
fn rate_what_if_runs() {
    sim(&[
        "rate",
        "--algorithms",
        "se-re,se-tre",
        "--interval",
        "2000",
        "--no-1ms",
        "--buckets",
        "2000",
        "--keep-used-rate",
        "--json",
    ])
    .unwrap();
}

#[test]
fn bad_options_say_what_is_wrong() {
    let e = |args: &[&str]| sim(args).unwrap_err().to_string();
    assert!(e(&["sikker", "--hosts", "1000"]).contains("1000 is not a power of two"));
    assert!(e(&["sikker", "--checks", "0"]).contains("--checks must be at least 1"));
    assert!(
        e(&["sikker", "--checks", "10", "--batch", "20"])
            .contains("--batch must be between 1 and --checks")
    );
    assert!(e(&["sikker", "--sigma=-1"]).contains("--sigma must be a positive number"));
    assert!(
        e(&["sikker", "--memory-mib", "0"]).contains("--memory-mib must be between 1 and 16384")
    );
    assert!(e(&["rate", "--algorithms", "fast"]).contains("unknown algorithm `fast`"));
    assert!(
        e(&["rate", "--arrivals", "bursty"]).contains("`bursty` is neither `paced` nor `poisson`")
    );
    assert!(e(&["rate", "--interval", "10"]).contains("--interval must be at least 1000"));
    assert!(e(&["rate", "--buckets", "50"]).contains("cannot hold the largest packet"));
    assert!(e(&["rate", "--bogus"]).contains("--bogus"));
    assert!(e(&["rate", "--ctrl-phits", "0"]).contains("--ctrl-phits must be a positive number"));
    assert!(e(&["rate", "--sweep", "--sweep-seeds", "1,x"]).contains("--sweep-seeds"));
}
