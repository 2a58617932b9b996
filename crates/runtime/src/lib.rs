//! sidecore's runtime: from a manifest to running, supervised offcodes.
//!
//! Deploying is a pipeline. Each stage is a function from one typed value to
//! the next, and no stage calls back into an earlier one:
//!
//! ```text
//! parse      Path                            → Manifest   sidecore_manifest::load
//! resolve    Manifest × Inventory × Registry → Resolved   resolve::resolve   (candidates per offcode, the layout problem)
//! place      Resolved × SolveOptions         → Placed     place::place       (the MILP layout)
//! plan       Placed                          → Plan       plan::plan         (implementations, transports, groups)
//! start      Plan                            → AppId      Runtime::deploy    (start::start: build, delegate, connect, land, start)
//! supervise  the running apps                             supervisor::sweep  (watchdog, obsolete time, restarts, reaping)
//! ```
//!
//! [`plan_manifest`] runs resolve → place → plan in one call.
//!
//! Modules, bottom floor first: [`events`], [`tree`], [`dispatch`] (which
//! offcode's turn is next on a shared core), [`handle`] (an
//! offcode as the control plane sees it), [`executor`] (run-to-completion
//! loops on pinned cores and host threads), [`transport`] (the channel
//! factory); [`resolve`], [`place`], [`plan`]; [`node`] (parts on peer nodes:
//! the origin's side and the peer's); [`interfaces`] (manifest interfaces
//! against the library, used by resolve and `sidecore check`); [`serve`]
//! (the provider's side of calls, used by the executor); [`dead`] (offcodes
//! on a PE an Orion monitor declared dead fail); [`start`],
//! [`restart`] (the restart decisions, sans-IO), [`supervisor`], [`app`];
//! [`relocate`] (only a dead PE's offcodes move, their neighbours rewired);
//! [`runtime`] (the [`Runtime`] itself); [`error`] is shared by all.

pub mod app;
pub mod dead;
pub mod dispatch;
pub mod error;
pub mod events;
pub mod executor;
pub mod handle;
pub mod interfaces;
pub mod node;
pub mod place;
pub mod plan;
pub mod relocate;
pub mod resolve;
pub mod restart;
pub mod runtime;
pub mod serve;
pub mod start;
pub mod supervisor;
pub mod transport;
pub mod tree;

pub use error::{ControlError, DeployError, PlanError};
pub use events::{Event, EventKind, EventLog};
pub use executor::IdlePolicy;
pub use plan::{Plan, PlannedChannel, PlannedOffcode};
pub use relocate::RelocateError;
pub use runtime::{Runtime, RuntimeConfig};
pub use sidecore_types::{AppId, AppState, AppStatus, OffcodeState, OffcodeStatus};
pub use transport::Transport;
pub use tree::{ResourceKind, ResourceTree};

use sidecore_layout::SolveOptions;
use sidecore_manifest::Manifest;
use sidecore_offcode::Registry;
use sidecore_pe::Inventory;

/// Resolves, places and plans a manifest: everything before start.
pub fn plan_manifest(
    manifest: &Manifest,
    inventory: &Inventory,
    registry: &Registry,
    opts: &SolveOptions,
) -> Result<Plan, PlanError> {
    plan_manifest_held(manifest, inventory, registry, opts, &[])
}

/// [`plan_manifest`] with some offcodes held to PEs, as (offcode, PE id): the
/// layout places only the others (re-placing the offcodes of a dead PE while
/// the rest stay where they run). A hold the PE cannot honour is ignored.
pub fn plan_manifest_held(
    manifest: &Manifest,
    inventory: &Inventory,
    registry: &Registry,
    opts: &SolveOptions,
    held: &[(String, String)],
) -> Result<Plan, PlanError> {
    let mut resolved = resolve::resolve(manifest, inventory, registry)?;
    for (offcode, pe) in held {
        resolved.hold(offcode, pe);
    }
    let placed = place::place(resolved, opts)?;
    plan::plan(&placed)
}
