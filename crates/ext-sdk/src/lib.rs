//! SDK for sidecore Wasm offcodes written in Rust (`#![no_std]`, wasm32-unknown-unknown).
//!
//! An offcode is a packet/record handler: sidecore writes each input buffer into the
//! module's input region ('A) and calls the handler; the handler may read and rewrite the
//! buffer, keep per-domain state ('C), cache packets ('B), read shared tables ('D), and
//! send zero or more buffers to named outputs. The host ABI is defined once, in
//! `sidecore-ext-abi` (crates/ext-abi), re-exported here as [`abi`]; the imports
//! and exports this SDK spells out are checked against it when it compiles.
//!
//! ```ignore
//! #![no_std]
//! use sidecore_ext_sdk::{handler, emit, Output};
//! handler!(2048, fn handle(pkt: &mut [u8]) -> i32 {
//!     pkt[0] ^= 1;
//!     emit(Output(0), pkt).map(|_| 0).unwrap_or(-1)
//! });
//! ```
//!
//! Batches: `batch_handler!` gives the same handler a batch entry as well (the host
//! hands it up to `B` buffers per call, amortising the call, the accounting and the
//! `emit` host call), and the handler returns a [`Verdict`]: `Forward(out)` sends the
//! rewritten buffer on in place, with no host call (like XDP_TX/REDIRECT).
//!
//! ```ignore
//! #![no_std]
//! use sidecore_ext_sdk::{batch_handler, Output, Verdict};
//! batch_handler!(2048, 32, fn handle(pkt: &mut [u8]) -> Verdict {
//!     pkt[0] ^= 1;
//!     Verdict::Forward(Output(0))
//! });
//! ```
//!
//! Loops whose bound the verifier cannot prove from the bytecode need a declared bound:
//! `bounds!("handle * PACKET_LEN_MAX")` (see `sidecore ext check` for the loop ordinals).
//! A declared bound is enforced: running past it traps and the offcode is unloaded.
#![no_std]

/// The host ABI, from its one definition.
pub use sidecore_ext_abi as abi;

// Attributes and exported function names need literals, so the SDK spells
// them out; these compile-time checks keep every one equal to the ABI's
// definition (the import module, each host function's signature, the export
// names the macros define, and the batch region's layout).
const _: () = {
    use abi::ValType::{I32, I64};
    let h = abi::HOST_ABI;
    assert!(abi::same(abi::MODULE, "sc"));
    assert!(h.len() == 9);
    assert!(h[0].is("output", &[I32, I32], &[I32]));
    assert!(h[1].is("emit", &[I32, I32, I32], &[I32]));
    assert!(h[2].is("state_get", &[I64, I32, I32], &[I32]));
    assert!(h[3].is("state_put", &[I64, I32, I32], &[I32]));
    assert!(h[4].is("state_del", &[I64], &[I32]));
    assert!(h[5].is("cache_put", &[I32, I32, I32], &[I32]));
    assert!(h[6].is("cache_get", &[I32, I32, I32], &[I32]));
    assert!(h[7].is("shared_lookup", &[I32, I32], &[I32]));
    assert!(h[8].is("shared_read", &[I32, I32, I32, I32], &[I32]));
    assert!(abi::same(abi::EXPORT_INPUT_PTR, "sc_input_ptr"));
    assert!(abi::same(abi::EXPORT_INPUT_CAP, "sc_input_cap"));
    assert!(abi::same(abi::EXPORT_BATCH_MAX, "sc_batch_max"));
    assert!(abi::same(abi::EXPORT_BATCH_PTR, "sc_batch_ptr"));
    assert!(abi::same(abi::HANDLER, "handle"));
    assert!(abi::same(abi::BATCH_ENTRY, "batch"));
    assert!(core::mem::offset_of!(BatchRegion<1, 16>, desc) == abi::BATCH_HEADER);
    assert!(core::mem::size_of::<[u32; 4]>() == abi::BATCH_DESC);
};

/// Raw host imports (module `sc`).
pub mod sys {
    #[link(wasm_import_module = "sc")]
    unsafe extern "C" {
        pub fn output(name_ptr: *const u8, name_len: i32) -> i32;
        pub fn emit(output: i32, ptr: *const u8, len: i32) -> i32;
        pub fn state_get(key: i64, dst: *mut u8, cap: i32) -> i32;
        pub fn state_put(key: i64, src: *const u8, len: i32) -> i32;
        pub fn state_del(key: i64) -> i32;
        pub fn cache_put(slot: i32, src: *const u8, len: i32) -> i32;
        pub fn cache_get(slot: i32, dst: *mut u8, cap: i32) -> i32;
        pub fn shared_lookup(name_ptr: *const u8, name_len: i32) -> i32;
        pub fn shared_read(area: i32, off: i32, dst: *mut u8, len: i32) -> i32;
    }
}

/// A named output, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Output(pub i32);

/// An error code returned by the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub i32);

/// Resolves an output name (call from `init`).
pub fn output(name: &str) -> Option<Output> {
    // SAFETY: the pointer and length describe `name`, valid for the call.
    let r = unsafe { sys::output(name.as_ptr(), name.len() as i32) };
    (r >= 0).then_some(Output(r))
}

/// Sends `data` to an output.
#[inline]
pub fn emit(out: Output, data: &[u8]) -> Result<(), HostError> {
    // SAFETY: the pointer and length describe `data`, valid for the call.
    let r = unsafe { sys::emit(out.0, data.as_ptr(), data.len() as i32) };
    if r < 0 { Err(HostError(r)) } else { Ok(()) }
}

/// Per-domain state ('C): a host-side key/value store with capped size.
pub mod state {
    use super::{HostError, sys};

    /// Copies the value under `key` into `buf`; returns its full length.
    #[inline]
    pub fn get(key: i64, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: the pointer and length describe `buf`, valid for the call.
        let r = unsafe { sys::state_get(key, buf.as_mut_ptr(), buf.len() as i32) };
        (r >= 0).then_some(r as usize)
    }

    #[inline]
    pub fn put(key: i64, val: &[u8]) -> Result<(), HostError> {
        // SAFETY: the pointer and length describe `val`, valid for the call.
        let r = unsafe { sys::state_put(key, val.as_ptr(), val.len() as i32) };
        if r < 0 { Err(HostError(r)) } else { Ok(()) }
    }

    #[inline]
    pub fn delete(key: i64) -> bool {
        // SAFETY: no pointers.
        unsafe { sys::state_del(key) >= 0 }
    }
}

/// The packet cache ('B): fixed slots.
pub mod cache {
    use super::{HostError, sys};

    #[inline]
    pub fn put(slot: u32, pkt: &[u8]) -> Result<(), HostError> {
        // SAFETY: the pointer and length describe `pkt`, valid for the call.
        let r = unsafe { sys::cache_put(slot as i32, pkt.as_ptr(), pkt.len() as i32) };
        if r < 0 { Err(HostError(r)) } else { Ok(()) }
    }

    #[inline]
    pub fn get(slot: u32, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: the pointer and length describe `buf`, valid for the call.
        let r = unsafe { sys::cache_get(slot as i32, buf.as_mut_ptr(), buf.len() as i32) };
        (r >= 0).then_some(r as usize)
    }
}

/// Read-only shared areas ('D).
pub mod shared {
    use super::sys;

    #[derive(Debug, Clone, Copy)]
    pub struct Area(i32);

    pub fn lookup(name: &str) -> Option<Area> {
        // SAFETY: the pointer and length describe `name`, valid for the call.
        let r = unsafe { sys::shared_lookup(name.as_ptr(), name.len() as i32) };
        (r >= 0).then_some(Area(r))
    }

    #[inline]
    pub fn read(area: Area, offset: u32, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: the pointer and length describe `buf`, valid for the call.
        let r =
            unsafe { sys::shared_read(area.0, offset as i32, buf.as_mut_ptr(), buf.len() as i32) };
        (r >= 0).then_some(r as usize)
    }
}

/// Defines the ABI exports for a handler: the input buffer of `CAP` bytes
/// (`sc_input_ptr`, `sc_input_cap`) and `handle(len) -> i32`, which calls your function
/// with the input as a mutable slice.
#[macro_export]
macro_rules! handler {
    ($cap:expr, fn $name:ident($pkt:ident : &mut [u8]) -> i32 $body:block) => {
        static mut __SC_INPUT: [u8; $cap] = [0u8; $cap];

        #[unsafe(no_mangle)]
        pub extern "C" fn sc_input_ptr() -> i32 {
            // SAFETY: only the address is taken.
            unsafe { core::ptr::addr_of!(__SC_INPUT) as i32 }
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn sc_input_cap() -> i32 {
            $cap as i32
        }

        #[allow(non_snake_case)]
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[inline(always)]
            fn inner($pkt: &mut [u8]) -> i32 $body

            #[unsafe(export_name = stringify!($name))]
            pub extern "C" fn export(len: i32) -> i32 {
                let len = (len.max(0) as usize).min($cap);
                // SAFETY: the host writes the input before the call and does not touch
                // the buffer during it; the guest is single-threaded, so this is the
                // only reference.
                let buf = unsafe { core::slice::from_raw_parts_mut(core::ptr::addr_of_mut!(super::__SC_INPUT) as *mut u8, len) };
                inner(buf)
            }
        }
    };
}

/// What a batch-capable handler decided for one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Finished with this status (negative = error); nothing forwarded in place (the
    /// handler may have emitted with [`emit`]).
    Done(i32),
    /// Forward the buffer, as the handler left it, to an output.
    Forward(Output),
    /// Forward the first `len` bytes of the buffer (at most its capacity) to an output.
    ForwardLen(Output, usize),
}

impl Verdict {
    /// The per-buffer (non-batch) path: a forward becomes an `emit`.
    #[doc(hidden)]
    #[inline(always)]
    pub fn into_status(self, pkt: &[u8]) -> i32 {
        let (out, len) = match self {
            Verdict::Done(s) => return s,
            Verdict::Forward(o) => (o, pkt.len()),
            Verdict::ForwardLen(o, l) => (o, l.min(pkt.len())),
        };
        match emit(out, &pkt[..len]) {
            Ok(()) => 0,
            Err(e) => e.0,
        }
    }

    /// The batch path: writes the verdict into descriptor `desc` (`status`, `fwd`,
    /// `len`), no host call.
    #[doc(hidden)]
    #[inline(always)]
    pub fn write(self, desc: &mut [u32; 4], cap: usize) {
        match self {
            Verdict::Done(s) => desc[2] = s as u32,
            Verdict::Forward(o) => desc[3] = o.0 as u32,
            Verdict::ForwardLen(o, l) => {
                desc[1] = l.min(cap) as u32;
                desc[3] = o.0 as u32;
            }
        }
    }
}

/// The batch region of a module with `B` buffers of `CAP` bytes (see the ABI):
/// header (`cur` and 3 reserved words), `B` descriptors, `B` slots.
#[doc(hidden)]
#[repr(C, align(16))]
pub struct BatchRegion<const B: usize, const CAP: usize> {
    pub cur: u32,
    pub reserved: [u32; 3],
    pub desc: [[u32; 4]; B],
    pub slots: [[u8; CAP]; B],
}

impl<const B: usize, const CAP: usize> BatchRegion<B, CAP> {
    pub const ZERO: Self = BatchRegion {
        cur: 0,
        reserved: [0; 3],
        desc: [[0; 4]; B],
        slots: [[0; CAP]; B],
    };
}

/// Defines a handler with both entry points: `handle(len)` per buffer (as [`handler!`])
/// and the batch entry `batch(n)` over up to `B` buffers, with `sc_batch_max` and
/// `sc_batch_ptr`. Your function gets each buffer as a mutable slice and returns a
/// [`Verdict`]; in the per-buffer entry a forward is an `emit`, in the batch entry an
/// in-place verdict (no host call). `emit` works in both (a batch attributes it to the
/// buffer being handled). The batch loop counts up to the host's `n` (≤ B), which the
/// verifier proves bounded by B. Name the entries yourself with
/// `fn handle_in / batch_in (pkt: &mut [u8]) -> Verdict { ... }`. One per module.
#[macro_export]
macro_rules! batch_handler {
    ($cap:expr, $b:expr, fn $name:ident($pkt:ident : &mut [u8]) -> Verdict $body:block) => {
        $crate::batch_handler!($cap, $b, fn $name / batch ($pkt: &mut [u8]) -> Verdict $body);
    };
    ($cap:expr, $b:expr, fn $name:ident / $batch:ident ($pkt:ident : &mut [u8]) -> Verdict $body:block) => {
        static mut __SC_INPUT: [u8; $cap] = [0u8; $cap];
        static mut __SC_BATCH: $crate::BatchRegion<{ $b }, { $cap }> = $crate::BatchRegion::ZERO;

        #[unsafe(no_mangle)]
        pub extern "C" fn sc_input_ptr() -> i32 {
            // SAFETY: only the address is taken.
            unsafe { core::ptr::addr_of!(__SC_INPUT) as i32 }
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn sc_input_cap() -> i32 {
            $cap as i32
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn sc_batch_max() -> i32 {
            $b as i32
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn sc_batch_ptr() -> i32 {
            // SAFETY: only the address is taken.
            unsafe { core::ptr::addr_of!(__SC_BATCH) as i32 }
        }

        #[allow(non_snake_case)]
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[inline(always)]
            fn inner($pkt: &mut [u8]) -> $crate::Verdict $body

            #[unsafe(export_name = stringify!($name))]
            pub extern "C" fn export(len: i32) -> i32 {
                let len = (len.max(0) as usize).min($cap);
                // SAFETY: the host writes the input before the call and does not touch
                // the buffer during it; the guest is single-threaded, so this is the
                // only reference.
                let buf = unsafe { core::slice::from_raw_parts_mut(core::ptr::addr_of_mut!(super::__SC_INPUT) as *mut u8, len) };
                inner(buf).into_status(buf)
            }

            #[unsafe(export_name = stringify!($batch))]
            pub extern "C" fn batch(n: i32) -> i32 {
                // SAFETY: the host writes the batch region before the call and does not
                // touch it during it; the guest is single-threaded, so this is the only
                // reference.
                let r = unsafe { &mut *core::ptr::addr_of_mut!(super::__SC_BATCH) };
                let n = n as u32 as usize;
                let mut i = 0;
                // Counts up to the host's n (1 ≤ n ≤ B): the verifier bounds it by B.
                while i < n {
                    r.cur = i as u32;
                    // Buffer i is in slot i (the host's layout); `.get` keeps a bad n
                    // from reaching past the region.
                    let (Some(d), Some(slot)) = (r.desc.get_mut(i), r.slots.get_mut(i)) else {
                        break;
                    };
                    let len = (d[1] as usize).min($cap);
                    inner(&mut slot[..len]).write(d, $cap);
                    i += 1;
                }
                0
            }
        }
    };
}

/// Declares loop bounds (the `sidecore.bounds` custom section). Each string is one
/// `FUNC LOOP MAX` entry, e.g. `bounds!("handle * PACKET_LEN_MAX/2+1")`.
#[macro_export]
macro_rules! bounds {
    ($($entry:literal),+ $(,)?) => {
        #[unsafe(link_section = "sidecore.bounds")]
        #[used]
        static __SC_BOUNDS: [u8; { 0 $(+ $entry.len() + 1)+ }] = {
            let mut out = [0u8; { 0 $(+ $entry.len() + 1)+ }];
            let mut at = 0;
            $(
                let e = $entry.as_bytes();
                let mut i = 0;
                while i < e.len() {
                    out[at] = e[i];
                    at += 1;
                    i += 1;
                }
                out[at] = b'\n';
                at += 1;
            )+
            let _ = at;
            out
        };
    };
}

#[cfg(all(feature = "panic-handler", target_arch = "wasm32", not(test)))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}
