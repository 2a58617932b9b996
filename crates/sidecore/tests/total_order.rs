//! HYDRA's offloaded total order end to end (§8.2): on full meshes of 3 and 5
//! network namespaces with 5% loss injected on every egress, every node
//! delivers the same sequence — every message once, no gap, each sender's
//! messages in its order — with the orderer beside reliable broadcast and
//! on the application's thread, and with the fixed sequencer; and
//! `sidecore demo total-order` runs, prints its table and leaves no
//! namespace behind. Bad parameters are refused with the field named.
#![allow(clippy::unwrap_used)] // test code

mod common;

use std::time::{Duration, Instant};

use common::{run, serial, text};
use sidecore_testbed::testing::{Cleanup, root};
use sidecore_total_order_net::{Bed, Deploy, RunOptions, Variant, run as run_variant};

fn opts() -> RunOptions {
    RunOptions {
        per_node: 300,
        deadline: Duration::from_secs(20),
        ..RunOptions::default()
    }
}

fn agrees_under_loss(n: usize) {
    if !root() {
        return;
    }
    let _g = serial();
    let prefix = format!("to{n}x{}", std::process::id() % 10_000);
    let _clean = Cleanup(prefix.clone());
    let bed = Bed::up(n, &prefix, 5.0).unwrap();
    let t0 = Instant::now();
    for v in [
        Variant::OffloadedOrderer,
        Variant::HostOrderer,
        Variant::FixedSequencer,
    ] {
        let m = run_variant(&bed, v, &opts()).unwrap();
        assert!(
            m.complete,
            "{} on {n} nodes did not finish: {m:?}",
            v.name()
        );
        assert!(
            m.problems.is_empty(),
            "{} on {n} nodes: {:?}",
            v.name(),
            m.problems
        );
        assert_eq!(m.messages, n * 300);
        assert!(
            m.retransmitted > 0,
            "5% loss and nothing resent: was loss injected? {m:?}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
    bed.down().unwrap();
}

#[test]
fn three_nodes_deliver_the_same_sequence_under_five_percent_loss() {
    agrees_under_loss(3);
}

#[test]
fn five_nodes_deliver_the_same_sequence_under_five_percent_loss() {
    agrees_under_loss(5);
}

#[test]
fn the_demo_prints_table_8_5_and_cleans_up() {
    if !root() {
        return;
    }
    let _g = serial();
    let prefix = format!("tod{}", std::process::id() % 10_000);
    let _clean = Cleanup(format!("{prefix}3"));
    let o = run(&[
        "demo",
        "total-order",
        "--nodes",
        "3",
        "--messages",
        "100",
        "--variants",
        "offloaded,sequencer,etcd,deployed",
        "--prefix",
        &prefix,
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    for want in [
        "offloaded orderer",
        "fixed sequencer",
        "etcd",
        "deployed offcodes",
        "p50 ms",
        "Table 8.5",
    ] {
        assert!(out.contains(want), "no `{want}` in:\n{out}");
    }
    assert!(!out.contains("WRONG"), "{out}");
    assert!(
        sidecore_testbed::topology::namespaces(&format!("{prefix}3")).is_empty(),
        "namespaces left behind"
    );
}

#[test]
fn bad_parameters_are_refused_with_the_field_named() {
    let o = run(&["demo", "total-order", "--variants", "paxos"]);
    assert!(!o.status.success());
    assert!(
        text(&o).1.contains("unknown variant `paxos`"),
        "{}",
        text(&o).1
    );
    assert!(
        Bed::up(1, "tobad", 5.0)
            .unwrap_err()
            .to_string()
            .contains("a mesh of 1 nodes")
    );
    assert!(
        Bed::up(3, "tobad", 80.0)
            .unwrap_err()
            .to_string()
            .contains("loss 80%")
    );
}

fn repo(p: &str) -> std::path::PathBuf {
    // Read at run time: the test binary may run from another clone's tree.
    std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("../..")
    .join(p)
}

/// The example with its two constraints swapped, and nothing else changed.
fn swapped(dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(repo("examples/total-order.toml")).unwrap();
    let text = text
        .replace("constraint = \"link\"", "constraint = \"TMP\"")
        .replace("constraint = \"pull\"", "constraint = \"link\"")
        .replace("constraint = \"TMP\"", "constraint = \"pull\"");
    let p = dir.join("total-order-swapped.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn placements(manifest: &std::path::Path) -> Vec<(String, String)> {
    let o = run(&["layout", manifest.to_str().unwrap(), "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["offcode"].as_str().unwrap().to_string(),
                p["pe"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn swapping_link_and_pull_moves_the_orderer_between_a_core_and_the_host() {
    let pe =
        |ps: &[(String, String)], name: &str| ps.iter().find(|(o, _)| o == name).unwrap().1.clone();
    // The seed's layout: to-service Link α, α Pull β — α beside β on a core.
    let seed = placements(&repo("examples/total-order.toml"));
    assert_eq!(pe(&seed, "to-service"), "host");
    assert!(pe(&seed, "broadcast").starts_with("core:"), "{seed:?}");
    assert_eq!(pe(&seed, "orderer"), pe(&seed, "broadcast"), "{seed:?}");
    // Swapped: to-service Pull α, α Link β — α on the host with the TO service.
    let dir = tempfile::tempdir().unwrap();
    let swap = placements(&swapped(dir.path()));
    assert_eq!(pe(&swap, "orderer"), "host", "{swap:?}");
    assert!(pe(&swap, "broadcast").starts_with("core:"), "{swap:?}");
}

/// The example deployed by the product, one `sidecore up` per namespace
/// (`sidecore_total_order_net::deployed`), in both layouts: every node's whole
/// delivered sequence is checked (same order, no gap, no duplicate), not only
/// a count.
#[test]
fn the_offcodes_order_a_group_of_three_through_the_runtime_in_both_layouts() {
    if !root() {
        return;
    }
    let _g = serial();
    let prefix = format!("toup{}", std::process::id() % 10_000);
    let _clean = Cleanup(prefix.clone());
    let bed = Bed::up(3, &prefix, 5.0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for manifest in [repo("examples/total-order.toml"), swapped(dir.path())] {
        let o = RunOptions {
            per_node: 200,
            window: 16,
            payload_bytes: 64,
            deploy: Some(Deploy {
                exe: env!("CARGO_BIN_EXE_sidecore").into(),
                manifest: manifest.clone(),
            }),
            ..opts()
        };
        let m = run_variant(&bed, Variant::Deployed, &o).unwrap();
        assert!(m.complete, "{}: {m:?}", manifest.display());
        assert!(
            m.problems.is_empty(),
            "{}: {:?}",
            manifest.display(),
            m.problems
        );
        assert_eq!(m.messages, 600);
        assert!(m.p50_ms > 0.0 && m.p50_ms < 5_000.0, "{m:?}");
        assert!(
            m.retransmitted > 0,
            "5% loss and β resent nothing: was loss injected? {m:?}"
        );
    }
    // Without the binary the variant is refused, naming what it needs.
    let e = run_variant(&bed, Variant::Deployed, &opts()).unwrap_err();
    assert!(e.to_string().contains("needs the `sidecore` binary"), "{e}");
    bed.down().unwrap();
}
