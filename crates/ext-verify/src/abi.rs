//! The host ABI as the verifier uses it: everything from `sidecore-ext-abi`
//! (the one definition; its documentation describes the ABI), plus the
//! conversions and messages the verifier needs.

pub use sidecore_ext_abi::*;

/// An ABI value type as wasmparser spells it.
pub fn val_type(v: ValType) -> wasmparser::ValType {
    match v {
        ValType::I32 => wasmparser::ValType::I32,
        ValType::I64 => wasmparser::ValType::I64,
    }
}

/// Whether a function type has exactly this ABI signature.
pub fn same_signature(
    params: &[wasmparser::ValType],
    results: &[wasmparser::ValType],
    h: &HostFn,
) -> bool {
    params
        .iter()
        .copied()
        .eq(h.params.iter().copied().map(val_type))
        && results
            .iter()
            .copied()
            .eq(h.results.iter().copied().map(val_type))
}

/// Names of all ABI functions, for error messages.
pub fn allowed_list() -> String {
    HOST_ABI
        .iter()
        .map(|h| format!("{MODULE}.{}", h.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The batch entry for input `input` (`batch_<input>`), falling back to `batch`.
pub fn batch_name(input: &str) -> String {
    format!("{BATCH_ENTRY}_{input}")
}
