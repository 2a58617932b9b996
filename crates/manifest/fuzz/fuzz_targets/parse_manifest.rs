//! Fuzz target: manifest text of any bytes must load or be rejected with
//! diagnostics, never panic. Run: `cargo +nightly fuzz run parse_manifest`
//! from `crates/manifest`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = sidecore_manifest::parse_str("fuzz.toml", text) {
            assert!(!e.diagnostics.is_empty());
            let _ = e.render(false);
        }
    }
});
