//! Fuzzes the rule-file parsers (the table layout and TOML) with arbitrary
//! text: every input is a rule set or located problems, never a panic; a rule
//! set that parses also compiles (or is refused for its size), is analysed,
//! renders to nftables, and its classifier agrees with the linear scan.
//! Run: `cargo +nightly fuzz run rules` from `crates/firewall`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_firewall::parse::{parse_table, parse_toml};
use sidecore_firewall::{Classifier, Packet, analyze, nft};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for rs in [parse_table("f.rules", text), parse_toml("f.toml", text)] {
        let Ok(rs) = rs else { continue };
        let _ = analyze(&rs);
        let _ = nft::render(&rs, nft::Hook::Forward);
        let Ok(c) = Classifier::compile(&rs) else { continue };
        // Packets made from the input's own bytes.
        for w in data.chunks(13).filter(|w| w.len() == 13) {
            let u = |i: usize| u32::from_be_bytes([w[i], w[i + 1], w[i + 2], w[i + 3]]);
            // Protocols without ports carry ports 0 (the `Packet` contract).
            let ported = w[0] == 6 || w[0] == 17;
            let port = |i: usize| if ported { u16::from_be_bytes([w[i], w[i + 1]]) } else { 0 };
            let p = Packet {
                proto: w[0],
                src: u(1),
                sport: port(5),
                dst: u(7),
                dport: port(11),
            };
            assert_eq!(c.decide(&p), rs.decide(&p), "{p:?}");
        }
    }
});
