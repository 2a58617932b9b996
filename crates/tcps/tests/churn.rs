//! Regression tests for the TS-7 stall: long streams moving 0 MB/s under
//! heavy connection churn. Its cause was in the PPE's round: when a round
//! began with empty Control and Ready queues, the scheduler handed out the
//! SYN class for every one of the round's decisions, so one round could
//! accept up to `round_budget × accept_batch` (8,192) connections — allocating
//! two rings each — before the PPE polled again; the teardowns of all those
//! connections then ranked strictly above Ready, so established connections
//! waited for thousands of Control decisions. Now the SYN class is served at
//! most once per round and Ready gets a turn after a bounded run of Control
//! picks. The first two tests check the scheduler on its own; the third
//! drives a real server with a long stream behind a backlog of short
//! connections.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use sidecore_tcps::gr3::{CONTROL_BURST, Pending, Pick, Role, Scheduler};
use sidecore_tcps::{Config, CoreSet, TcpServers, apps, usable_cpus};

#[test]
fn the_syn_class_is_served_once_per_round() {
    let mut s: Scheduler<u64> = Scheduler::new(Role::Master);
    s.set_syn_pending(true);
    for _ in 0..3 {
        s.begin_round();
        assert_eq!(s.pick(), Some(Pick::Accept));
        // Still pending, but this round has had its accept.
        assert_eq!(s.pick(), None);
        assert_eq!(s.next_accept(), None);
    }
    assert_eq!(s.counts().accept, 3);
}

#[test]
fn a_flood_of_teardowns_leaves_ready_its_turns() {
    let mut s: Scheduler<u64> = Scheduler::new(Role::Master);
    let ready = Pending {
        teardown: false,
        weight: 8,
    };
    let teardown = Pending {
        teardown: true,
        weight: 0,
    };
    s.update(0, ready);
    for id in 1..=1000 {
        s.update(id, teardown);
    }
    let mut ready_picks = 0;
    let mut first_ready = None;
    for n in 0..900u32 {
        match s.pick() {
            Some(Pick::Ready(0)) => {
                ready_picks += 1;
                first_ready.get_or_insert(n);
            }
            Some(Pick::Control(id)) => assert_ne!(id, 0),
            other => panic!("pick {n}: {other:?}"),
        }
    }
    assert_eq!(first_ready, Some(CONTROL_BURST), "Ready waited too long");
    assert_eq!(ready_picks, 900 / (CONTROL_BURST + 1));
    // With Ready empty, Control runs on without a limit.
    s.update(
        0,
        Pending {
            teardown: false,
            weight: 0,
        },
    );
    for _ in 0..50 {
        assert!(matches!(s.pick(), Some(Pick::Control(_))));
    }
}

/// A long stream is accepted first, then 3,000 connect-and-close clients
/// wait in the listen backlog behind it. Before the fix, the PPE's first
/// round with an application accepted the whole backlog before it polled
/// again or served the stream; now the stream gets its blocks while the
/// backlog is still being accepted.
#[test]
fn a_long_stream_moves_while_a_backlog_of_short_connections_is_accepted() {
    const SHORT: usize = 3000;
    let cpus = usable_cpus();
    let last = *cpus.last().expect("a CPU");
    let mut cfg = Config::new(
        "127.0.0.1:0".parse().expect("address"),
        CoreSet::of(&[last]).expect("cpus"),
    );
    cfg.master = last;
    cfg.backlog = 4096;
    let server = TcpServers::start(cfg).expect("start");
    let addr = server.local_addr();
    let file: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    let len = file.len() as u64;
    let blob = server.register_blob(file.into());

    // No application yet: the PPE leaves connections in the kernel's backlog.
    let mut long = TcpStream::connect(addr).expect("connect the long stream");
    long.set_read_timeout(Some(Duration::from_secs(20))).ok();
    thread::sleep(Duration::from_millis(20));
    for i in 0..SHORT {
        match TcpStream::connect(addr) {
            Ok(s) => drop(s),
            Err(e) => panic!("short connection {i}: {e}"),
        }
    }
    assert_eq!(
        server.stats().ppes[0].accepted,
        0,
        "accepted without an app"
    );

    let app = server.app();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let h = thread::spawn(move || apps::serve_stream(&app, blob, len, 8192, &stop2));
    let mut block = vec![0u8; 8192];
    for i in 0..5 {
        long.read_exact(&mut block)
            .unwrap_or_else(|e| panic!("block {i}: {e}"));
        long.write_all(b"a").expect("ack");
    }
    let accepted_by_then = server.stats().ppes[0].accepted;
    stop.store(true, Ordering::Release);
    h.join().expect("streamer");
    assert!(
        accepted_by_then < SHORT as u64 / 2,
        "the long stream got 5 blocks only after {accepted_by_then} of {} connections were accepted",
        SHORT + 1
    );
}
