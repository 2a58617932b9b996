//! Fuzz target: any bytes a process (or anything else) writes to the agent's
//! socket decode as a request or are refused with a reason, never a panic;
//! a decoded request encodes back to bytes that decode to the same request.
//! The agent's answers decode the same way on the client's side.
//! Run: `cargo +nightly fuzz run agent_messages` from `crates/sikker-agent`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_sikker_agent::proto::{FromAgent, Request, decode, encode};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = decode::<Request>(data) {
        let again: Request = decode(&encode(&r)).expect("an encoded request decodes");
        assert_eq!(again, r);
    }
    let _ = decode::<FromAgent>(data);
});
