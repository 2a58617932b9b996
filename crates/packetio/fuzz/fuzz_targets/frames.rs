//! Fuzzes the frame parser with whatever arrives on a wire: every input is a
//! 5-tuple or `None`, never a panic or a read past the frame; a frame built
//! from a parsed tuple parses back to the same tuple.
//! Run: `cargo +nightly fuzz run frames` from `crates/packetio`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_packetio::frame::{FrameSpec, MAX_FRAME_BYTES, build, min_bytes};
use sidecore_packetio::parse;

fuzz_target!(|data: &[u8]| {
    let Some(p) = parse(data) else { return };
    let spec = FrameSpec {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        packet: p.packet,
        frame_bytes: min_bytes(p.packet.proto),
    };
    let mut buf = vec![0u8; MAX_FRAME_BYTES];
    let n = build(&spec, 7, 0, &mut buf);
    let back = parse(&buf[..n]).expect("a built frame parses");
    assert_eq!(back.packet, p.packet);
});
