//! sidecore's built-in native offcodes (trusted Rust, run on `core` or `host`
//! PEs). [`register`] adds them all to a registry.
//!
//! | name | what it does |
//! |---|---|
//! | `record-source` | generates fixed-size, numbered records as fast as its output accepts them (or at a set rate) |
//! | `inet-checksum` | computes the RFC 1071 Internet checksum of every record it receives |
//! | `kv-store` | a key-value map that serves interface `IKeyValue` (put, get, len) through calls |
//! | `ticker` | a periodic job of `work_us` busy work per turn, for a shared core's scheduler |
//! | `kv-client` | calls `IKeyValue` from a fixed script, synchronously or not, and checks every reply |
//! | `fault-injector` | forwards records and fails on purpose after `fail_after` of them (an error or a stalled turn), to try restart policies on |

pub mod checksum;
pub mod fault;
pub mod kv;
pub mod source;
pub mod ticker;

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
    reg.register(Implementation {
        name: "kv-store".into(),
        description: "key-value map serving IKeyValue (put, get, len) to the offcodes that use it"
            .into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec![]),
        factory: Arc::new(|spec| Ok(Box::new(kv::KvStore::new(spec.params)?))),
        validate: Some(Arc::new(|p| kv::KvStore::new(p).map(drop))),
        interfaces: Interfaces {
            provides: vec![kv::kv_interface()],
            requires: vec![],
        },
    });
    reg.register(Implementation {
        name: "kv-client".into(),
        description: "calls IKeyValue: puts `keys` entries, reads each back, checks every reply"
            .into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec![]),
        factory: Arc::new(|spec| Ok(Box::new(kv::KvClient::new(spec.params)?))),
        validate: Some(Arc::new(|p| kv::KvClient::new(p).map(drop))),
        interfaces: Interfaces {
            provides: vec![],
            requires: vec![kv::kv_interface()],
        },
    });
    reg.register(Implementation {
        name: "fault-injector".into(),
        description: "forwards records from `in` to `out`; fails on purpose after `fail_after` records per life (`fail = \"error\"` or `\"stall\"`), for the first `failing_lives` lives".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec!["in".into()]),
        outputs: Some(vec!["out".into()]),
        factory: Arc::new(|spec| Ok(Box::new(fault::FaultInjector::new(spec.params)?))),
        validate: Some(Arc::new(|p| fault::FaultInjector::new(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: "ticker".into(),
        description: "a periodic job: `work_us` of busy work per turn, with its job count and the gaps between jobs".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec![]),
        factory: Arc::new(|spec| Ok(Box::new(ticker::Ticker::new(spec.params)?))),
        validate: Some(Arc::new(|p| ticker::Ticker::new(p).map(drop))),
        interfaces: Interfaces::default(),
    });
}
