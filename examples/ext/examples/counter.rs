//! Counts packets and bytes in per-domain state ('C) and forwards each packet (in a
//! batch: in place, so two host calls per packet instead of three).
#![no_std]

use sidecore_ext_sdk::{Output, Verdict, batch_handler, state};

batch_handler!(
    2048,
    32,
    fn handle(pkt: &mut [u8]) -> Verdict {
        let mut v = [0u8; 16];
        if state::get(1, &mut v) != Some(16) {
            v = [0u8; 16];
        }
        let pkts = u64::from_le_bytes(v[..8].try_into().unwrap()) + 1;
        let bytes = u64::from_le_bytes(v[8..].try_into().unwrap()) + pkt.len() as u64;
        v[..8].copy_from_slice(&pkts.to_le_bytes());
        v[8..].copy_from_slice(&bytes.to_le_bytes());
        let _ = state::put(1, &v);
        Verdict::Forward(Output(0))
    }
);
