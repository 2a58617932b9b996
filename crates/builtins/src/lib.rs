//! sidecore's built-in native offcodes (trusted Rust, run on `core` or `host`
//! PEs). [`register`] adds them all to a registry.
//!
//! | name | what it does |
//! |---|---|
//! | `record-source` | generates fixed-size, numbered records as fast as its output accepts them (or at a set rate) |
//! | `inet-checksum` | computes the RFC 1071 Internet checksum of every record it receives |

pub mod checksum;
pub mod source;

use std::sync::Arc;

use sidecore_offcode::{Implementation, Interfaces, Registry};
use sidecore_types::PeKind;

/// Adds every built-in offcode to `reg`.
pub fn register(reg: &mut Registry) {
    reg.register(Implementation {
        name: "record-source".into(),
        description:
            "numbered fixed-size records, as fast as the output accepts or at `rate` per second"
                .into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec!["out".into()]),
        factory: Arc::new(|spec| Ok(Box::new(source::RecordSource::new(spec.params)?))),
        validate: Some(Arc::new(|p| source::RecordSource::new(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: "inet-checksum".into(),
        description: "RFC 1071 Internet checksum of every record; forwards (sequence, checksum) on `out` if connected".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec!["in".into()]),
        outputs: Some(vec!["out".into()]),
        factory: Arc::new(|spec| Ok(Box::new(checksum::InetChecksum::new(spec.params)?))),
        validate: Some(Arc::new(|p| checksum::InetChecksum::new(p).map(drop))),
        interfaces: Interfaces::default(),
    });
}
