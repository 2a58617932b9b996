//! Fuzz target: a call request header of any bytes parses or is rejected with
//! a reason, never panics; decoding its arguments never panics either. The
//! same bytes as a reply (the reply channel of a call binding) parse or are
//! rejected, and a parsed reply writes back to the same bytes.
//! Run: `cargo +nightly fuzz run call_request` from `crates/channel`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_channel::call::{parse_reply, parse_request, write_reply};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = parse_request(data) {
        assert!(req.args.len() + 16 == data.len());
        let _ = req.decode::<(u32, String, Vec<u8>)>();
    }
    if let Ok(r) = parse_reply(data) {
        let mut out = vec![0u8; data.len()];
        let n = write_reply(&mut out, &r).expect("a parsed reply fits its own size");
        assert_eq!(n, data.len());
        // Reserved bytes are written as zero; everything else comes back.
        assert_eq!(&out[..12], &data[..12]);
        assert_eq!(&out[16..], &data[16..]);
    }
});
