//! sidecore's host ABI for Wasm offcodes, defined once for the host
//! (`sidecore-ext`), the verifier (`sidecore-ext-verify`) and the SDK
//! (`crates/ext-sdk`): the only imports a module may have (the
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
//!
//! ## Batches (optional)
//!
//! Fixed per-call costs (the host→guest call, the accounting reads, `sc.emit`) are
//! amortised the way packet frameworks do it (DPDK bursts, Click batching, XDP verdicts):
//! one guest call handles up to `B` buffers. A module opts in by exporting
//!
//! * `sc_batch_max() -> i32`: `B`, 1 ≤ B ≤ [`BATCH_LIMIT`]. Its body must be a single
//!   `i32.const B` (the verifier reads `B` from the bytecode; it is also the deployment
//!   symbol `BATCH_MAX` for declared bounds);
//! * `sc_batch_ptr() -> i32`: the batch region (layout below);
//! * one or more batch entries `batch(n: i32) -> i32` or `batch_<input>(n: i32) -> i32`,
//!   beside (not instead of) the per-buffer handler of the same input.
//!
//! The host calls a batch entry with `1 ≤ n ≤ B` buffers (never 0, never more than B).
//! The batch region at `sc_batch_ptr()` (little-endian, 4-byte words):
//!
//! | bytes | field | written by |
//! |---|---|---|
//! | 0..4 | `cur`: index of the buffer being handled, for `sc.emit` attribution | guest |
//! | 4..16 | reserved | — |
//! | 16 + 16·i .. | descriptor `i` (`i < B`): `off`, `len`, `status`, `fwd` (4 × u32/i32) | see below |
//! | 16 + 16·B .. | `B` slots of `sc_input_cap()` bytes; buffer `i` is at `off` | host |
//!
//! Before the call the host writes, for each `i < n`, `off` (absolute address of the
//! buffer in linear memory: always slot `i`, `sc_batch_ptr() + 16 + 16·B +
//! i·sc_input_cap()`, so a guest may compute it instead of trusting the field),
//! `len` (its length, ≤ `sc_input_cap()`), `status = 0` and `fwd = -1`, and `cur = 0`.
//! The guest handles buffers `0..n` in order; for each it sets `cur = i` first (so that
//! its `sc.emit` calls are attributed to buffer `i`), then writes
//!
//! * `status`: the per-buffer status (as a handler's return value; negative = error);
//! * `fwd`: an **in-place verdict** (like XDP_TX/REDIRECT): `k ≥ 0` forwards the buffer
//!   as it now is in its slot, `len` bytes (the guest may rewrite `len`, up to the slot
//!   size), to output `k` — no host call; `-1` forwards nothing.
//!
//! `sc.emit` still works inside a batch (zero or more messages per buffer). After the
//! call the host delivers, for each buffer in order, first what was emitted while `cur`
//! was `i` (in emission order), then its in-place forward. A verdict the host cannot
//! honour (unknown output, `len` over the slot or the output cap) drops that forward and
//! sets the buffer's status to [`STATUS_BAD_VERDICT`]. The batch entry's return value is
//! the batch's own status (negative = error).
//!
//! Admission treats a batch entry like any other (longest path, loop body × bound), but
//! its loop over the buffers must be bounded by `B`: the verifier proves it when the loop
//! counts up from a constant and exits once the counter reaches the entry's parameter
//! `n` (never written in the function; the host guarantees `1 ≤ n ≤ B`), or it can be
//! declared (`batch 0 BATCH_MAX`) and is then enforced. Its budget is the acceptable
//! limit × `B` (× the inflation factor): `B` inputs cannot arrive in less than `B`
//! minimum inter-arrival times. At run time a batch of `n` is one accounted invocation
//! (two cycle-counter reads) with limit `n` × the acceptable limit; a violating batch is
//! one violation in the window, and unloading happens between batches.

#![no_std]

/// The import module name of the host ABI.
pub const MODULE: &str = "sc";
/// The import module sidecore's own instrumentation uses (never allowed in user modules).
pub const INJECT_MODULE: &str = "sidecore";

/// A Wasm value type of the ABI's signatures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValType {
    I32,
    I64,
}

impl core::fmt::Display for ValType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            ValType::I32 => "i32",
            ValType::I64 => "i64",
        })
    }
}

/// One host function of the ABI.
#[derive(Debug, Clone, Copy)]
pub struct HostFn {
    pub name: &'static str,
    pub params: &'static [ValType],
    pub results: &'static [ValType],
    /// Which parameter is a byte count (its cost grows with it).
    pub len_arg: Option<u32>,
}

impl HostFn {
    /// Whether this is function `name` with exactly these parameter and result
    /// types; usable in const context, so a client (the SDK) that must spell its
    /// imports out can check them against this definition at compile time.
    pub const fn is(&self, name: &str, params: &[ValType], results: &[ValType]) -> bool {
        same(self.name, name)
            && same_types(self.params, params)
            && same_types(self.results, results)
    }
}

const fn same_types(a: &[ValType], b: &[ValType]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] as u8 != b[i] as u8 {
            return false;
        }
        i += 1;
    }
    true
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

/// Injected: `sidecore.poll()`, a placed poll point (thesis Fig. 3.4).
pub const INJECT_POLL: &str = "poll";
/// Injected: `sidecore.bound_exceeded(loop_id)`, called when a declared loop bound runs out.
pub const INJECT_BOUND: &str = "bound_exceeded";

/// Export: the exported linear memory.
pub const EXPORT_MEMORY: &str = "memory";
/// Export: where the host writes each input buffer.
pub const EXPORT_INPUT_PTR: &str = "sc_input_ptr";
/// Export: the input buffer's size in bytes.
pub const EXPORT_INPUT_CAP: &str = "sc_input_cap";
/// Optional export: run once after instantiation.
pub const EXPORT_INIT: &str = "sc_init";
/// The per-buffer handler (`handle`, or `handle_<input>` for one input).
pub const HANDLER: &str = "handle";
/// The batch entry (`batch`, or `batch_<input>` for one input).
pub const BATCH_ENTRY: &str = "batch";

/// Whether `name` is `base` or starts with `base_`.
const fn named(name: &str, base: &str) -> bool {
    let (n, b) = (name.as_bytes(), base.as_bytes());
    if n.len() < b.len() {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if n[i] != b[i] {
            return false;
        }
        i += 1;
    }
    n.len() == b.len() || n[b.len()] == b'_'
}

/// Whether an export is a handler (entry point called per input buffer).
pub const fn is_handler(name: &str) -> bool {
    named(name, HANDLER)
}

/// Whether an export is a batch entry (called once per batch of up to `B` buffers).
pub const fn is_batch(name: &str) -> bool {
    named(name, BATCH_ENTRY)
}

/// Whether two strings are equal, at compile time (for checks such as "the SDK's
/// import module is [`MODULE`]", where an attribute needs a literal).
pub const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Export giving the batch size `B` (a constant function).
pub const EXPORT_BATCH_MAX: &str = "sc_batch_max";
/// Export giving the address of the batch region.
pub const EXPORT_BATCH_PTR: &str = "sc_batch_ptr";
/// Largest `B` sidecore accepts.
pub const BATCH_LIMIT: u32 = 256;
/// The deployment symbol holding the module's `B`, for declared bounds.
pub const BATCH_SYMBOL: &str = "BATCH_MAX";
/// Size of the batch region's header (`cur` + reserved), bytes.
pub const BATCH_HEADER: usize = 16;
/// Size of one batch descriptor (`off`, `len`, `status`, `fwd`), bytes.
pub const BATCH_DESC: usize = 16;
/// Status the host gives a buffer whose in-place verdict it could not honour.
pub const STATUS_BAD_VERDICT: i32 = -1000;

/// Bytes of the batch region for `b` buffers of `cap` bytes each.
pub const fn batch_region_bytes(b: usize, cap: usize) -> usize {
    BATCH_HEADER + b * BATCH_DESC + b * cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names() {
        assert!(is_handler("handle") && is_handler("handle_in") && !is_handler("handler"));
        assert!(is_handler("handle_") && !is_handler("hand"));
        assert!(is_batch("batch") && is_batch("batch_in") && !is_batch("batches"));
        assert!(same(MODULE, "sc") && !same(MODULE, "sd"));
        assert_eq!(batch_region_bytes(2, 64), 16 + 32 + 128);
        assert!(host_fn("emit").is_some_and(|h| h.len_arg == Some(2)));
        assert!(host_fn("exit").is_none());
        assert!(HOST_ABI[1].is("emit", &[I32, I32, I32], &[I32]));
        assert!(!HOST_ABI[1].is("emit", &[I32, I32], &[I32]));
    }
}
