//! The WebAssembly engine as a PE: compiles and runs a tiny module with
//! wasmtime to prove the sandbox works on this machine (JIT memory can be
//! forbidden, for example by a W^X policy).

/// A module exporting `answer() -> i32` returning 42, in binary form (so the
/// probe needs no text parser).
const MODULE: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
    0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f, // type: () -> i32
    0x03, 0x02, 0x01, 0x00, // func 0 has type 0
    0x07, 0x0a, 0x01, 0x06, b'a', b'n', b's', b'w', b'e', b'r', 0x00, 0x00, // export "answer"
    0x0a, 0x06, 0x01, 0x04, 0x00, 0x41, 0x2a, 0x0b, // code: i32.const 42; end
];

/// Compiles and runs the probe module; `Err` says what failed.
#[cfg(not(feature = "wasm"))]
pub fn probe() -> Result<String, String> {
    let _ = MODULE;
    Err("this sidecore was built without the wasm engine (feature `wasm`)".into())
}

/// Compiles and runs the probe module; `Err` says what failed.
#[cfg(feature = "wasm")]
pub fn probe() -> Result<String, String> {
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, MODULE)
        .map_err(|e| format!("wasmtime cannot compile a module: {e}"))?;
    let mut store = wasmtime::Store::new(&engine, ());
    let instance = wasmtime::Instance::new(&mut store, &module, &[])
        .map_err(|e| format!("wasmtime cannot instantiate: {e}"))?;
    let f = instance
        .get_typed_func::<(), i32>(&mut store, "answer")
        .map_err(|e| format!("probe export missing: {e}"))?;
    match f.call(&mut store, ()) {
        Ok(42) => Ok(format!(
            "wasmtime (Cranelift JIT) on {}",
            std::env::consts::ARCH
        )),
        Ok(v) => Err(format!("probe module returned {v}, expected 42")),
        Err(e) => Err(format!("probe module trapped: {e}")),
    }
}

#[cfg(all(test, feature = "wasm"))]
mod tests {
    #[test]
    fn wasm_engine_runs_here() {
        let d = super::probe().unwrap();
        assert!(d.contains("wasmtime"));
    }
}
