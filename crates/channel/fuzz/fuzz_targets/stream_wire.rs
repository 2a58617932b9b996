//! Fuzz target: bytes from a peer (hello, then length-prefixed frames, split
//! into arbitrary chunks) must parse or be rejected, never panic, and every
//! frame returned must lie within what was fed; after the end-of-stream mark
//! nothing more is returned.
//! Run: `cargo +nightly fuzz run stream_wire` from `crates/channel`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_channel::stream::{FrameDecoder, parse_hello};

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let _ = parse_hello(rest);
    let mut d = FrameDecoder::new(4096);
    let mut fed = 0usize;
    let mut taken = 0usize;
    for chunk in rest.chunks((split as usize).max(1)) {
        d.feed(chunk);
        fed += chunk.len();
        loop {
            match d.next_frame() {
                Ok(Some(f)) => {
                    taken += 4 + f.len();
                    assert!(f.len() <= 4096);
                }
                // The end-of-stream mark: nothing more is read.
                Ok(None) if d.ended() => {
                    assert_eq!(d.buffered(), 0);
                    return;
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(taken <= fed);
        assert_eq!(d.buffered(), fed - taken);
    }
});
