//! Fuzz target: a call request header of any bytes parses or is rejected with
//! a reason, never panics; decoding its arguments never panics either.
//! Run: `cargo +nightly fuzz run call_request` from `crates/channel`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_channel::call::parse_request;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = parse_request(data) {
        assert!(req.args.len() + 16 == data.len());
        let _ = req.decode::<(u32, String, Vec<u8>)>();
    }
});
