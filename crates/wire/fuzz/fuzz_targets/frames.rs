//! Fuzzes the node protocol's frame decoder and both state machines with bytes
//! from the network, split into arbitrary chunks: every input is either read
//! as checked messages or rejected with an error naming the peer, never a
//! panic, and the decoder never holds more than it was fed.
//! Run: `cargo +nightly fuzz run frames` from `crates/wire`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_wire::frame::{FrameDecoder, HEADER_BYTES, MAX_FRAME_BYTES, PREAMBLE_BYTES};
use sidecore_wire::{Hello, NodeInfo, Origin, Peer};

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let chunk = (split as usize).max(1);

    // The bare decoder: accounting of what it was fed.
    let mut d = FrameDecoder::new();
    let (mut fed, mut taken) = (0usize, 0usize);
    'feed: for c in rest.chunks(chunk) {
        d.feed(c);
        fed += c.len();
        loop {
            match d.next_frame() {
                Ok(Some((_, p))) => {
                    assert!(p.len() <= MAX_FRAME_BYTES);
                    taken += HEADER_BYTES + p.len();
                }
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
        let preamble = if d.preamble_seen() { PREAMBLE_BYTES } else { 0 };
        assert_eq!(d.buffered() + taken + preamble, fed);
    }
    let _ = d.finish();

    // Both ends of a conversation.
    let hello = Hello { origin: "fuzz".into(), software: "0".into() };
    let info = NodeInfo { name: "fuzz".into(), software: "0".into(), cpus: 1, memory_bytes: 1 };
    let mut o = Origin::new("node fuzz", hello);
    let mut p = Peer::new("origin fuzz", info);
    for c in rest.chunks(chunk) {
        o.handle_input(c);
        p.handle_input(c);
        while let Ok(Some(_)) = o.poll() {}
        while let Ok(Some(_)) = p.poll() {}
    }
    if let Err(e) = o.handle_eof() {
        assert_eq!(e.peer, "node fuzz");
    }
    if let Err(e) = p.handle_eof() {
        assert_eq!(e.peer, "origin fuzz");
    }
});
