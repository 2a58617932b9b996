//! The packet offcode family ([`register`] adds it to a library):
//!
//! | name | PEs | what it does |
//! |---|---|---|
//! | `firewall` | kernel, core, host | SCIRON (HYDRA §8.4): first-match 5-tuple rules, default deny, log rules. On the kernel PE an XDP program ([`firewall::XdpOffcode`]); on a dedicated core a raw-socket forwarder running the same classifier ([`firewall::CoreOffcode`]); on the host the same rules as nftables ([`firewall::NftOffcode`]). |
//! | `traffic-generator` | core, host | fixed-size UDP streams at a rate or flat out (HYDRA §8.3): raw frames with qdisc bypass on a dedicated core, a plain socket loop on the host |
//! | `traffic-analyser` | core, host | counts and timestamps what arrives: rate, gaps, inter-arrival mean and standard deviation, delay |
//!
//! Every one of them runs in a network namespace of the testbed when its
//! parameters name one (`netns = "sidecore-middlebox"`).

pub mod analyser;
pub mod firewall;
pub mod generator;
mod util;

use std::sync::Arc;

use sidecore_offcode::{Implementation, Interfaces, Registry};
use sidecore_types::PeKind;

/// Adds the packet offcodes to `reg`.
pub fn register(reg: &mut Registry) {
    reg.register(Implementation {
        name: "firewall".into(),
        description: "SCIRON: first-match 5-tuple rules with default deny and log rules; XDP on the kernel PE, a raw-socket forwarder on a core, nftables on the host".into(),
        kinds: vec![PeKind::Kernel, PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec!["log".into()]),
        factory: Arc::new(firewall::build),
        validate: Some(Arc::new(|p| firewall::Params::parse(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: "traffic-generator".into(),
        description: "fixed-size UDP streams at a rate or flat out: raw frames with qdisc bypass on a core, a socket loop on the host".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec![]),
        factory: Arc::new(generator::build),
        validate: Some(Arc::new(|p| generator::Params::parse(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: "traffic-analyser".into(),
        description: "counts and timestamps arriving UDP frames: rate, gaps, inter-arrival mean and deviation".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec![]),
        factory: Arc::new(analyser::build),
        validate: Some(Arc::new(|p| analyser::Params::parse(p).map(drop))),
        interfaces: Interfaces::default(),
    });
}
