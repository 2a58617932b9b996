//! The identifiers DisCo speaks in: endpoints, coherent objects, vnodes, and
//! the two kinds of access.

use serde::{Deserialize, Serialize};

/// A numbered participant of a session (§4.1): never an IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Endpoint(pub u32);

/// A coherent object: a region of the physical space (its 64-bit address),
/// a vnode's lists, a stream record — DisCo does not care which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ObjectId(pub u64);

/// A virtual inode's globally unique number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VnodeId(pub u64);

/// What `access()` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Read,
    Write,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "endpoint {}", self.0)
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "object {:#x}", self.0)
    }
}

/// The MOESI state of one endpoint's copy, as Fig. 6.2 labels pages.
///
/// The seed never gives its "modified MOESI" table; this crate's is:
/// * **M** — owner, sole copy, written since it left the manager's backing
///   store (dirty): a release or `VNODECLOSE` must return the data.
/// * **O** — owner, dirty, shared read-only with the copyset.
/// * **E** — owner, sole copy, clean.
/// * **S** — a read-only copy (a sharer, or a clean owner with sharers).
/// * **I** — no copy.
///
/// Only the owner of an M or E copy may write. A write from O or S first
/// invalidates every sharer (write-invalidate); a read from I joins the
/// owner's copyset and turns M into O and E into S.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Moesi {
    M,
    O,
    E,
    S,
    I,
}
