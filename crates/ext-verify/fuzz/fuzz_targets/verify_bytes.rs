//! Arbitrary bytes through the verifier: it must never panic, and anything it admits
//! must be valid Wasm.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_ext_verify::{Calibration, Policy, module, verify};

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = verify(data, &Policy::default(), &Calibration::fallback()) {
        wasmparser::Validator::new_with_features(module::features())
            .validate_all(&a.module)
            .expect("admitted module is valid");
    }
});
