//! Fuzzes FileWall's wire decoders: TCP record reassembly, then each record as an RPC
//! call and as a reply to every NFSv3, MOUNT and portmapper procedure. Decoding must
//! never panic, and whatever is accepted must re-encode to exactly the input bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_filewall::message::{Procedure, decode_call, decode_reply};
use sidecore_filewall::mount::MountProc;
use sidecore_filewall::nfs3::Nfs3Proc;
use sidecore_filewall::portmap::PmapProc;
use sidecore_filewall::record::RecordReader;

fn check(message: &[u8]) {
    if let Ok(call) = decode_call(message) {
        assert_eq!(call.to_bytes(), message, "a call did not re-encode identically");
    } else if let Err(e) = decode_call(message) {
        let _ = e.to_string();
        let _ = e.reply();
    }
    let procedures = Nfs3Proc::ALL
        .iter()
        .map(|p| Procedure::Nfs3(*p))
        .chain(MountProc::ALL.iter().map(|p| Procedure::Mount3(*p)))
        .chain(PmapProc::ALL.iter().map(|p| Procedure::Portmap2(*p)));
    for p in procedures {
        match decode_reply(message, p) {
            Ok(reply) => assert_eq!(reply.to_bytes(), message, "a reply did not re-encode identically"),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        // One UDP datagram.
        check(rest);
    } else {
        // A TCP stream, fed in two pieces.
        let mut reader = RecordReader::new(64 * 1024);
        let split = usize::from(mode >> 1).min(rest.len());
        reader.push(&rest[..split]);
        while let Ok(Some(record)) = reader.next_record() {
            check(&record);
        }
        reader.push(&rest[split..]);
        while let Ok(Some(record)) = reader.next_record() {
            check(&record);
        }
    }
});
