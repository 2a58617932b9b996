//! Example sidecore Wasm offcodes; each file in `examples/` is one module.
//! Build all of them with:
//! `cargo build --manifest-path examples/ext/Cargo.toml --target wasm32-unknown-unknown --release --examples`
#![no_std]
