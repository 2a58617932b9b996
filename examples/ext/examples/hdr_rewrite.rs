//! NAT-style IPv4 header rewriter: destination → 10.0.0.1, TTL − 1, header checksum
//! patched incrementally (RFC 1624), frame sent to output 0. No loops. Exports the
//! batch entry too: in a batch the rewritten frame is forwarded in place (no host call).
#![no_std]

use sidecore_ext_sdk::{Output, Verdict, batch_handler};

#[inline(always)]
fn be16(b: &[u8], p: usize) -> u32 {
    ((b[p] as u32) << 8) | b[p + 1] as u32
}

#[inline(always)]
fn add(a: u32, b: u32) -> u32 {
    let s = a + b;
    (s + (s >> 16)) & 0xffff
}

batch_handler!(
    2048,
    32,
    fn handle(pkt: &mut [u8]) -> Verdict {
        if pkt.len() < 34 || be16(pkt, 12) != 0x0800 {
            return Verdict::Done(-1);
        }
        let ip = 14;
        if pkt[ip + 8] <= 1 {
            return Verdict::Done(-2);
        }
        let old = be16(pkt, ip + 8);
        pkt[ip + 8] -= 1;
        let new = be16(pkt, ip + 8);
        let mut c = be16(pkt, ip + 10) ^ 0xffff;
        c = add(c, old ^ 0xffff);
        c = add(c, new);
        c = add(c, be16(pkt, ip + 16) ^ 0xffff);
        c = add(c, be16(pkt, ip + 18) ^ 0xffff);
        c = add(c, 0x0a00);
        c = add(c, 0x0001);
        pkt[ip + 16] = 10;
        pkt[ip + 17] = 0;
        pkt[ip + 18] = 0;
        pkt[ip + 19] = 1;
        c ^= 0xffff;
        pkt[ip + 10] = (c >> 8) as u8;
        pkt[ip + 11] = c as u8;
        Verdict::Forward(Output(0))
    }
);
