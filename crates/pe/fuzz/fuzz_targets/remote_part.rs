//! Fuzzes the parser of deploy requests that peer nodes accept on their node
//! port (untrusted bytes from the network): it must return an error, never
//! panic, and what it accepts must be internally consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_pe::node::RemotePart;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = RemotePart::parse(line) {
        // Every index the validator let through points into the part.
        for c in &p.channels {
            for &(o, port) in c.from.iter().chain(&c.to) {
                assert!(o < p.offcodes.len());
                let oc = &p.offcodes[o];
                assert!(port < oc.inputs.len().max(oc.outputs.len()));
            }
        }
    }
});
