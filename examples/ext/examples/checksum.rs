//! Internet checksum (RFC 1071) of the input, sent as two bytes to output 0. Its loop
//! depends on the input length, so the bound is declared (and enforced by sidecore) in
//! both entries; the batch entry's own loop over the buffers is proven (n ≤ B). The
//! checksum replaces the buffer's first two bytes and is forwarded in place.
#![no_std]

use sidecore_ext_sdk::{Output, Verdict, batch_handler, bounds, emit};

bounds!("handle * PACKET_LEN_MAX/2+1", "batch * PACKET_LEN_MAX/2+1");

batch_handler!(
    2048,
    32,
    fn handle(pkt: &mut [u8]) -> Verdict {
        let mut s: u32 = 0;
        let mut i = 0;
        while i + 1 < pkt.len() {
            s = s.wrapping_add(u16::from_le_bytes([pkt[i], pkt[i + 1]]) as u32);
            i += 2;
        }
        if i < pkt.len() {
            s = s.wrapping_add(pkt[i] as u32);
        }
        s = (s & 0xffff) + (s >> 16);
        s = (s & 0xffff) + (s >> 16);
        let c = (!(s as u16)).to_le_bytes();
        if pkt.len() >= 2 {
            pkt[..2].copy_from_slice(&c);
            return Verdict::ForwardLen(Output(0), 2);
        }
        match emit(Output(0), &c) {
            Ok(()) => Verdict::Done(0),
            Err(e) => Verdict::Done(e.0),
        }
    }
);
