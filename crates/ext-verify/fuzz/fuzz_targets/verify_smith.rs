//! Arbitrary *valid* modules (wasm-smith, restricted to the features sidecore admits,
//! with the host ABI as the only imports) through the verifier and the instrumenter: no
//! panic; admitted modules (instrumented or not) stay valid.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use sidecore_ext_verify::{Calibration, Policy, module, verify};

/// A module importing the whole host ABI: wasm-smith draws its imports from it.
fn abi() -> &'static [u8] {
    static ABI: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    ABI.get_or_init(|| {
        wat::parse_str(
            r#"(module
              (import "sc" "output" (func (param i32 i32) (result i32)))
              (import "sc" "emit" (func (param i32 i32 i32) (result i32)))
              (import "sc" "state_get" (func (param i64 i32 i32) (result i32)))
              (import "sc" "state_put" (func (param i64 i32 i32) (result i32)))
              (import "sc" "state_del" (func (param i64) (result i32)))
              (import "sc" "cache_put" (func (param i32 i32 i32) (result i32)))
              (import "sc" "cache_get" (func (param i32 i32 i32) (result i32)))
              (import "sc" "shared_lookup" (func (param i32 i32) (result i32)))
              (import "sc" "shared_read" (func (param i32 i32 i32 i32) (result i32))))"#,
        )
        .expect("ABI module")
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(mut cfg) = wasm_smith::Config::arbitrary(&mut u) else {
        return;
    };
    cfg.simd_enabled = false;
    cfg.relaxed_simd_enabled = false;
    cfg.threads_enabled = false;
    cfg.exceptions_enabled = false;
    cfg.gc_enabled = false;
    cfg.tail_call_enabled = false;
    cfg.memory64_enabled = false;
    cfg.max_memories = 1;
    cfg.max_tables = 1;
    cfg.custom_page_sizes_enabled = false;
    cfg.wide_arithmetic_enabled = false;
    cfg.available_imports = Some(abi().to_vec());
    let Ok(m) = wasm_smith::Module::new(cfg, &mut u) else {
        return;
    };
    let bytes = m.to_bytes();
    let mut policy = Policy::default();
    policy.inflation = 1e9; // admit as much as possible so instrumentation is exercised
    policy.require_abi = false;
    if let Ok(a) = verify(&bytes, &policy, &Calibration::fallback()) {
        wasmparser::Validator::new_with_features(module::features())
            .validate_all(&a.module)
            .expect("admitted module is valid");
    }
});
