//! Fuzzes the deploy request a peer accepts (untrusted JSON from the network):
//! decoding and validation return an error, never panic, and every part they
//! accept is internally consistent.
//! Run: `cargo +nightly fuzz run deploy_request` from `crates/wire`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_wire::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(Message::Deploy(p)) = Message::decode(data) else { return };
    if p.validate().is_ok() {
        // Every index the validator let through points into the part.
        for c in &p.channels {
            if let Some((o, port)) = c.from {
                assert!(port < p.offcodes[o].outputs.len());
            }
            for &(o, port) in &c.to {
                assert!(port < p.offcodes[o].inputs.len());
            }
        }
    }
});
