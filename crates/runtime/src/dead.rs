//! Offcodes on a PE an Orion monitor of this process declared dead
//! (`sidecore_orion::health`): they fail, with the declaration as the reason.
//! One path for both kinds of PE: the origin's mirror of a peer node's part
//! ([`crate::node::origin`]) and the supervisor's sweep over the offcodes that
//! run here ([`sweep`]: a dedicated core the core monitor declared dead).
//! Re-placing them elsewhere is the daemon's part (it re-solves the layout
//! without the dead PE and starts the app again).
//!
//! The executor of a dead core may never run again: teardown waits for it at
//! most [`DEAD_PE_GRACE`] ([`crate::start`]) and then leaves it behind. If it
//! does run (the declaration was a false positive), it *holds* the failed
//! offcodes: their instances stop, but their channel ends stay open, as a dead
//! PE's would, so that their neighbours do not end before the re-placement
//! rewires them ([`crate::relocate`]).

use std::sync::Arc;
use std::time::Duration;

use sidecore_orion::health::Declaration;
use sidecore_types::OffcodeState;

use crate::app::AppEntry;
use crate::events::{EventKind, EventLog};
use crate::handle::OffcodeHandle;

/// How long the teardown of an offcode or executor on a dead PE waits for it.
pub const DEAD_PE_GRACE: Duration = Duration::from_secs(2);

/// The reason an offcode on `d.pe` fails.
pub fn reason(d: &Declaration) -> String {
    format!(
        "{} declared dead by the Orion monitor of {}: {}",
        d.pe, d.by, d.evidence
    )
}

/// The reason an offcode on `pe` fails, if `pe` stands declared dead.
pub fn declared(pe: &str) -> Option<String> {
    sidecore_orion::health::dead()
        .into_iter()
        .find(|d| d.pe == pe)
        .map(|d| reason(&d))
}

/// Fails every offcode of `handles` that has not exited, for `why`.
pub fn fail<'a>(
    handles: impl IntoIterator<Item = &'a Arc<OffcodeHandle>>,
    app: &str,
    events: &EventLog,
    why: &str,
) {
    for h in handles.into_iter().filter(|h| !h.exited()) {
        h.request_stop(why);
        h.set_state(OffcodeState::Failed);
        events.emit(
            app,
            &h.name,
            EventKind::Failed {
                error: why.to_string(),
            },
        );
        h.set_exited();
    }
}

/// Fails the offcodes of a running app that run here on a PE declared dead
/// (those on peer nodes are the origin's mirror's).
pub fn sweep(a: &AppEntry, events: &EventLog) {
    let dead = sidecore_orion::health::dead();
    if dead.is_empty() {
        return;
    }
    for d in &dead {
        let on_it = a
            .handles
            .iter()
            .zip(&a.restarters)
            .filter(|(h, r)| r.tx.is_some() && h.pe == d.pe)
            .map(|(h, _)| h)
            // Before `fail` asks it to stop: its executor then holds it.
            .inspect(|h| h.hold_for_replacement());
        fail(on_it, &a.name, events, &reason(d));
    }
}
