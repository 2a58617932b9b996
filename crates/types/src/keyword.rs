//! The error of a manifest keyword that names no variant (`kind = "cpu"`),
//! shared by every keyword enum; on the ground floor so that modules beside
//! the crate root use it without importing the root.

/// The error returned when a keyword does not name a known variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{got}`; expected one of: {expected}")]
pub struct UnknownKeyword {
    pub what: &'static str,
    pub got: String,
    pub expected: &'static str,
}
