//! HYDRA's reaction to a dead PE: when an Orion monitor of this process declares a
//! PE dead (`sidecore_orion::health`) — a peer node (the ring's monitor) or a
//! dedicated core of this machine (the core monitor) — its offcodes fail with the
//! declaration as the reason, and every app with an offcode on it is re-solved
//! without that PE and started again from its manifest — its offcodes land on the PEs
//! that are left, and its pipeline resumes. The dead PE stays out of every later
//! layout until a monitor sees it recover. Each step goes to the event log (app
//! `orion` for the declarations, the app's own name for its re-placement). When
//! no PE is left that can take an offcode, the app stays stopped and the log says
//! why (`cannot re-place without PE: ...`).
//!
//! The whole app restarts, not only the offcodes of the dead PE: its channels to
//! offcodes that lived are rebuilt with the new layout.

use std::path::PathBuf;
use std::sync::Arc;

use sidecore_orion::health::Declaration;
use sidecore_runtime::EventKind;
use sidecore_types::AppId;

use crate::daemon::Daemon;

/// The event log's app name for declarations.
pub const EVENTS_APP: &str = "orion";

impl Daemon {
    /// Hears the process's health board: declarations go to the event log, and a
    /// dead PE's apps are re-placed on a thread of their own (the declaring monitor's
    /// thread is not held up).
    pub fn follow_health(self: &Arc<Self>) {
        let d = Arc::downgrade(self);
        sidecore_orion::health::subscribe(move |decl| {
            let Some(d) = d.upgrade() else { return };
            d.note_declaration(decl);
            if decl.dead {
                let pe = decl.pe.clone();
                let _ = std::thread::Builder::new()
                    .name("sc-replace".into())
                    .spawn(move || d.replace_off(&pe));
            }
        });
    }

    fn note_declaration(&self, decl: &Declaration) {
        let message = if decl.dead {
            format!(
                "{} declared dead by {}: {}",
                decl.pe, decl.by, decl.evidence
            )
        } else {
            format!(
                "{} recovered (seen by {}): {}",
                decl.pe, decl.by, decl.evidence
            )
        };
        self.runtime()
            .events()
            .emit(EVENTS_APP, &decl.pe, EventKind::App { message });
    }

    /// Re-places every app deployed from a manifest that has an offcode on `pe`.
    pub fn replace_off(&self, pe: &str) {
        self.runtime().fail_on_dead_pes();
        let affected: Vec<(AppId, String, PathBuf)> = self
            .manifests()
            .into_iter()
            .filter_map(|(id, path)| {
                let s = self.runtime().status_of(id)?;
                s.offcodes
                    .iter()
                    .any(|o| o.pe == pe)
                    .then_some((id, s.name, path))
            })
            .collect();
        for (id, app, path) in affected {
            let emit = |message: String| {
                self.runtime()
                    .events()
                    .emit(&app, "-", EventKind::App { message });
            };
            self.stop(id);
            match self.up(&path) {
                Ok(r) => {
                    let moved: Vec<String> = r
                        .placements
                        .iter()
                        .map(|(o, to, _)| format!("{o} → {to}"))
                        .collect();
                    emit(format!(
                        "re-placed without {pe} (id {} → {}): {}",
                        id,
                        r.id,
                        moved.join(", ")
                    ));
                }
                Err(e) => emit(format!("cannot re-place without {pe}: {e}")),
            }
        }
    }
}
