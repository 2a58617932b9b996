//! The packet offcode family ([`register`] adds it to a library):
//!
//! | name | PEs | what it does |
//! |---|---|---|
//! | `firewall` | kernel, core, host | SCIRON (HYDRA §8.4): first-match 5-tuple rules, default deny, log rules. On the kernel PE an XDP program ([`firewall::XdpOffcode`]); on a dedicated core a raw-socket forwarder running the same classifier ([`firewall::CoreOffcode`]); on the host the same rules as nftables ([`firewall::NftOffcode`]). |
//! | `traffic-generator` | core, host | fixed-size UDP streams at a rate or flat out (HYDRA §8.3): raw frames with qdisc bypass on a dedicated core, a plain socket loop on the host |
//! | `traffic-analyser` | core, host | counts and timestamps what arrives: rate, gaps, inter-arrival mean and standard deviation, delay |
//! | `file` | core, host | TiVoPC (HYDRA §8.1): reads a file in fixed-size chunks into its output ring, paced by the ring's back-pressure |
//! | `streamer` | core, host | TiVoPC: paces the chunks as UDP datagrams at `rate` per second; busy-waits on a dedicated core, sleeps on the host; `send` = socket, sendfile or io_uring |
//! | `stream-receiver` | core, host | TiVoPC client: kernel-stamped arrivals, inter-arrival median, mean, deviation and p99; forwards chunks to the decoder |
//! | `decoder` | core, host | TiVoPC client: a stand-in for MPEG decoding (rounds of an IDCT-like butterfly per chunk), to cost CPU where it runs |
//!
//! It also registers `loader:kernel` ([`bpf_object`]): offcodes from a
//! user's own BPF object (`module = "x.bpf.o"` on a kernel target), their
//! ring buffers as output channels and their maps as configuration.
//!
//! Every one of them runs in a network namespace of the testbed when its
//! parameters name one (`netns = "sidecore-middlebox"`).

pub mod analyser;
pub mod bpf_object;
pub mod decoder;
pub mod file_source;
pub mod firewall;
pub mod generator;
pub mod receiver;
pub mod report;
pub mod streamer;
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
    reg.register(bpf_object::loader());
    register_tivo(reg);
}

/// The TiVoPC offcodes (HYDRA §8.1): file, streamer, stream-receiver, decoder.
fn register_tivo(reg: &mut Registry) {
    reg.register(Implementation {
        name: "file".into(),
        description: "reads a file in fixed-size chunks into its output ring (offset + bytes), as fast as the ring takes them".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec!["out".into()]),
        factory: Arc::new(file_source::build),
        validate: Some(Arc::new(|p| file_source::Params::parse(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: "streamer".into(),
        description: "paces the file's chunks as UDP datagrams at `rate` per second: busy-wait on a core, sleep on the host; send by socket, sendfile or io_uring".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec!["in".into()]),
        outputs: Some(vec![]),
        factory: Arc::new(streamer::build),
        validate: Some(Arc::new(|p| streamer::Params::parse(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: "stream-receiver".into(),
        description: "kernel-stamped arrivals of a UDP stream: inter-arrival median, mean, deviation, p99; forwards chunks on `out`".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec![]),
        outputs: Some(vec!["out".into()]),
        factory: Arc::new(receiver::build),
        validate: Some(Arc::new(|p| receiver::Params::parse(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: "decoder".into(),
        description: "stand-in for MPEG decoding: `rounds` passes of an IDCT-like butterfly over each chunk's 8x8 blocks".into(),
        kinds: vec![PeKind::Core, PeKind::Host],
        inputs: Some(vec!["in".into()]),
        outputs: Some(vec![]),
        factory: Arc::new(decoder::build),
        validate: Some(Arc::new(|p| decoder::Params::parse(p).map(drop))),
        interfaces: Interfaces::default(),
    });
}
