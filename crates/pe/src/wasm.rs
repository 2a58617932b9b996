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

/// Why the wasm engine is not usable here.
#[derive(Debug, thiserror::Error)]
pub enum WasmUnusable {
    #[error("this sidecore was built without the wasm engine (feature `wasm`)")]
    NotBuilt,
    #[error("wasmtime cannot {step}: {error}")]
    Engine { step: &'static str, error: String },
    #[error("the probe module returned {0}, expected 42")]
    WrongAnswer(i32),
}

/// Compiles and runs the probe module; `Err` says what failed.
#[cfg(not(feature = "wasm"))]
pub fn probe() -> Result<String, WasmUnusable> {
    let _ = MODULE;
    Err(WasmUnusable::NotBuilt)
}

/// Compiles and runs the probe module; `Err` says what failed.
#[cfg(feature = "wasm")]
pub fn probe() -> Result<String, WasmUnusable> {
    let engine = |step| {
        move |e: wasmtime::Error| WasmUnusable::Engine {
            step,
            error: e.to_string(),
        }
    };
    let wasm_engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&wasm_engine, MODULE).map_err(engine("compile a module"))?;
    let mut store = wasmtime::Store::new(&wasm_engine, ());
    let instance = wasmtime::Instance::new(&mut store, &module, &[])
        .map_err(engine("instantiate a module"))?;
    let f = instance
        .get_typed_func::<(), i32>(&mut store, "answer")
        .map_err(engine("find the probe's export"))?;
    match f
        .call(&mut store, ())
        .map_err(engine("run the probe module"))?
    {
        42 => Ok(format!(
            "wasmtime (Cranelift JIT) on {}",
            std::env::consts::ARCH
        )),
        v => Err(WasmUnusable::WrongAnswer(v)),
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
