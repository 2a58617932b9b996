//! `sidecore policy check` and `sidecore policy trace` through the real binary, on the
//! dissertation's key-value-store policy: the SACL it expands to, the NMU tables the
//! Network OS compiles for each host, verdicts from both, and every kind of bad input.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

mod common;

use std::path::PathBuf;

use common::*;

fn example(name: &str) -> String {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"))
        .join("../sikker-policy/examples")
        .join(name)
        .display()
        .to_string()
}

fn code(o: &std::process::Output) -> i32 {
    o.status.code().expect("exited")
}

#[test]
fn check_summarises_the_sacl_and_each_hosts_tables() {
    let (pol, pl) = (example("kvs.toml"), example("kvs-placement.toml"));
    let o = run(&["policy", "check", &pol, "--placement", &pl]);
    let (out, err) = text(&o);
    assert_eq!(code(&o), 0, "{err}");
    assert!(
        out.contains("valid — 3 service(s), 1 grant(s), 1 rate limit(s)"),
        "{out}"
    );
    // The portal AccessForBill: processes 3, 6, 9 in three domains, 100 Gbps.
    assert!(
        out.contains(
            "bill → kvs: processes [3, 6, 9] × domains [CompaniesGet, LocationsDelete, MammalsSet], limited to 100 Gbps"
        ),
        "{out}"
    );
    assert!(!out.contains("john → kvs"), "john has no grant: {out}");
    assert!(
        out.contains("h1: 3 resident process(es) of 2 service(s)"),
        "{out}"
    );
    assert!(
        out.contains("h2: 2 resident process(es) of 2 service(s)"),
        "{out}"
    );

    let o = run(&["policy", "check", &pol, "--placement", &pl, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let sacl = v["sacl"].as_array().unwrap();
    assert_eq!(sacl.len(), 3, "kvs→kvs, bill→kvs, bill→bill: {v}");
    let bill = sacl
        .iter()
        .find(|e| e["from"] == "bill" && e["to"] == "kvs")
        .unwrap();
    assert_eq!(bill["processes"], serde_json::json!([3, 6, 9]));
    assert_eq!(bill["rate_gbps"], 100.0);
    let hosts = v["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 2);
    assert!(hosts.iter().all(|h| h["bytes"].as_u64().unwrap() > 0));
}

#[test]
fn trace_explains_each_verdict_and_the_nmu_agrees() {
    let (pol, pl) = (example("kvs.toml"), example("kvs-placement.toml"));
    let trace = |from: &str, to: &str| {
        let o = run(&[
            "policy",
            "trace",
            &pol,
            "--from",
            from,
            "--to",
            to,
            "--placement",
            &pl,
        ]);
        let (out, err) = text(&o);
        (code(&o), out, err)
    };
    let (c, out, err) = trace("bill:101", "kvs:3:MammalsSet");
    assert_eq!(c, 0, "{out}{err}");
    assert!(
        out.contains("SACL: ALLOWED") && out.contains("rate-limited to 100 Gbps"),
        "{out}"
    );
    assert!(out.contains("NMU on h1: ALLOWED"), "{out}");

    let (c, out, _) = trace("bill:101", "kvs:3:MammalsGet");
    assert_eq!(c, 1);
    assert!(
        out.contains("SACL: DENIED — `bill` may use domains [CompaniesGet, LocationsDelete, MammalsSet] of `kvs`"),
        "{out}"
    );
    assert!(
        out.contains("NMU on h1: DENIED") && out.contains("domain"),
        "{out}"
    );

    let (c, out, _) = trace("bill:101", "kvs:4:CompaniesGet");
    assert_eq!(c, 1);
    assert!(
        out.contains("may reach processes [3, 6, 9] of `kvs`, not 4"),
        "{out}"
    );
    assert!(
        out.contains("NMU on h1: DENIED") && out.contains("process 4"),
        "{out}"
    );

    let (c, out, _) = trace("john:72", "kvs:3:MammalsGet");
    assert_eq!(c, 1);
    assert!(out.contains("no SACL entry from `john` to `kvs`"), "{out}");
    assert!(out.contains("NMU on h2: DENIED"), "{out}");
}

#[test]
fn bad_input_is_refused_with_what_and_where() {
    let (pol, pl) = (example("kvs.toml"), example("kvs-placement.toml"));
    let err = |args: &[&str]| {
        let o = run(args);
        assert_eq!(code(&o), 2, "{args:?}: {:?}", text(&o));
        text(&o).1
    };
    let t = |from: &str, to: &str| err(&["policy", "trace", &pol, "--from", from, "--to", to]);
    assert!(
        t("bob", "kvs:3:MammalsGet")
            .contains("no service `bob` in the policy (services: kvs, bill, john)")
    );
    assert!(t("bill", "kvs:3:Nope").contains("service `kvs` has no domain `Nope`"));
    assert!(t("bill", "kvs:42:MammalsGet").contains("service `kvs` has no process 42"));
    assert!(t("bill", "kvs:x:MammalsGet").contains("process `x` is not a number"));
    assert!(t("bill", "kvs:3").contains("expected SERVICE:PROCESS:DOMAIN"));
    assert!(
        t("bill:101:Reply", "kvs:3:MammalsGet").contains("a source is SERVICE or SERVICE:PROCESS")
    );
    assert!(
        err(&[
            "policy",
            "trace",
            &pol,
            "--from",
            "bill",
            "--to",
            "kvs:3:MammalsGet",
            "--placement",
            &pl
        ])
        .contains("give SERVICE:PROCESS to check through the sender's NMU")
    );
    assert!(
        err(&[
            "policy",
            "trace",
            &pol,
            "--from",
            "kvs:0",
            "--to",
            "kvs:3:MammalsGet",
            "--placement",
            &pl
        ])
        .contains("puts process 0 of `kvs` on no host")
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[service]]\nname = \"a\"\n\n[[grant]]\nfrom = \"a\"\nto = \"zz\"\n",
    )
    .unwrap();
    let e = err(&["policy", "check", bad.to_str().unwrap()]);
    assert!(
        e.contains("unknown service `zz`") && e.contains("bad.toml:6:6"),
        "{e}"
    );

    let badpl = dir.path().join("pl.toml");
    std::fs::write(&badpl, "[[host]]\nname = \"h\"\nprocesses = [\"kvs:77\"]\n").unwrap();
    let e = err(&[
        "policy",
        "check",
        &pol,
        "--placement",
        badpl.to_str().unwrap(),
    ]);
    assert!(e.contains("pl.toml:3") && e.contains("77"), "{e}");

    let e = err(&["policy", "check", "/nonexistent/policy.toml"]);
    assert!(e.contains("/nonexistent/policy.toml"), "{e}");
}
