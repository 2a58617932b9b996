//! Sikker's service-oriented permission model (dissertation ch. 4), its TOML policy
//! language, and the Network OS compiler that turns a policy plus a placement into
//! per-host NMU tables (§4.6, §6.1.4).
//!
//! - [`model`]: services, processes, domains, portals, grants, rate limits, and the
//!   SACL they expand to (§3.1: `allow ⇔ proc ∈ Procs(src,dst) ∧ dom ∈ Doms(src,dst)`,
//!   a full cross product of the two lists; "process 6 only with Get" cannot be
//!   written, by design).
//! - [`parse`]: TOML policies and placements, validated with `file:line:col` errors.
//! - [`nos`]: the compiler and its incremental updates.

pub mod model;
pub mod nos;
pub mod parse;

pub use model::{Grant, GrantTarget, Policy, Portal, RateLimit, Sacl, SaclEntry, Service};
pub use nos::{Delta, Nos, NosError, Placement};
pub use parse::{Diagnostic, PolicyErrors, parse_placement, parse_policy};
