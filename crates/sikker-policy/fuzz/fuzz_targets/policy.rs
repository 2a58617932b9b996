//! Fuzzes the policy and placement parsers: any bytes must give a policy or located
//! errors, never a panic; an accepted policy must compile with any accepted placement,
//! whose agent addresses (`agent = "IP:PORT"`, read live by the agents from etcd or
//! a file) are specific, not port 0, one per host, and only of its hosts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_sikker_policy::{Nos, parse_placement, parse_policy};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    // Split the input into a policy and a placement at the first NUL.
    let (pol, place) = s.split_once('\0').unwrap_or((s, ""));
    match parse_policy("fuzz.toml", pol) {
        Ok(p) => {
            let _ = p.sacl();
            if let Ok(pl) = parse_placement("place.toml", place, &p) {
                let mut seen = std::collections::BTreeSet::new();
                for (host, a) in &pl.agents {
                    assert!(pl.hosts.iter().any(|(h, _)| h == host));
                    assert!(!a.ip().is_unspecified() && a.port() != 0);
                    assert!(seen.insert(*a), "{a} given to two hosts");
                }
                let _ = Nos::compile(p, &pl);
            }
        }
        Err(e) => {
            for d in &e.0 {
                assert!(d.line >= 1 && d.col >= 1);
                assert!(!d.message.is_empty());
            }
        }
    }
});
