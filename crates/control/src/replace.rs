//! HYDRA's reaction to a dead PE: when an Orion monitor of this process declares a
//! PE dead (`sidecore_orion::health`) — a peer node (the ring's monitor) or a
//! dedicated core of this machine (the core monitor) — its offcodes fail with the
//! declaration as the reason, and every app with an offcode on it is re-solved
//! from its manifest without that PE. Where the new layout leaves every other
//! offcode where it is, only the dead PE's offcodes are started again, on the PEs
//! that are left, and the offcodes they talked to are rewired in place
//! (`Runtime::relocate`): the rest of the app never stops. Where that cannot be
//! done (the log says why: the layout moved a survivor too, a neighbour had
//! already ended, ...), the whole app is stopped and started again from its
//! manifest. Either way its pipeline resumes. The dead PE stays out of every later
//! layout until a monitor sees it recover. Each step goes to the event log (app
//! `orion` for the declarations, the app's own name for its re-placement). When
//! no PE is left that can take an offcode, the app stays stopped and the log says
//! why (`cannot re-place without PE: ...`).

use std::path::{Path, PathBuf};
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
        // Two PEs declared dead together: their re-placements take turns, so
        // neither plans against an app the other is moving.
        let _one_at_a_time = self
            .replacing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
            let replaced = |to_id: u64, moves: String| {
                let kind = EventKind::Replaced {
                    without: pe.to_string(),
                    from_id: id,
                    to_id,
                    moves,
                };
                self.runtime().events().emit(&app, "-", kind);
            };
            let why_whole = match self.relocate(id, pe, &path) {
                Ok(moved) => {
                    replaced(id, moves(moved.iter().map(|(o, to)| (o, to))));
                    continue;
                }
                Err(why) => why,
            };
            emit(format!(
                "cannot move only the offcodes on {pe} ({why_whole}): restarting the whole app"
            ));
            self.stop(id);
            match self.up(&path) {
                Ok(r) => replaced(r.id, moves(r.placements.iter().map(|(o, to, _)| (o, to)))),
                Err(e) => emit(format!("cannot re-place without {pe}: {e}")),
            }
        }
    }

    /// Re-solves app `id` from its manifest without the dead PE (the app's own
    /// holds set aside) and moves only the offcodes that ran on `pe`. The
    /// offcodes that live are held to the PEs they run on, so the solver
    /// places only the dead PE's; if that has no solution, it solves freely
    /// (and a survivor that moves then means a whole restart).
    fn relocate(&self, id: AppId, pe: &str, path: &Path) -> Result<Vec<(String, String)>, String> {
        let manifest = sidecore_manifest::load(path).map_err(|e| e.render(false))?;
        let status = self
            .runtime()
            .status_of(id)
            .ok_or_else(|| format!("app {id} is gone"))?;
        let stay: Vec<(String, String)> = status
            .offcodes
            .iter()
            .filter(|o| o.pe != pe)
            .map(|o| (o.name.clone(), o.pe.clone()))
            .collect();
        let held = self.release_holds(id);
        let placed = self
            .plan_held(&manifest, &stay)
            .or_else(|_| self.plan(&manifest))
            .map_err(|e| e.to_string())
            .and_then(|plan| {
                let moved = self
                    .runtime()
                    .relocate(id, pe, &plan)
                    .map_err(|e| e.to_string())?;
                Ok((plan, moved))
            });
        match placed {
            Ok((plan, moved)) => {
                self.hold(id, &manifest, &plan);
                Ok(moved)
            }
            Err(e) => {
                self.restore_holds(id, held);
                Err(e)
            }
        }
    }
}

/// "offcode → PE" for each move, comma-separated.
fn moves<'a>(placements: impl Iterator<Item = (&'a String, &'a String)>) -> String {
    placements
        .map(|(o, to)| format!("{o} → {to}"))
        .collect::<Vec<_>>()
        .join(", ")
}
