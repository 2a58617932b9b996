//! Sikker's agents across hosts, as root: three agents in three network
//! namespaces link over mutual TLS and hold a rate limit together.
//!
//! - Agents that cannot prove their host are refused: one whose certificate
//!   comes from another authority, and one that presents another host's
//!   certificate.
//! - A four-phase load like RateSim's periods (all three senders, all load
//!   on one, on the other two, all three again) keeps the aggregate of the
//!   limited pair within 1% of `R_a` once converged, measured at the receiver.
//! - An agent killed mid-run: the others reclaim its share (the aggregate
//!   stays within 1%), and when it comes back it enforces the same
//!   permissions (a permitted send passes, a denied one is denied).
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test code: a failed unwrap is a failed run; one scenario read top to bottom

mod common;

use std::time::Duration;

use common::cgroups::run_in;
use common::sikker::{Cluster, Proc, unix_ms, windows};
use common::*;

/// The limit: 0.032 Gbps = 4 MB/s, well below what one sender alone can
/// offer through two agents here (about 9 MB/s of 8 KiB messages on a quiet
/// machine, twice that of 16 KiB ones), so that every phase is limited by the
/// rate control and not by the machine, even when it is busy.
const LIMIT_BPS: f64 = 4_000_000.0;
const SIZE: usize = 16384;

/// The aggregate rate over windows starting in `[from, to)`, as a fraction of the limit.
fn aggregate(w: &[(u128, u64, serde_json::Value)], from: u128, to: u128, win_ms: u128) -> f64 {
    let sel: Vec<_> = w
        .iter()
        .filter(|x| x.0 >= from && x.0 + win_ms <= to)
        .collect();
    assert!(sel.len() >= 3, "too few windows in [{from}, {to}): {w:?}");
    let bytes: u64 = sel.iter().map(|x| x.1).sum();
    bytes as f64 / (sel.len() as f64 * win_ms as f64 / 1000.0) / LIMIT_BPS
}

#[test]
fn three_agents_prove_their_hosts_and_hold_a_limit_together() {
    if !sidecore_testbed::testing::root() {
        return;
    }
    let _s = serial();
    let c = Cluster::up("sikker-agents", "10.207.0.0/16", "scsk", 0.032, 65536);
    let g = &c.groups;
    let dir = &c.dir;
    let tls = c.tls.clone();
    // Another cluster's authority, and h1's certificate under h0's name.
    let other = dir.path().join("other");
    assert!(
        run(&["sikker", "certs", "--out", other.to_str().unwrap(), "h2"])
            .status
            .success()
    );
    let stolen = dir.path().join("stolen");
    std::fs::create_dir_all(&stolen).unwrap();
    std::fs::copy(tls.join("ca.pem"), stolen.join("ca.pem")).unwrap();
    std::fs::copy(tls.join("h1.pem"), stolen.join("h0.pem")).unwrap();
    std::fs::copy(tls.join("h1.key"), stolen.join("h0.key")).unwrap();

    // h1 first, then an h2 whose certificate another authority signed: h1
    // dials it and refuses it.
    let _a1 = c.agent("h1", &tls, "a");
    let fake2 = c.agent("h2", &other, "fake");
    assert!(
        wait_for(|| c.log_has("h1", "a", "refused agent h2"), 10),
        "h1 must refuse an h2 with a foreign certificate:\n{}",
        std::fs::read_to_string(c.log("h1", "a")).unwrap_or_default()
    );
    assert!(!c.log_has("h1", "a", "linked to host h2"));
    drop(fake2);
    let mut a2 = c.agent("h2", &tls, "a");
    assert!(wait_for(|| c.log_has("h1", "a", "linked to host h2"), 10));
    // An h0 presenting h1's certificate: h1 and h2 accept the connection and
    // refuse the claim.
    let fake0 = c.agent("h0", &stolen, "fake");
    assert!(
        wait_for(|| c.log_has("h2", "a", "refused agent"), 10),
        "h2 must refuse an h0 with h1's certificate:\n{}",
        std::fs::read_to_string(c.log("h2", "a")).unwrap_or_default()
    );
    let e = std::fs::read_to_string(c.log("h2", "a")).unwrap();
    assert!(e.contains("does not name host `h0`"), "{e}");
    assert!(!e.contains("linked to host h0"), "{e}");
    drop(fake0);
    let _a0 = c.agent("h0", &tls, "a");
    for h in ["h0", "h1", "h2"] {
        let others: Vec<&str> = ["h0", "h1", "h2"].into_iter().filter(|x| *x != h).collect();
        assert!(
            wait_for(
                || others
                    .iter()
                    .all(|o| c.log_has(h, "a", &format!("linked to host {o}"))),
                10
            ),
            "{h} links to {others:?}:\n{}",
            std::fs::read_to_string(c.log(h, "a")).unwrap_or_default()
        );
    }

    // The receiver, and the four phases.
    let win: u128 = 250;
    let meter = c.meter(win, 60_000);
    std::thread::sleep(Duration::from_millis(300));
    let phases: [&[usize]; 4] = [&[0, 1, 2], &[0], &[1, 2], &[0, 1, 2]];
    let mut spans = Vec::new();
    // Each phase is measured from 1 s after it starts (SE-TRE has converged
    // by then) over 2.9 s: SE-TRE moves rate between hosts while all send,
    // and one 250 ms window mid-move can read 5% low, which a short span
    // (it was 1.4 s) averaged into a 1.04% miss once in CI.
    for senders in phases {
        let t0 = unix_ms();
        let loads: Vec<Proc> = senders.iter().map(|&s| c.load(s, SIZE, 4000)).collect();
        for mut l in loads {
            assert!(wait_exit(&mut l.0, 10).is_some_and(|s| s.success()));
        }
        spans.push((senders, t0 + 1000, t0 + 3900));
    }
    // h2's agent dies while all three send; the others go on.
    let t0 = unix_ms();
    let loads: Vec<Proc> = (0..3).map(|s| c.load(s, SIZE, 4000)).collect();
    std::thread::sleep(Duration::from_millis(800));
    a2.0.kill().unwrap();
    let killed_at = unix_ms();
    for mut l in loads {
        let _ = wait_exit(&mut l.0, 10);
    }
    let after_kill = (killed_at + 1500, t0 + 3900);
    assert!(wait_for(|| c.log_has("h0", "a", "link to host h2 down"), 5));
    // It comes back with nothing but its policy; all load on it.
    let _a2b = c.agent("h2", &tls, "b");
    assert!(wait_for(
        || c.log_has("h2", "b", "linked to host h0") && c.log_has("h2", "b", "linked to host h1"),
        10
    ));
    // Measured over 3.4 s once converged, like the phases above: a shorter
    // span is a handful of 250 ms windows, where one in which a loaded
    // machine starved the sender moves the mean by more than the 1%.
    let t0 = unix_ms();
    let mut l = c.load(2, SIZE, 5000);
    assert!(wait_exit(&mut l.0, 10).is_some_and(|s| s.success()));
    let back = (t0 + 1500, t0 + 4900);
    // A denied send is still denied after the restart.
    let o = run_in(
        &g.procs("s2"),
        &[
            "sikker",
            "send",
            "--socket",
            c.sock("h2").to_str().unwrap(),
            "--to",
            "dst:9:Admin",
            "x",
        ],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(err.contains("may not use domain Admin of dst"), "{err}");
    // The meter prints each window as a line: what it printed stays in the pipe.
    let mut meter = meter;
    let _ = meter.kill();
    let o = meter.wait_with_output().unwrap();
    let w = windows(&String::from_utf8_lossy(&o.stdout));
    let mut report = Vec::new();
    for (senders, from, to) in &spans {
        let r = aggregate(&w, *from, *to, win);
        report.push(format!("senders {senders:?}: {r:.4}"));
        assert!(
            (r - 1.0).abs() <= 0.01,
            "aggregate {r:.4} x the limit with senders {senders:?}\n{report:?}\n{w:?}"
        );
    }
    let r = aggregate(&w, after_kill.0, after_kill.1, win);
    report.push(format!("after h2's agent died: {r:.4}"));
    assert!((r - 1.0).abs() <= 0.01, "{report:?}\n{w:?}");
    let r = aggregate(&w, back.0, back.1, win);
    report.push(format!("all load on the restarted h2: {r:.4}"));
    assert!((r - 1.0).abs() <= 0.01, "{report:?}\n{w:?}");
    let from2: u64 = w
        .iter()
        .filter(|x| x.0 >= back.0 && x.0 < back.1)
        .map(|x| x.2["src:2"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        from2 > 0,
        "the restarted agent passes src:2's permitted messages"
    );
    // Under load the links stayed up: the only link lost was the killed agent's.
    let h0 = std::fs::read_to_string(c.log("h0", "a")).unwrap();
    assert!(!h0.contains("link to host h1 down"), "{h0}");
    assert_eq!(h0.matches("link to host h2 down").count(), 1, "{h0}");
    eprintln!("{report:?}");
}
