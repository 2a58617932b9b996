//! Fuzzes Metachory's messages on a node connection (untrusted bytes from a
//! client or a server): the bytes are framed as the payloads after a hello
//! and a valid `mx-open`, and fed to the peer's session, which must return
//! errors, never panic; every `mx-open` that validates has clean paths.
//! Run: `cargo +nightly fuzz run mx_session` from `crates/wire`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_wire::frame::{FrameEncoder, preamble};
use sidecore_wire::mx_msg::{MxOpen, clean_absolute};
use sidecore_wire::{Hello, Message, NodeInfo, Peer};

fuzz_target!(|data: &[u8]| {
    if let Ok(Message::MxOpen(o)) = Message::decode(data)
        && o.validate().is_ok()
    {
        assert!(clean_absolute(&o.cwd));
        assert!(o.project.iter().all(|p| clean_absolute(p)));
    }
    let info = NodeInfo {
        name: "b".into(),
        software: "0".into(),
        cpus: 1,
        memory_bytes: 1,
    };
    let mut p = Peer::new("fuzz", info);
    let mut bytes = preamble().to_vec();
    let mut enc = FrameEncoder::default();
    let hello = Message::Hello(Hello {
        origin: "f".into(),
        software: "0".into(),
    });
    enc.encode(&hello.encode(), &mut bytes);
    let open = Message::MxOpen(MxOpen {
        session: 1,
        client: 1,
        server: 2,
        argv: vec!["true".into()],
        env: vec![],
        cwd: "/".into(),
        project: vec!["/".into()],
        tty: None,
        userns: false,
        ptrace: false,
        route: vec![],
        resume: None,
        cpu: None,
    });
    enc.encode(&open.encode(), &mut bytes);
    for chunk in data.split(|b| *b == 0xff) {
        enc.encode(chunk, &mut bytes);
    }
    p.handle_input(&bytes);
    while let Ok(Some(_)) = p.poll() {}
});
