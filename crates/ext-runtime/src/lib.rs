//! The dynamic side of sidecore's hybrid resource control for untrusted Wasm offcodes:
//! admitted modules run under wasmtime with cheap per-invocation accounting, poll points
//! only where the static bound exceeds the acceptable limit, a violation policy that
//! unloads a consistently greedy offcode at its next idle moment (never mid-invocation),
//! and the four capped memory regions of RBClick (thesis §4.2.4). Also the machine
//! calibration (`sidecore calibrate` measures it) and the files an extension comes with.

pub mod calibrate;
pub mod ext;
pub mod files;
pub mod host;
pub mod offcode;
pub mod policy;
pub mod preempt;
pub mod tsc;

pub use ext::{
    BadVerdict, BatchItem, EngineError, ExecMode, ExtConfig, ExtEngine, InvokeError, LoadError,
    MemoryWriteError, Outcome, WasmExtension,
};
pub use host::{BoundExceeded, SharedAreas};
pub use policy::{BadPolicy, Tracker, UnloadReason, ViolationPolicy};
pub use sidecore_ext_verify as verify;
