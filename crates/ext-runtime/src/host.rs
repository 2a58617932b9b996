//! Host side of the ABI (documented in `sidecore_ext_verify::abi`): the store's state —
//! the four capped memory regions of thesis §4.2.4 and the outputs — and the host
//! functions linked into every instance, including the injected poll point and the
//! declared-bound guard.
//!
//! | region | here | cap |
//! |---|---|---|
//! | 'A per-packet scratch | the input buffer in linear memory, rewritten per invocation | `scratch_bytes` |
//! | 'B packet cache | `cache`: fixed slots, `put`/`get` | `cache_slots` × `cache_slot_bytes` |
//! | 'C per-domain state | the instance's linear memory + the host key/value store `state` | `memory_bytes`, `state_bytes` |
//! | 'D shared, read-only | `shared`: named areas owned by the host | reads ≤ `shared_read_bytes` |

use std::collections::HashMap;
use std::sync::Arc;

use sidecore_ext_verify::{RegionCaps, abi};
use wasmtime::{Caller, Extern, Linker, StoreLimits};

use crate::tsc;

/// Read-only shared areas (region 'D), shared between domains.
pub type SharedAreas = Arc<Vec<(String, Arc<[u8]>)>>;

/// The error a broken declared loop bound traps with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("declared loop bound exceeded: {0}")]
pub struct BoundExceeded(pub String);

/// A hook run at a poll point once the invocation is over its limit: the analogue of
/// `poll_interfaces()` in thesis Fig. 3.4 (move device input into internal queues).
pub type DrainHook = Box<dyn FnMut() + Send>;

/// Most messages one invocation (one buffer of a batch) may emit.
pub const MAX_EMITS: usize = 64;

/// Per-instance host state.
pub struct HostState {
    pub caps: RegionCaps,
    pub limits: StoreLimits,
    /// Names of the outputs, by id.
    pub output_names: Vec<String>,
    /// Emitted messages of the current invocation: (output, buffer index within the
    /// batch — 0 outside batches —, range into `out_bytes`).
    pub emitted: Vec<(u32, u32, std::ops::Range<usize>)>,
    pub out_bytes: Vec<u8>,
    /// Most messages one invocation may emit (per buffer of a batch: × n).
    pub max_emits: usize,
    /// During a batch call: the address of the batch region's `cur` word, which says
    /// which buffer an `sc.emit` belongs to; `usize::MAX` otherwise.
    pub batch_cur: usize,
    pub state: HashMap<i64, Vec<u8>>,
    pub state_used: u64,
    pub cache: Vec<Option<Vec<u8>>>,
    pub shared: SharedAreas,
    // accounting
    pub start: u64,
    pub limit_cycles: u64,
    pub violated: bool,
    pub polls: u64,
    pub drains: u64,
    pub drain: Option<DrainHook>,
    /// Descriptions of declared loops, by id (for the trap message).
    pub declared_loops: Vec<String>,
    /// The instance's exported `memory`, once instantiated.
    pub memory: Option<wasmtime::Memory>,
}

impl HostState {
    /// Resets the per-call state before a guest call: no output yet, no violation,
    /// the call's cycle limit and emit cap, and the batch region's `cur` word
    /// (`usize::MAX` outside a batch).
    pub fn begin(&mut self, limit_cycles: u64, max_emits: usize, batch_cur: usize) {
        self.emitted.clear();
        self.out_bytes.clear();
        self.violated = false;
        self.limit_cycles = limit_cycles;
        self.max_emits = max_emits;
        self.batch_cur = batch_cur;
    }

    pub fn new(
        caps: RegionCaps,
        outputs: Vec<String>,
        shared: SharedAreas,
        limits: StoreLimits,
    ) -> HostState {
        let slots = caps.cache_slots as usize;
        HostState {
            caps,
            limits,
            output_names: outputs,
            emitted: Vec::new(),
            out_bytes: Vec::new(),
            max_emits: MAX_EMITS,
            batch_cur: usize::MAX,
            state: HashMap::new(),
            state_used: 0,
            cache: vec![None; slots],
            shared,
            start: 0,
            limit_cycles: u64::MAX,
            violated: false,
            polls: 0,
            drains: 0,
            drain: None,
            declared_loops: Vec::new(),
            memory: None,
        }
    }

    /// The poll point (thesis Fig. 3.4), counting at most one violation per invocation.
    pub fn poll(&mut self) {
        self.polls += 1;
        let now = tsc::now();
        if now.wrapping_sub(self.start) > self.limit_cycles {
            self.violated = true;
            self.drains += 1;
            if let Some(d) = self.drain.as_mut() {
                d();
            }
        }
    }
}

/// The instance's exported memory: cached in the store after instantiation (a lookup by
/// name on every host call would cost more than the call itself).
#[inline]
fn memory(caller: &mut Caller<'_, HostState>) -> Option<wasmtime::Memory> {
    if let Some(m) = caller.data().memory {
        return Some(m);
    }
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => Some(m),
        _ => None,
    }
}

/// Bounds-checked guest range.
fn range(ptr: i32, len: i32, size: usize) -> Option<std::ops::Range<usize>> {
    if ptr < 0 || len < 0 {
        return None;
    }
    let (p, l) = (ptr as usize, len as usize);
    let end = p.checked_add(l)?;
    (end <= size).then_some(p..end)
}

/// A UTF-8 name the guest passed as (pointer, length), bounds-checked.
fn guest_str(data: &[u8], ptr: i32, len: i32) -> Option<&str> {
    std::str::from_utf8(&data[range(ptr, len, data.len())?]).ok()
}

/// Links the host ABI and the injected functions.
pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    link_output(linker)?;
    link_state(linker)?;
    link_cache(linker)?;
    link_shared(linker)?;
    link_injected(linker)
}

/// Links the guest's outputs: `output` (a port by name) and `emit`.
fn link_output(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let m = abi::MODULE;
    linker.func_wrap(
        m,
        "output",
        |mut c: Caller<'_, HostState>, ptr: i32, len: i32| -> i32 {
            let Some(mem) = memory(&mut c) else { return -1 };
            let (data, st) = mem.data_and_store_mut(&mut c);
            let Some(name) = guest_str(data, ptr, len) else {
                return -1;
            };
            st.output_names
                .iter()
                .position(|n| n == name)
                .map(|i| i as i32)
                .unwrap_or(-1)
        },
    )?;
    linker.func_wrap(
        m,
        "emit",
        |mut c: Caller<'_, HostState>, out: i32, ptr: i32, len: i32| -> i32 {
            let Some(mem) = memory(&mut c) else { return -1 };
            let (data, st) = mem.data_and_store_mut(&mut c);
            if out < 0 || out as usize >= st.output_names.len().max(1) {
                return -1;
            }
            if len as i64 > st.caps.output_bytes as i64 {
                return -2;
            }
            if st.emitted.len() >= st.max_emits {
                return -3;
            }
            let Some(r) = range(ptr, len, data.len()) else {
                return -1;
            };
            // Inside a batch: attribute the message to the buffer the guest says it is
            // handling (a lie only reorders the guest's own outputs).
            let buf = match data.get(st.batch_cur..st.batch_cur.wrapping_add(4)) {
                Some(w) => u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
                None => 0,
            };
            let start = st.out_bytes.len();
            st.out_bytes.extend_from_slice(&data[r]);
            let end = st.out_bytes.len();
            st.emitted.push((out as u32, buf, start..end));
            0
        },
    )?;
    Ok(())
}

/// Links per-extension state: `state_get`, `state_put`, `state_del` within the region's caps.
fn link_state(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let m = abi::MODULE;
    linker.func_wrap(
        m,
        "state_get",
        |mut c: Caller<'_, HostState>, key: i64, dst: i32, cap: i32| -> i32 {
            let Some(mem) = memory(&mut c) else { return -1 };
            let (data, st) = mem.data_and_store_mut(&mut c);
            let Some(v) = st.state.get(&key) else {
                return -1;
            };
            let n = v.len().min(cap.max(0) as usize);
            let Some(r) = range(dst, n as i32, data.len()) else {
                return -1;
            };
            data[r].copy_from_slice(&v[..n]);
            v.len() as i32
        },
    )?;
    linker.func_wrap(
        m,
        "state_put",
        |mut c: Caller<'_, HostState>, key: i64, src: i32, len: i32| -> i32 {
            let Some(mem) = memory(&mut c) else { return -1 };
            let (data, st) = mem.data_and_store_mut(&mut c);
            if len as i64 > st.caps.state_value_bytes as i64 {
                return -2;
            }
            let Some(r) = range(src, len, data.len()) else {
                return -1;
            };
            let old = st.state.get(&key).map(|v| v.len() as u64).unwrap_or(0);
            let new_used = st.state_used - old + len as u64;
            if new_used > st.caps.state_bytes {
                return -2;
            }
            st.state_used = new_used;
            let slot = st.state.entry(key).or_default();
            slot.clear();
            slot.extend_from_slice(&data[r]);
            0
        },
    )?;
    linker.func_wrap(
        m,
        "state_del",
        |mut c: Caller<'_, HostState>, key: i64| -> i32 {
            let st = c.data_mut();
            match st.state.remove(&key) {
                Some(v) => {
                    st.state_used -= v.len() as u64;
                    0
                }
                None => -1,
            }
        },
    )?;
    Ok(())
}

/// Links the per-invocation cache slots: `cache_put`, `cache_get`.
fn link_cache(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let m = abi::MODULE;
    linker.func_wrap(
        m,
        "cache_put",
        |mut c: Caller<'_, HostState>, slot: i32, src: i32, len: i32| -> i32 {
            let Some(mem) = memory(&mut c) else { return -1 };
            let (data, st) = mem.data_and_store_mut(&mut c);
            if slot < 0 || slot as usize >= st.cache.len() {
                return -1;
            }
            if len as i64 > st.caps.cache_slot_bytes as i64 {
                return -2;
            }
            let Some(r) = range(src, len, data.len()) else {
                return -1;
            };
            let s = st.cache[slot as usize].get_or_insert_with(Vec::new);
            s.clear();
            s.extend_from_slice(&data[r]);
            0
        },
    )?;
    linker.func_wrap(
        m,
        "cache_get",
        |mut c: Caller<'_, HostState>, slot: i32, dst: i32, cap: i32| -> i32 {
            let Some(mem) = memory(&mut c) else { return -1 };
            let (data, st) = mem.data_and_store_mut(&mut c);
            let Some(Some(v)) = (slot >= 0).then(|| st.cache.get(slot as usize)).flatten() else {
                return -1;
            };
            let n = v.len().min(cap.max(0) as usize);
            let Some(r) = range(dst, n as i32, data.len()) else {
                return -1;
            };
            data[r].copy_from_slice(&v[..n]);
            v.len() as i32
        },
    )?;
    Ok(())
}

/// Links read-only shared areas: `shared_lookup`, `shared_read`.
fn link_shared(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let m = abi::MODULE;
    linker.func_wrap(
        m,
        "shared_lookup",
        |mut c: Caller<'_, HostState>, ptr: i32, len: i32| -> i32 {
            let Some(mem) = memory(&mut c) else { return -1 };
            let (data, st) = mem.data_and_store_mut(&mut c);
            let Some(name) = guest_str(data, ptr, len) else {
                return -1;
            };
            st.shared
                .iter()
                .position(|(n, _)| n == name)
                .map(|i| i as i32)
                .unwrap_or(-1)
        },
    )?;
    linker.func_wrap(
        m,
        "shared_read",
        |mut c: Caller<'_, HostState>, area: i32, off: i32, dst: i32, len: i32| -> i32 {
            let Some(mem) = memory(&mut c) else { return -1 };
            let (data, st) = mem.data_and_store_mut(&mut c);
            let Some((_, bytes)) = (area >= 0).then(|| st.shared.get(area as usize)).flatten()
            else {
                return -1;
            };
            if len as i64 > st.caps.shared_read_bytes as i64 || off < 0 {
                return -1;
            }
            let Some(src) = range(off, len, bytes.len()) else {
                return -1;
            };
            let Some(r) = range(dst, len, data.len()) else {
                return -1;
            };
            data[r].copy_from_slice(&bytes[src]);
            len
        },
    )?;
    Ok(())
}

/// Links the functions the instrumentation injects: the budget poll and the loop-bound trap.
fn link_injected(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        abi::INJECT_MODULE,
        abi::INJECT_POLL,
        |mut c: Caller<'_, HostState>| {
            c.data_mut().poll();
        },
    )?;
    linker.func_wrap(
        abi::INJECT_MODULE,
        abi::INJECT_BOUND,
        |c: Caller<'_, HostState>, id: i32| -> wasmtime::Result<()> {
            let what = c
                .data()
                .declared_loops
                .get(id as usize)
                .cloned()
                .unwrap_or_else(|| format!("loop id {id}"));
            Err(wasmtime::Error::new(BoundExceeded(what)))
        },
    )?;
    Ok(())
}

/// The store limits the runtime installs for region caps `caps`.
pub fn store_limits(caps: &RegionCaps) -> StoreLimits {
    wasmtime::StoreLimitsBuilder::new()
        .memory_size(caps.memory_bytes as usize)
        .table_elements(1024)
        .instances(1)
        .memories(1)
        .tables(1)
        .trap_on_grow_failure(false)
        .build()
}

/// Why [`probe_memory_cap`] could not run the module.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Compiling, linking or instantiating failed, in wasmtime's words (with its causes).
    #[error("{0:?}")]
    Wasm(wasmtime::Error),
    #[error("no memory")]
    NoMemory,
}

/// Diagnostics: instantiates `wasm` *without* verification under the store limits for
/// `caps`, calls its `handle(0)` (traps ignored) and returns the linear memory size
/// afterwards — shows that the dynamic memory cap holds on its own.
pub fn probe_memory_cap(caps: &RegionCaps, wasm: &[u8]) -> Result<usize, ProbeError> {
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, wasm).map_err(ProbeError::Wasm)?;
    let mut linker = Linker::new(&engine);
    link(&mut linker).map_err(ProbeError::Wasm)?;
    let st = HostState::new(
        caps.clone(),
        vec!["out".into()],
        Arc::new(Vec::new()),
        store_limits(caps),
    );
    let mut store = wasmtime::Store::new(&engine, st);
    store.limiter(|s| &mut s.limits);
    let inst = linker
        .instantiate(&mut store, &module)
        .map_err(ProbeError::Wasm)?;
    if let Ok(h) = inst.get_typed_func::<i32, i32>(&mut store, "handle") {
        let _ = h.call(&mut store, 0);
    }
    let mem = inst
        .get_memory(&mut store, "memory")
        .ok_or(ProbeError::NoMemory)?;
    Ok(mem.data_size(&store))
}
