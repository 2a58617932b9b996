//! Fuzzes Metachory's page stream (untrusted bytes from a migration's
//! source or target): the raw bytes, in arbitrary chunks, through the record
//! decoder; and the same bytes cut into payloads that get valid headers
//! (so the fuzzer reaches the image's JSON and its validation, the pages'
//! and wants' fields). Every input is read as records or refused with an
//! error, never a panic; an image that decodes is valid, and the decoder
//! stays failed after an error.
//! Run: `cargo +nightly fuzz run mx_image` from `crates/wire`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_wire::mx_image::{Record, RecordDecoder, RecordEncoder, RecordKind, page_preamble};

fn drain(d: &mut RecordDecoder) -> bool {
    loop {
        match d.next_record() {
            Ok(Some(Record::Image(i))) => assert!(i.validate().is_ok()),
            Ok(Some(_)) => {}
            Ok(None) => return true,
            Err(_) => {
                assert!(d.next_record().is_err(), "a failed decoder stays failed");
                return false;
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    let chunk = (split as usize).max(1);

    // Raw bytes after a good preamble.
    let mut d = RecordDecoder::new();
    d.feed(&page_preamble());
    for c in rest.chunks(chunk) {
        d.feed(c);
        if !drain(&mut d) {
            break;
        }
    }

    // Payloads separated by 0xff, each with a valid header; the kind is the
    // payload's first byte.
    let mut bytes = page_preamble().to_vec();
    let mut enc = RecordEncoder::default();
    for p in rest.split(|b| *b == 0xff) {
        let Some((&k, payload)) = p.split_first() else { continue };
        // Each kind's limit (an encoder refuses more: it is this side's bug).
        let (kind, limit) = match k % 8 {
            0 => (RecordKind::Hello, 16),
            1 => (RecordKind::Image, 1 << 16),
            2 => (RecordKind::Pages, 1 << 16),
            3 => (RecordKind::End, 0),
            4 => (RecordKind::Want, 12),
            5 => (RecordKind::Restored, 0),
            6 => (RecordKind::Resident, 0),
            _ => (RecordKind::Error, 1 << 16),
        };
        let payload = &payload[..payload.len().min(limit)];
        bytes.extend_from_slice(&enc.header(kind, &[payload]));
        bytes.extend_from_slice(payload);
    }
    let mut d = RecordDecoder::new();
    for c in bytes.chunks(chunk) {
        d.feed(c);
        if !drain(&mut d) {
            break;
        }
    }
});
