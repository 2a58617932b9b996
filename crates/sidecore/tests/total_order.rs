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
use sidecore_total_order_net::{Bed, RunOptions, Variant, run as run_variant};

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
        "offloaded,sequencer,etcd",
        "--prefix",
        &prefix,
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    for want in [
        "offloaded orderer",
        "fixed sequencer",
        "etcd",
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
