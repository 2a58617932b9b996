//! sidecore manifests: HYDRA's Offcode Description File (§4.3), done properly,
//! in TOML.
//!
//! A manifest declares an application's offcodes (name, GUID, interfaces with
//! methods, ports), their imports (each with a constraint: `link`, `pull`,
//! `gang`, `asym-gang`), the PE kinds each can target and what it requires
//! there, the attributes (priority, `watchdog_ms`, `obsolete_ms`, the
//! `restart` policy), and the
//! channels between them with their properties. Imports that name another file
//! are followed recursively; cycles are reported. Every problem is reported with
//! its file, line and column ([`ManifestError`]); loading never panics.
//!
//! ```toml
//! [app]
//! name = "checksum-demo"
//!
//! [[offcode]]
//! name = "source"
//! id = "5b0c1e7a-2d43-4f4e-9b0a-6c1f0e6f2a01"
//! impl = "record-source"
//! priority = "high"
//! outputs = ["out"]
//! [[offcode.target]]
//! kind = "core"
//! [[offcode.import]]
//! offcode = "checksum"
//! constraint = "gang"
//! ```

mod calls;
mod diag;
mod load;
mod model;
mod props;
mod raw;
mod restart;
mod timing;

pub use calls::{CALL_SLOT_SIZE, CALL_SLOTS};
pub use diag::{FileId, ManifestError, Origin, Sources};
pub use load::{DEFAULT_CPU, DEFAULT_MEMORY, MAX_IMPORT_DEPTH, load, parse_str};
pub use model::*;
pub use props::{MAX_SLOT_SIZE, MAX_SLOTS};
