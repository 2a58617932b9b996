//! Stage 6 of the pipeline, **supervise** (HYDRA §4.1.1): the runtime's
//! supervisor thread calls [`sweep`] every `supervise_every` over the running
//! apps. It fails the offcodes that run on a PE an Orion monitor declared
//! dead ([`crate::dead`]), enforces each offcode's watchdog (a turn that has been running for
//! longer than its period right now: the executor itself catches the turns
//! that overran once they return) and obsolete time (counted from landing),
//! owns restarts, and finds the apps whose offcodes have all finished, for
//! the runtime to release.
//!
//! **Restarts.** An offcode whose manifest says `restart = "on-failure"` is
//! parked by its executor when it fails (an error from a turn, or its
//! watchdog): stopped, its ports kept. The supervisor then decides with its
//! [`crate::restart::RestartTracker`] (sans-IO): restart it after a backoff that doubles with
//! each restart in the window, or, with `limit` restarts already within
//! `window_ms`, leave it failed and let its executor dispose of it. A restart
//! is a [`Command::Restart`] to its executor, which rebuilds, initializes and
//! starts it on the same PE. Every step is an event; `ps` and `/metrics`
//! count the restarts.

use std::time::Instant;

use crossbeam_channel::Sender;
use sidecore_types::{AppState, OffcodeState};

use crate::app::AppEntry;
use crate::events::{EventKind, EventLog};
use crate::executor::Command;
use crate::handle::{OffcodeHandle, millis};
use crate::restart::Decision;
use crate::tree::ResourceId;

/// One look at every app; returns the apps that have just finished, as
/// (resource-tree root, name), for the caller to tear down.
pub fn sweep(apps: &mut [AppEntry], events: &EventLog) -> Vec<(ResourceId, String)> {
    let mut finished = Vec::new();
    let now = Instant::now();
    for a in apps.iter_mut() {
        if a.state == AppState::Running {
            crate::dead::sweep(a, events);
        }
        watchdogs(a, events);
        obsolete(a, events);
        restarts(a, events, now);
        if a.state == AppState::Running && a.handles.iter().all(|h| h.exited()) {
            a.state = AppState::Finished;
            a.finished = Some(Instant::now());
            finished.push((a.root, a.name.clone()));
        }
    }
    finished
}

/// An offcode whose current turn has overrun its period fails.
fn watchdogs(a: &AppEntry, events: &EventLog) {
    for e in &a.executors {
        if let Some((h, elapsed)) = e.running()
            && let Some(wd) = h.watchdog
            && elapsed > wd
        {
            h.expire_watchdog(events, &a.name, wd, elapsed, || {
                format!(
                    "watchdog: no progress for {} ms (period {} ms)",
                    elapsed.as_millis(),
                    wd.as_millis()
                )
            });
        }
    }
}

/// An offcode past its obsolete time is asked to stop.
fn obsolete(a: &AppEntry, events: &EventLog) {
    for h in &a.handles {
        if let Some(life) = h.obsolete
            && h.landed_at.elapsed() > life
            && !h.state().is_final()
            && h.stop_reason().is_none()
        {
            events.emit(
                &a.name,
                &h.name,
                EventKind::Obsolete {
                    lifetime_ms: millis(life),
                },
            );
            h.request_stop(format!("obsolete after {} ms", life.as_millis()));
        }
    }
}

/// Parked offcodes: decide, and restart those whose backoff has passed.
/// Commands are sent without waiting: an executor busy with another
/// offcode's turn answers when it can, and never holds up the sweep.
fn restarts(a: &mut AppEntry, events: &EventLog, now: Instant) {
    for (h, r) in a.handles.iter().zip(a.restarters.iter_mut()) {
        let Some(tx) = &r.tx else { continue };
        if h.take_parked() {
            decide(&a.name, h, r.tracker.failed(now), tx, events);
        }
        if r.tracker.take_due(now) {
            let (reply, _) = crossbeam_channel::bounded(1);
            if tx.send(Command::Restart(h.name.clone(), reply)).is_err() {
                h.note_reason("restart: its executor is gone");
            }
        }
    }
}

/// Tells the log what was decided about a failure, and carries out a
/// give-up: the executor lets the parked offcode go, failed.
fn decide(app: &str, h: &OffcodeHandle, d: Decision, tx: &Sender<Command>, events: &EventLog) {
    let p = h.restart;
    match d {
        Decision::Restart {
            attempt, backoff, ..
        } => events.emit(
            app,
            &h.name,
            EventKind::Restarting {
                attempt,
                limit: p.limit,
                window_ms: p.window_ms,
                backoff_ms: millis(backoff),
            },
        ),
        Decision::GiveUp { restarts } => {
            events.emit(
                app,
                &h.name,
                EventKind::RestartLimit {
                    restarts,
                    window_ms: p.window_ms,
                },
            );
            let reason = format!(
                "failed after {restarts} restarts within {} ms (restart limit)",
                p.window_ms
            );
            h.note_reason(&reason);
            h.set_state(OffcodeState::Failed);
            let (ack, _) = crossbeam_channel::bounded(1);
            let _ = tx.send(Command::Stop(h.name.clone(), reason, ack));
        }
    }
}
