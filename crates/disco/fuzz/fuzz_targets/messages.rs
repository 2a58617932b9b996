//! DisCo's decoder and engine on untrusted bytes: each input is split into
//! messages (one per line); each that decodes is handed to a three-endpoint
//! engine that knows two objects. Neither may panic: a malformed or
//! out-of-place message is an error, and the engine's state stays usable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_disco::{Access, Endpoint, Engine, Msg, ObjectId};

fuzz_target!(|data: &[u8]| {
    let all = [Endpoint(1), Endpoint(2), Endpoint(3)];
    let mut e = Engine::new(Endpoint(2));
    e.create(ObjectId(1 << 32), Endpoint(1), &all, vec![1]);
    e.create(ObjectId(2 << 32), Endpoint(2), &all, vec![2]);
    let _ = e.access(ObjectId(1 << 32), Access::Read);
    for line in data.split(|b| *b == b'\n') {
        if let Ok(m) = Msg::decode(line) {
            let from = Endpoint(u32::from(line.len() as u8 % 4));
            let _ = e.handle(from, m);
            let _ = e.take_output();
        }
    }
    let _ = e.access(ObjectId(2 << 32), Access::Write);
});
