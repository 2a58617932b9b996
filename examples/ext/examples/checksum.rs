//! Internet checksum (RFC 1071) of the input, sent as two bytes to output 0. Its loop
//! depends on the input length, so the bound is declared (and enforced by sidecore).
#![no_std]

use sidecore_ext_sdk::{Output, bounds, emit, handler};

bounds!("handle * PACKET_LEN_MAX/2+1");

handler!(
    2048,
    fn handle(pkt: &mut [u8]) -> i32 {
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
        match emit(Output(0), &c) {
            Ok(()) => 0,
            Err(e) => e.0,
        }
    }
);
