//! Fuzzes the total order's datagram decoder and the state machines behind
//! it with bytes from the network: every input decodes to a datagram that
//! encodes back to the same bytes, or is refused; fed to a node of each
//! kind it is counted or applied, never a panic.
//! Run: `cargo +nightly fuzz run datagrams` from `crates/total-order`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_total_order::{Datagram, RbConfig, SeqNode, ToNode};

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = Datagram::decode(data) {
        assert_eq!(d.encode(), data, "decode then encode gives the input back");
    }
    let mut to = ToNode::new(1, 3, 8, RbConfig::default()).expect("a valid group");
    let mut seq = SeqNode::new(0, 3, 8, RbConfig::default()).expect("a valid group");
    for (i, chunk) in data.split(|&b| b == 0xff).enumerate() {
        let now = i as u64 * 1_000_000;
        to.on_datagram(chunk, now);
        to.tick(now);
        seq.on_datagram(chunk, now);
        seq.tick(now);
        while to.poll_transmit().is_some() {}
        while seq.poll_transmit().is_some() {}
        while to.to_receive().is_some() {}
        while seq.to_receive().is_some() {}
    }
});
