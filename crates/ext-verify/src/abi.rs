//! sidecore's host ABI for Wasm offcodes: the only imports a module may have (the
//! analogue of RBCyclone's `RBClick_NS`/`CYC_NS` namespaces, thesis §4.2.2), the exports
//! the runtime looks for, and the imports sidecore itself injects when it instruments.
//!
//! Every import lives in module `sc`. Pointers are offsets into the module's exported
//! linear memory `memory`; a negative return value is an error code.
//!
//! | import | signature | region | meaning |
//! |---|---|---|---|
//! | `sc.output(name_ptr, name_len) -> i32` | (i32,i32)->i32 | — | id of the named output, or -1 |
//! | `sc.emit(output, ptr, len) -> i32` | (i32,i32,i32)->i32 | 'A→out | send `len` bytes to an output; 0, or -1 bad output, -2 too long, -3 output full |
//! | `sc.state_get(key, dst, cap) -> i32` | (i64,i32,i32)->i32 | 'C | copy the value under `key` (≤ cap bytes); its length, or -1 absent |
//! | `sc.state_put(key, src, len) -> i32` | (i64,i32,i32)->i32 | 'C | store a value; 0, or -2 over the region cap |
//! | `sc.state_del(key) -> i32` | (i64)->i32 | 'C | delete; 0, or -1 absent |
//! | `sc.cache_put(slot, src, len) -> i32` | (i32,i32,i32)->i32 | 'B | keep a packet in the cache; 0, -1 bad slot, -2 too long |
//! | `sc.cache_get(slot, dst, cap) -> i32` | (i32,i32,i32)->i32 | 'B | copy a cached packet out; its length, or -1 empty/bad slot |
//! | `sc.shared_lookup(name_ptr, name_len) -> i32` | (i32,i32)->i32 | 'D | id of a read-only shared area, or -1 |
//! | `sc.shared_read(area, off, dst, len) -> i32` | (i32,i32,i32,i32)->i32 | 'D | copy bytes out of a shared area; bytes copied, or -1 |
//!
//! Exports: `memory`; `sc_input_ptr() -> i32` and `sc_input_cap() -> i32` (where the host
//! writes each input buffer: the per-packet region 'A); optional `sc_init()`; and one or
//! more handlers `handle(len: i32) -> i32` or `handle_<input>(len: i32) -> i32`, called
//! once per input buffer. A handler's return value is its status (negative = error).

use wasmparser::ValType;

/// The import module name of the host ABI.
pub const MODULE: &str = "sc";
/// The import module sidecore's own instrumentation uses (never allowed in user modules).
pub const INJECT_MODULE: &str = "sidecore";

/// One host function of the ABI.
#[derive(Debug, Clone, Copy)]
pub struct HostFn {
    pub name: &'static str,
    pub params: &'static [ValType],
    pub results: &'static [ValType],
    /// Which parameter is a byte count (its cost grows with it).
    pub len_arg: Option<u32>,
}

const I32: ValType = ValType::I32;
const I64: ValType = ValType::I64;

/// The whole host ABI.
pub const HOST_ABI: &[HostFn] = &[
    HostFn {
        name: "output",
        params: &[I32, I32],
        results: &[I32],
        len_arg: Some(1),
    },
    HostFn {
        name: "emit",
        params: &[I32, I32, I32],
        results: &[I32],
        len_arg: Some(2),
    },
    HostFn {
        name: "state_get",
        params: &[I64, I32, I32],
        results: &[I32],
        len_arg: Some(2),
    },
    HostFn {
        name: "state_put",
        params: &[I64, I32, I32],
        results: &[I32],
        len_arg: Some(2),
    },
    HostFn {
        name: "state_del",
        params: &[I64],
        results: &[I32],
        len_arg: None,
    },
    HostFn {
        name: "cache_put",
        params: &[I32, I32, I32],
        results: &[I32],
        len_arg: Some(2),
    },
    HostFn {
        name: "cache_get",
        params: &[I32, I32, I32],
        results: &[I32],
        len_arg: Some(2),
    },
    HostFn {
        name: "shared_lookup",
        params: &[I32, I32],
        results: &[I32],
        len_arg: Some(1),
    },
    HostFn {
        name: "shared_read",
        params: &[I32, I32, I32, I32],
        results: &[I32],
        len_arg: Some(3),
    },
];

/// Looks up an ABI function by name.
pub fn host_fn(name: &str) -> Option<&'static HostFn> {
    HOST_ABI.iter().find(|h| h.name == name)
}

/// Names of all ABI functions, for error messages.
pub fn allowed_list() -> String {
    HOST_ABI
        .iter()
        .map(|h| format!("{MODULE}.{}", h.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Injected: `sidecore.poll()`, a placed poll point (thesis Fig. 3.4).
pub const INJECT_POLL: &str = "poll";
/// Injected: `sidecore.bound_exceeded(loop_id)`, called when a declared loop bound runs out.
pub const INJECT_BOUND: &str = "bound_exceeded";

/// Whether an export is a handler (entry point called per input buffer).
pub fn is_handler(name: &str) -> bool {
    name == "handle" || name.starts_with("handle_")
}
