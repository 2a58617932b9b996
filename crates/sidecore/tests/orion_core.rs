//! Orion's watch of dedicated cores and HYDRA's reaction to a dead one (as root): a
//! `sidecore daemon` (core watch at refresh 25 ms, k = 8 — a deadline of 200 ms, above
//! what a loaded CI machine starves an ordinary thread) runs a pipeline
//! record-source (host) → inet-checksum (a dedicated core) → inet-checksum (host).
//! A real-time hog — a SCHED_FIFO thread at the top priority, pinned to that core's
//! CPU — takes the CPU from the executor: the monitor declares the core dead with its
//! evidence, the relay fails with it as the reason, the daemon re-solves the layout
//! without the core and restarts the pipeline, whose relay lands elsewhere, and records
//! flow again while the hog still runs. Once the hog stops, the core is seen to recover.
//! The hog is bounded ([`HOG_MAX`]) and stopped when the test ends, pass or fail.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed run

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use sidecore_testbed::testing::root;

/// The longest the hog may hold its CPU, whatever happens to the test.
const HOG_MAX: Duration = Duration::from_secs(15);

fn pipeline_manifest(dir: &Path) -> PathBuf {
    let params = "record_size = 64, records = 0, rate = 2000";
    chain_manifest(
        dir,
        "pipeline",
        "6c2e0b63-9d52-4f1c-b7e3-8c6fad1a2c0",
        ("relay", "core"),
        params,
    )
}

fn app(sock: &Path) -> Option<serde_json::Value> {
    let o = run(&["ps", "--json", "--socket", sock.to_str().unwrap()]);
    let v: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).ok()?;
    v.into_iter()
        .find(|a| a["name"] == "pipeline" && a["state"] == "running")
}

fn relay_pe(sock: &Path) -> Option<String> {
    let a = app(sock)?;
    let o = a["offcodes"]
        .as_array()?
        .iter()
        .find(|o| o["name"] == "relay")?;
    o["pe"].as_str().map(str::to_owned)
}

fn back_records(sock: &Path) -> Option<u64> {
    let a = app(sock)?;
    let o = a["offcodes"]
        .as_array()?
        .iter()
        .find(|o| o["name"] == "back")?;
    o["metrics"]["records"].as_u64()
}

/// Records reach the end of the pipeline: its count grows over half a second.
fn flowing(sock: &Path) -> bool {
    let Some(a) = back_records(sock) else {
        return false;
    };
    std::thread::sleep(Duration::from_millis(500));
    back_records(sock).is_some_and(|b| b > a)
}

fn events(sock: &Path) -> Vec<String> {
    let o = run(&["events", "--socket", sock.to_str().unwrap()]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn logged(sock: &Path, what: &str) -> Option<String> {
    events(sock).into_iter().find(|l| l.contains(what))
}

/// A SCHED_FIFO thread at the top priority spinning on one CPU until dropped (or
/// [`HOG_MAX`]).
struct Hog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Hog {
    fn start(cpu: usize) -> Hog {
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let cpu_n = u32::try_from(cpu).map_err(|e| format!("pin: {e}"))?;
            sidecore_pe::cores::pin_current_thread(cpu_n).map_err(|e| format!("pin: {e}"))?;
            // SAFETY: sched_param is plain data and pid 0 is this thread; the
            // parameters are valid for the calls.
            unsafe {
                let p = libc::sched_param {
                    sched_priority: libc::sched_get_priority_max(libc::SCHED_FIFO),
                };
                if libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) != 0 {
                    return Err(format!("SCHED_FIFO: {}", std::io::Error::last_os_error()));
                }
            }
            let t0 = Instant::now();
            while !st.load(Ordering::Relaxed) && t0.elapsed() < HOG_MAX {
                std::hint::spin_loop();
            }
            Ok(())
        });
        Hog {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start_daemon(dir: &Path) -> (Guard, PathBuf) {
    let sock = dir.join("d.sock");
    let log = std::fs::File::create(dir.join("d.log")).unwrap();
    let child = bin()
        .args(["daemon", "--http", "off", "--socket"])
        .arg(&sock)
        .args(["--core-refresh-ms", "25", "--core-k", "8"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let g = Guard(child);
    assert!(
        wait_for(
            || sock.exists()
                && run(&["ps", "--socket", sock.to_str().unwrap()])
                    .status
                    .success(),
            20
        ),
        "the daemon never answered"
    );
    (g, sock)
}

#[test]
fn a_starved_core_is_declared_dead_its_offcode_moves_and_the_pipeline_resumes() {
    if !root() {
        eprintln!("skipped: needs root (SCHED_FIFO)");
        return;
    }
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let (_d, sock) = start_daemon(dir.path());
    let s = sock.to_str().unwrap();
    let o = run(&[
        "up",
        "-d",
        "--socket",
        s,
        pipeline_manifest(dir.path()).to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        wait_for(|| flowing(&sock), 20),
        "never flowed: {:?}",
        app(&sock)
    );
    let pe = relay_pe(&sock).unwrap();
    let id = app(&sock).unwrap()["id"].clone();
    let cpu: usize = pe
        .strip_prefix("core:")
        .unwrap_or_else(|| panic!("the relay is on {pe}, not a core"))
        .parse()
        .unwrap();

    let mut hog = Hog::start(cpu);
    let declared = format!("{pe} declared dead by local: core {cpu}: executor turns flat");
    assert!(
        wait_for(|| logged(&sock, &declared).is_some(), 20),
        "never declared: {:#?}",
        events(&sock)
    );
    let line = logged(&sock, &declared).unwrap();
    eprintln!("{line}");
    assert!(line.contains("for 8 refreshes of 25.0 ms"), "{line}");
    assert!(line.contains("waiting for the CPU"), "{line}");
    // The relay failed with the declaration as its reason.
    let failed =
        format!("pipeline/relay: failed: {pe} declared dead by the Orion monitor of local");
    assert!(
        wait_for(|| logged(&sock, &failed).is_some(), 10),
        "{:#?}",
        events(&sock)
    );
    assert!(
        wait_for(
            || logged(
                &sock,
                &format!("re-placed only the offcodes on {pe} (id {id} kept, the rest ran on)")
            )
            .is_some(),
            20
        ),
        "never re-placed: {:#?}",
        events(&sock)
    );
    let moved = relay_pe(&sock).unwrap();
    assert_ne!(moved, pe, "{:?}", app(&sock));
    // The same app: only the relay moved, the source and the sink were rewired.
    assert_eq!(app(&sock).unwrap()["id"], id, "{:?}", app(&sock));
    // Records flow again with the hog still on the dead core.
    assert!(
        wait_for(|| flowing(&sock), 20),
        "never resumed: {:?}",
        app(&sock)
    );
    assert!(
        !hog.thread.as_ref().unwrap().is_finished(),
        "the hog ended before the pipeline resumed (HOG_MAX too short for this machine)"
    );
    hog.stop();

    // Without the hog, the core runs its probe again: it recovers.
    assert!(
        wait_for(|| logged(&sock, &format!("{pe} recovered")).is_some(), 20),
        "never recovered: {:#?}",
        events(&sock)
    );
    let o = run(&["down", "--daemon", "--socket", s]);
    assert!(o.status.success(), "{:?}", text(&o));
}
