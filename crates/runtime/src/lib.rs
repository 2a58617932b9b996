//! sidecore's runtime: from a manifest to running, supervised offcodes.
//!
//! * [`plan`] — library lookup with host fallback, the layout (MILP), channel
//!   transports and related groups.
//! * [`deploy`] — the [`Runtime`]: deployment in priority order with two-phase
//!   start, the supervisor (watchdog, obsolete time), status and teardown.
//! * [`executor`] — run-to-completion loops on pinned cores and host threads.
//! * [`remote`] — parts of an app on peer nodes: handing them over, the
//!   stream channels between machines, and the lease.
//! * [`tree`] — the resource tree that makes teardown complete.
//! * [`events`] — the event log of the life cycle.

pub mod deploy;
pub mod events;
pub mod executor;
pub mod plan;
pub mod remote;
pub mod tree;

pub use deploy::{AppId, AppState, AppStatus, DeployError, OffcodeStatus, Runtime, RuntimeConfig};
pub use events::{Event, EventKind, EventLog};
pub use executor::{IdlePolicy, OffcodeState};
pub use plan::{Plan, PlanError, PlannedChannel, PlannedOffcode, Transport, plan};
pub use tree::{ResourceKind, ResourceTree};
