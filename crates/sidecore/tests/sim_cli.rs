//! `sidecore sim sikker` and `sidecore sim rate` through the real binary: the tables
//! it prints (rows, seeds, published figures beside ours), its JSON form, and the
//! error of each kind of bad option.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

mod common;

/// Runs `sidecore sim ARGS`: stdout on success, stderr on failure.
fn sim(args: &[&str]) -> Result<String, String> {
    let mut v = vec!["sim"];
    v.extend_from_slice(args);
    let o = common::run(&v);
    let (out, err) = common::text(&o);
    if o.status.success() {
        Ok(out)
    } else {
        Err(err)
    }
}

/// The line of `out` that starts with `first` (after spaces).
fn row<'a>(out: &'a str, first: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first} in\n{out}"))
}

#[test]
fn sikker_prints_both_tables_and_json() {
    let out = sim(&[
        "sikker",
        "--hosts",
        "1024",
        "--checks",
        "5000",
        "--memory-mib",
        "8",
    ])
    .unwrap();
    assert!(out.contains("SikkerSim — one host's NMU tables"), "{out}");
    assert!(out.contains("Permission-check latency"), "{out}");
    // One size row, then one latency row per pattern (four of §7.1.2, two controls).
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.split_whitespace().next() == Some("1024"))
        .collect();
    assert_eq!(rows.len(), 1 + 6, "{out}");
    for p in ["UR", "URR", "GR", "GRR", "Cached", "Memory"] {
        assert!(
            rows.iter().any(|l| l.split_whitespace().nth(1) == Some(p)),
            "{p} missing:\n{out}"
        );
    }
    assert!(
        out.contains("GRR mean 41 ns"),
        "the published figure beside ours"
    );
    // The targets as ratios to the same run's controls, with numbers.
    let t = out
        .lines()
        .find(|l| l.starts_with("targets at 1024 hosts"))
        .unwrap_or_else(|| panic!("no targets line:\n{out}"));
    let num = |after: &str| -> f64 {
        let rest = &t[t.find(after).unwrap() + after.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let ur = num("UR p99.99 ÷ Memory p99.99 = ");
    let grr = num("GRR mean ÷ Cached mean = ");
    assert!(
        ur > 0.0 && ur.is_finite() && grr > 0.0 && grr.is_finite(),
        "{t}"
    );
    assert!(
        t.contains("(target ≤ 1.0)") && t.contains("(target ≤ 1.5)"),
        "{t}"
    );

    let json = sim(&[
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
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    for l in rows[0]["latency"].as_array().unwrap() {
        assert_eq!(l["batch"], 8);
        assert_eq!(l["checks"], 5000);
        assert_eq!(l["denied"], 0);
    }
}

#[test]
fn rate_prints_every_seed_beside_the_paper() {
    let out = sim(&[
        "rate",
        "--algorithms",
        "ne,se-tre",
        "--interval",
        "2000",
        "--no-1ms",
        "--buckets",
        "2000",
        "--seeds",
        "1,2",
    ])
    .unwrap();
    assert!(out.contains("Table 8.1"), "{out}");
    assert!(out.contains("seeds [1, 2]"), "{out}");
    // NE: 0 Gbps on both seeds, the paper's 500 ns and 0 beside.
    let ne = row(&out, "NE");
    let cells: Vec<&str> = ne.split_whitespace().collect();
    assert_eq!(cells[1], "no", "NE enforces no limit: {ne}");
    assert_eq!(cells[3], "500", "paper's NE latency: {ne}");
    assert_eq!(cells[4], "0/0", "NE's overhead on each seed: {ne}");
    let tre = row(&out, "SE-TRE");
    assert_eq!(tre.split_whitespace().nth(2).unwrap().split('/').count(), 2);
    // The default's assumption is flagged where the table is printed.
    assert!(
        out.contains("[A] SE-RE and SE-TRE: a giver keeps the rate it uses"),
        "{out}"
    );
    // Table 8.2 marks its derived column and shows the paper's 25 MB.
    assert!(out.contains("Table 8.2"), "{out}");
    assert!(out.contains("derived, not measured"), "{out}");
    let b = row(&out, "2000");
    assert!(b.contains("25.00") && b.ends_with("25.0"), "{b}");
    assert!(!out.contains("1 ms change interval"), "--no-1ms");
}

#[test]
fn rate_json_keeps_used_rate_by_default_and_not_with_exact_formulas() {
    let json = sim(&[
        "rate",
        "--algorithms",
        "se-re,se-tre",
        "--interval",
        "2000",
        "--no-1ms",
        "--buckets",
        "2000",
        "--json",
    ])
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    // Keep-used-rate is the default, flagged as an assumption.
    assert_eq!(v["exact_formulas"], false);
    assert_eq!(v["seeds"], serde_json::json!([1]));
    let t81 = v["table_8_1"].as_array().unwrap();
    assert_eq!(t81.len(), 2);
    for r in t81 {
        assert_eq!(r["algo"]["se"]["keep_used"], 2000.0);
        let runs = r["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1);
        assert!(
            runs[0]["series"].as_array().unwrap().is_empty(),
            "series dropped"
        );
        assert!(runs[0]["max_rate_sum"].as_f64().unwrap() <= 500.0 + 1e-6);
    }
    assert_eq!(v["table_8_2"].as_array().unwrap().len(), 1);
    // --exact-formulas: chapter 5 literally, no giver keeps its rate.
    let json = sim(&[
        "rate",
        "--algorithms",
        "se-tre",
        "--interval",
        "2000",
        "--no-1ms",
        "--buckets",
        "2000",
        "--exact-formulas",
        "--json",
    ])
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["exact_formulas"], true);
    assert!(
        v["table_8_1"][0]["algo"]["se"]["keep_used"].is_null(),
        "{v}"
    );
}

#[test]
fn bad_options_say_what_is_wrong() {
    let e = |args: &[&str]| sim(args).unwrap_err();
    assert!(e(&["sikker", "--hosts", "1000"]).contains("--hosts: 1000 is not a power of two"));
    assert!(e(&["sikker", "--checks", "0"]).contains("--checks: must be at least 1"));
    assert!(
        e(&["sikker", "--checks", "10", "--batch", "20"])
            .contains("--batch: must be between 1 and --checks")
    );
    assert!(e(&["sikker", "--sigma=-1"]).contains("--sigma: must be a positive number"));
    assert!(
        e(&["sikker", "--memory-mib", "0"]).contains("--memory-mib: must be between 1 and 16384")
    );
    assert!(e(&["rate", "--algorithms", "fast"]).contains("unknown algorithm `fast`"));
    assert!(
        e(&["rate", "--arrivals", "bursty"]).contains("`bursty` is neither `paced` nor `poisson`")
    );
    assert!(e(&["rate", "--interval", "10"]).contains("--interval: must be at least 1000"));
    assert!(e(&["rate", "--buckets", "50"]).contains("cannot hold the largest packet"));
    assert!(e(&["rate", "--bogus"]).contains("--bogus"));
    assert!(e(&["rate", "--ctrl-phits", "0"]).contains("--ctrl-phits: must be a positive number"));
    assert!(e(&["rate", "--sweep", "--sweep-seeds", "1,x"]).contains("--sweep-seeds"));
    assert!(e(&["rate", "--seeds", "1,y"]).contains("--seeds"));
    assert!(e(&["rate", "--threads", "0"]).contains("--threads: must be at least 1"));
}
