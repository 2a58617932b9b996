//! Stage 6 of the pipeline, **supervise** (HYDRA §4.1.1): the runtime's
//! supervisor thread calls [`sweep`] every `supervise_every` over the running
//! apps. It enforces each offcode's watchdog (a turn that has been running for
//! longer than its period right now: the executor itself catches the turns
//! that overran once they return) and obsolete time (counted from landing),
//! and finds the apps whose offcodes have all finished, for the runtime to
//! release.

use std::time::Instant;

use sidecore_types::AppState;

use crate::app::AppEntry;
use crate::events::{EventKind, EventLog};
use crate::handle::millis;
use crate::tree::ResourceId;

/// One look at every app; returns the apps that have just finished, as
/// (resource-tree root, name), for the caller to tear down.
pub fn sweep(apps: &mut [AppEntry], events: &EventLog) -> Vec<(ResourceId, String)> {
    let mut finished = Vec::new();
    for a in apps.iter_mut() {
        watchdogs(a, events);
        obsolete(a, events);
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
