//! Running admitted Wasm offcodes: engines for the four execution modes, instances with
//! capped regions, per-invocation accounting, and unloading at the next idle moment.
//!
//! Modes (the same handler can run all four ways, which the benchmarks compare):
//! * `hybrid` — sidecore's: the admitted module (declared-bound counters, poll points
//!   only in loops whose cost exceeds the acceptable limit) on a plain engine, two
//!   cycle-counter reads per invocation (thesis §3.3). No per-back-edge checks.
//! * `unchecked` — the module as given on a plain engine, no accounting (the baseline).
//! * `fuel` — wasmtime fuel metering; accounting by fuel consumed.
//! * `epoch` — wasmtime epoch interruption with a deadline callback that records a
//!   violation, drains input and *continues* (never traps).
//!
//! Batches (`stage`/`invoke_staged`/`invoke_batch`): up to B buffers copied into the
//! module's batch slots, one guest call of its batch entry, one accounted invocation
//! with limit n × the acceptable limit, then per-buffer statuses and in-place verdicts
//! read back from the descriptors (layout in `sidecore_ext_verify::abi`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sidecore_ext_verify::{Admission, Calibration, EntryReport, Policy, Rejection, abi, verify};
use wasmtime::{
    Config, Engine, Instance, Linker, Memory, Module, Store, TypedFunc, UpdateDeadline,
};

use crate::host::{self, BoundExceeded, DrainHook, HostState, SharedAreas};
use crate::policy::{BadPolicy, Tracker, UnloadReason, ViolationPolicy};
use crate::preempt::Preemptions;
use crate::tsc;

/// How invocations are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecMode {
    Hybrid,
    Unchecked,
    Fuel,
    Epoch,
}

/// Everything needed to admit and run one Wasm offcode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtConfig {
    pub policy: Policy,
    pub violations: ViolationPolicy,
    pub mode: ExecMode,
    /// Names of the offcode's outputs, in id order.
    pub outputs: Vec<String>,
    /// Epoch tick period (epoch mode), µs.
    pub epoch_tick_us: u64,
}

impl Default for ExtConfig {
    fn default() -> Self {
        ExtConfig {
            policy: Policy::default(),
            violations: ViolationPolicy::default(),
            mode: ExecMode::Hybrid,
            outputs: vec!["out".into()],
            epoch_tick_us: 100,
        }
    }
}

/// A wasmtime engine configured for one mode (plus its epoch ticker).
pub struct ExtEngine {
    pub engine: Engine,
    pub mode: ExecMode,
    /// The host ABI (`sc.*`), linked once for every instance of this engine.
    pub linker: Linker<HostState>,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl ExtEngine {
    pub fn new(
        mode: ExecMode,
        max_stack_bytes: u64,
        epoch_tick: Duration,
    ) -> Result<ExtEngine, EngineError> {
        let mut cfg = Config::new();
        // Backstop for the static stack check: a guest that still overflows traps.
        cfg.max_wasm_stack((max_stack_bytes as usize * 2).max(64 << 10));
        match mode {
            ExecMode::Fuel => {
                cfg.consume_fuel(true);
            }
            ExecMode::Epoch => {
                cfg.epoch_interruption(true);
            }
            ExecMode::Hybrid | ExecMode::Unchecked => {}
        }
        let engine = Engine::new(&cfg).map_err(EngineError)?;
        let mut linker = Linker::new(&engine);
        host::link(&mut linker).map_err(EngineError)?;
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = (mode == ExecMode::Epoch).then(|| {
            let (e, s) = (engine.clone(), stop.clone());
            std::thread::Builder::new()
                .name("sidecore-epoch".into())
                .spawn(move || {
                    while !s.load(Ordering::Relaxed) {
                        std::thread::sleep(epoch_tick);
                        e.increment_epoch();
                    }
                })
                .expect("spawn epoch ticker")
        });
        Ok(ExtEngine {
            engine,
            mode,
            linker,
            stop,
            ticker,
        })
    }
}

impl Drop for ExtEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

/// Why wasmtime could not be set up (its configuration or the host ABI's
/// linking), in wasmtime's words.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up wasmtime: {0:#}")]
pub struct EngineError(pub wasmtime::Error);

/// Why a module could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Rejected(Rejection),
    #[error("instantiation failed: {0}")]
    Instantiate(String),
    #[error("host ABI: {0}")]
    Abi(String),
    #[error("host ABI: {0}")]
    Policy(#[from] BadPolicy),
}

/// Why a control-plane write into an offcode's linear memory was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemoryWriteError {
    #[error("offcode unloaded")]
    Unloaded,
    #[error("write of {len} bytes at {offset} is outside linear memory ({size} bytes)")]
    OutOfBounds {
        len: usize,
        offset: usize,
        size: usize,
    },
}

/// Why an invocation did not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvokeError {
    #[error("offcode unloaded: {0}")]
    Unloaded(String),
    #[error("input of {len} bytes exceeds the per-packet region ('A) of {cap} bytes")]
    InputTooLarge { len: usize, cap: usize },
    #[error("no handler #{0}")]
    NoHandler(usize),
    #[error("no batch entry #{0}")]
    NoBatchEntry(usize),
    #[error("the module exports no batch entry (`batch` or `batch_<input>`)")]
    NoBatch,
    #[error("batch of {n} buffers exceeds the module's batch size B = {max}")]
    BatchTooLong { n: usize, max: usize },
    #[error("empty batch: the host never calls a batch entry with n = 0")]
    EmptyBatch,
    #[error("buffer #{index} of the batch: {len} bytes exceed the {cap}-byte slot ('A)")]
    BatchInputTooLarge {
        index: usize,
        len: usize,
        cap: usize,
    },
}

/// Result of one buffer of a batch, from its descriptor after the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchItem {
    /// The guest's status for this buffer ([`abi::STATUS_BAD_VERDICT`] if its in-place
    /// verdict could not be honoured).
    pub status: i32,
    /// In-place verdict: (output, length) of the rewritten buffer to forward.
    pub forward: Option<(u32, u32)>,
    /// Why the guest's verdict was not honoured, if it was not.
    pub bad_verdict: Option<BadVerdict>,
}

/// A verdict the host refused (the forward is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadVerdict {
    #[error("verdict forwards to output {fwd}, but the offcode has {outputs} outputs")]
    UnknownOutput { fwd: i32, outputs: u32 },
    #[error("verdict forwards {len} bytes, over the {cap}-byte limit (slot or output cap)")]
    TooLong { len: u32, cap: u64 },
}

/// Where the batch region lies (validated against linear memory at load).
#[derive(Debug, Clone, Copy)]
struct BatchLayout {
    /// Address of the region (its `cur` word).
    base: usize,
    /// B.
    max: usize,
    /// Address of slot 0; slot i is at `slots + i * slot`.
    slots: usize,
    slot: usize,
}

impl BatchLayout {
    fn desc(&self, i: usize) -> usize {
        self.base + abi::BATCH_HEADER + i * abi::BATCH_DESC
    }
}

/// Result of one invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: i32,
    /// Cycle-counter ticks the invocation took (0 in unchecked mode).
    pub cycles: u64,
    /// Fuel consumed (fuel mode).
    pub fuel: Option<u64>,
    pub violated: bool,
    /// It ran over its bound by no more than its thread waited for a CPU
    /// meanwhile: the overrun is the scheduler's, not charged as a violation.
    pub preempted: bool,
    pub trap: Option<String>,
    pub bound_exceeded: bool,
    /// The offcode has been unloaded after this invocation (it was idle).
    pub unloaded: bool,
}

struct Live {
    store: Store<HostState>,
    memory: Memory,
    _instance: Instance,
}

/// One instantiated Wasm offcode.
pub struct WasmExtension {
    live: Option<Live>,
    handlers: Vec<(String, TypedFunc<i32, i32>)>,
    batches: Vec<(String, TypedFunc<i32, i32>)>,
    batch: Option<BatchLayout>,
    /// Buffers staged for the next batch call.
    staged: usize,
    /// Per-buffer results of the last batch call.
    items: Vec<BatchItem>,
    input_ptr: usize,
    input_cap: usize,
    mode: ExecMode,
    limit_cycles: u64,
    limit_fuel: u64,
    /// Fuel limit per buffer of a batch.
    limit_fuel_batch: u64,
    tracker: Tracker,
    /// Whether an overrun coincided with a preemption.
    preemptions: Preemptions,
    unloaded: Option<UnloadReason>,
    pub admission: Admission,
}

/// The module's input buffer (`sc_input_ptr`, `sc_input_cap`) is a real
/// region of linear memory (`mem` bytes) within the per-packet cap.
fn check_input_buffer(ptr: i32, cap: i32, scratch: u64, mem: usize) -> Result<(), LoadError> {
    if ptr < 0 || cap <= 0 {
        return Err(LoadError::Abi(format!(
            "input buffer at {ptr} of {cap} bytes is invalid"
        )));
    }
    if cap as u64 > scratch {
        return Err(LoadError::Abi(format!(
            "input buffer of {cap} bytes exceeds the per-packet region cap ('A) of {scratch} bytes"
        )));
    }
    if ptr as usize + cap as usize > mem {
        return Err(LoadError::Abi(format!(
            "input buffer {ptr}..{} lies outside linear memory ({mem} bytes)",
            ptr + cap
        )));
    }
    Ok(())
}

impl WasmExtension {
    /// Verifies and instantiates `wasm` (hybrid: the admitted, instrumented module;
    /// other modes: the module as given, for comparison).
    pub fn load(
        engine: &ExtEngine,
        wasm: &[u8],
        cfg: &ExtConfig,
        cal: &Calibration,
        shared: SharedAreas,
    ) -> Result<WasmExtension, LoadError> {
        cfg.violations.validate()?;
        let admission = verify(wasm, &cfg.policy, cal).map_err(LoadError::Rejected)?;
        let bytes = if engine.mode == ExecMode::Hybrid {
            admission.module.clone()
        } else {
            wasm.to_vec()
        };
        Self::instantiate(engine, &bytes, admission, cfg, shared)
    }

    /// The store an instance runs in: the host state with the region caps and
    /// the declared loops, the memory limiter, and fuel or the epoch deadline
    /// that the budget poll hangs on.
    fn store(
        engine: &ExtEngine,
        admission: &Admission,
        cfg: &ExtConfig,
        shared: SharedAreas,
        limit_cycles: u64,
    ) -> Result<Store<HostState>, LoadError> {
        let caps = cfg.policy.caps.clone();
        let limits = host::store_limits(&caps);
        let mut state = HostState::new(caps, cfg.outputs.clone(), shared, limits);
        state.declared_loops = declared_descriptions(admission);
        let mut store = Store::new(&engine.engine, state);
        store.limiter(|s| &mut s.limits);
        store.data_mut().limit_cycles = limit_cycles;
        match engine.mode {
            ExecMode::Fuel => {
                store
                    .set_fuel(u64::MAX / 4)
                    .map_err(|e| LoadError::Instantiate(format!("{e:?}")))?;
            }
            ExecMode::Epoch => {
                store.set_epoch_deadline(1);
                store.epoch_deadline_callback(|mut cx| {
                    cx.data_mut().poll();
                    Ok(UpdateDeadline::Continue(1))
                });
            }
            _ => {}
        }
        Ok(store)
    }

    /// Instantiates `bytes` under an existing admission (the runtime never runs a module
    /// that was not admitted; tests use this to run a contained module as given).
    pub fn instantiate(
        engine: &ExtEngine,
        bytes: &[u8],
        admission: Admission,
        cfg: &ExtConfig,
        shared: SharedAreas,
    ) -> Result<WasmExtension, LoadError> {
        let caps = cfg.policy.caps.clone();
        let module = Module::new(&engine.engine, bytes)
            .map_err(|e| LoadError::Instantiate(format!("{e:?}")))?;
        let limit_cycles = admission.limit_cycles.max(1.0) as u64;
        let mut store = Self::store(engine, &admission, cfg, shared, limit_cycles)?;
        let instance = engine
            .linker
            .instantiate(&mut store, &module)
            .map_err(|e| LoadError::Instantiate(format!("{e:?}")))?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| LoadError::Abi("no exported memory `memory`".into()))?;
        store.data_mut().memory = Some(memory);
        let get_i32 = |store: &mut Store<HostState>, name: &str| export_i32(&instance, store, name);
        if let Ok(init) = instance.get_typed_func::<(), ()>(&mut store, "sc_init") {
            init.call(&mut store, ())
                .map_err(|e| LoadError::Abi(format!("`sc_init` trapped: {e:?}")))?;
        }
        let ptr = get_i32(&mut store, "sc_input_ptr")?;
        let cap = get_i32(&mut store, "sc_input_cap")?;
        check_input_buffer(ptr, cap, caps.scratch_bytes, memory.data_size(&store))?;
        let mut handlers = Vec::new();
        let mut batches = Vec::new();
        for e in admission
            .entries
            .iter()
            .filter(|e| e.handler || e.batch.is_some())
        {
            let f = instance
                .get_typed_func::<i32, i32>(&mut store, &e.name)
                .map_err(|err| LoadError::Abi(format!("handler `{}`: {err}", e.name)))?;
            if e.handler {
                handlers.push((e.name.clone(), f));
            } else {
                batches.push((e.name.clone(), f));
            }
        }
        let batch = match admission.batch_max {
            Some(max) if !batches.is_empty() => {
                let base = get_i32(&mut store, abi::EXPORT_BATCH_PTR)?;
                Some(batch_layout(
                    base,
                    max as usize,
                    cap as usize,
                    memory.data_size(&store),
                )?)
            }
            _ => None,
        };
        // Fuel accounting limit: the acceptable limit scaled by the entry's
        // fuel-per-cycle ratio from the static analysis (handlers, batch entries).
        let fuel_limit = |entry: fn(&EntryReport) -> bool| {
            admission
                .entries
                .iter()
                .filter(|e| entry(e) && e.bound_cycles > 0.0)
                .map(|e| (admission.limit_cycles * e.bound_fuel / e.bound_cycles).max(1.0) as u64)
                .min()
                .unwrap_or(u64::MAX)
        };
        let limit_fuel = fuel_limit(|e| e.handler);
        let limit_fuel_batch = fuel_limit(|e| e.batch.is_some());
        Ok(WasmExtension {
            live: Some(Live {
                store,
                memory,
                _instance: instance,
            }),
            handlers,
            batches,
            batch,
            staged: 0,
            items: Vec::new(),
            input_ptr: ptr as usize,
            input_cap: cap as usize,
            mode: engine.mode,
            limit_cycles,
            limit_fuel,
            limit_fuel_batch,
            tracker: Tracker::new(cfg.violations),
            preemptions: Preemptions::new(),
            unloaded: None,
            admission,
        })
    }

    pub fn handler(&self, name: &str) -> Option<usize> {
        self.handlers.iter().position(|(n, _)| n == name)
    }

    pub fn handler_names(&self) -> Vec<String> {
        self.handlers.iter().map(|(n, _)| n.clone()).collect()
    }

    pub fn input_cap(&self) -> usize {
        self.input_cap
    }

    pub fn set_drain_hook(&mut self, hook: DrainHook) {
        if let Some(l) = self.live.as_mut() {
            l.store.data_mut().drain = Some(hook);
        }
    }

    /// Runs handler `h` on one input buffer. Never interrupts the guest: violations are
    /// recorded, and an offcode that must go is unloaded after the call returns.
    pub fn invoke(&mut self, h: usize, input: &[u8]) -> Result<Outcome, InvokeError> {
        if let Some(r) = &self.unloaded {
            return Err(InvokeError::Unloaded(r.to_string()));
        }
        if input.len() > self.input_cap {
            return Err(InvokeError::InputTooLarge {
                len: input.len(),
                cap: self.input_cap,
            });
        }
        if h >= self.handlers.len() {
            return Err(InvokeError::NoHandler(h));
        }
        let live = self.live.as_mut().expect("live while not unloaded");
        let Live { store, memory, .. } = live;
        memory.data_mut(&mut *store)[self.input_ptr..self.input_ptr + input.len()]
            .copy_from_slice(input);
        let (lc, lf) = (self.limit_cycles, self.limit_fuel);
        store.data_mut().begin(lc, host::MAX_EMITS, usize::MAX);
        let o = self.call(false, h, input.len() as i32, lc, lf);
        if o.unloaded {
            self.unload_now();
        }
        Ok(o)
    }

    /// Idle now (the call has returned): drop the instance and its state.
    fn unload_now(&mut self) {
        self.unloaded = self.tracker.pending_unload.clone();
        self.live = None;
    }

    /// One accounted guest call of handler (or batch entry) `h` with argument `arg`,
    /// the host state already prepared: two cycle-counter reads around it, the violation
    /// recorded, and the instance dropped afterwards (idle) if the policy says so.
    fn call(
        &mut self,
        batch: bool,
        h: usize,
        arg: i32,
        limit_cycles: u64,
        limit_fuel: u64,
    ) -> Outcome {
        // Borrow the function in place: cloning a TypedFunc clones its type (reference
        // counts), a measurable share of a ~60 ns call.
        let f = if batch {
            &self.batches[h].1
        } else {
            &self.handlers[h].1
        };
        let store = &mut self.live.as_mut().expect("live while not unloaded").store;
        let mode = self.mode;
        if mode == ExecMode::Unchecked {
            return match f.call(&mut *store, arg) {
                Ok(status) => Outcome {
                    status,
                    cycles: 0,
                    fuel: None,
                    violated: false,
                    preempted: false,
                    trap: None,
                    bound_exceeded: false,
                    unloaded: false,
                },
                Err(e) => Outcome {
                    status: -1,
                    cycles: 0,
                    fuel: None,
                    violated: false,
                    preempted: false,
                    trap: Some(trap_message(&e)),
                    bound_exceeded: false,
                    unloaded: false,
                },
            };
        }
        let fuel0 = if mode == ExecMode::Fuel {
            store.get_fuel().unwrap_or(0)
        } else {
            0
        };
        if mode == ExecMode::Epoch {
            store.set_epoch_deadline(1);
        }
        if mode != ExecMode::Fuel {
            // Outside the measured span: the first call calibrates the counter.
            let per_ns = tsc::ticks_per_ns_cached();
            self.preemptions.before(tsc::now(), per_ns);
        }
        let t0 = tsc::now();
        store.data_mut().start = t0;
        let r = f.call(&mut *store, arg);
        let t1 = tsc::now();
        let cycles = t1.wrapping_sub(t0);
        let fuel =
            (mode == ExecMode::Fuel).then(|| fuel0.saturating_sub(store.get_fuel().unwrap_or(0)));
        let (status, trap, bound_exceeded) = match r {
            Ok(s) => (s, None, false),
            Err(e) => {
                let be = e
                    .downcast_ref::<BoundExceeded>()
                    .map(std::string::ToString::to_string);
                let msg = be.clone().unwrap_or_else(|| trap_message(&e));
                (-1, Some(msg), be.is_some())
            }
        };
        let over = match fuel {
            Some(used) => used > limit_fuel,
            None => cycles > limit_cycles,
        };
        // An overrun measured in cycles is charged only if the thread ran the
        // whole time (fuel counts instructions and needs no excuse).
        let suspected = over || store.data().violated;
        let preempted = suspected && fuel.is_none() && {
            let overrun = cycles.saturating_sub(limit_cycles) as f64 / tsc::ticks_per_ns_cached();
            self.preemptions.excuses(overrun.max(1.0) as u64)
        };
        let violated = suspected && !preempted;
        let unload = self.tracker.record(violated, trap.clone());
        Outcome {
            status,
            cycles,
            fuel,
            violated,
            preempted,
            trap,
            bound_exceeded,
            unloaded: unload,
        }
    }

    /// Index of the batch entry `name`.
    pub fn batch_entry(&self, name: &str) -> Option<usize> {
        self.batches.iter().position(|(n, _)| n == name)
    }

    pub fn batch_entry_names(&self) -> Vec<String> {
        self.batches.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The module's batch size B, if it has batch entries.
    pub fn batch_max(&self) -> Option<usize> {
        self.batch.map(|b| b.max)
    }

    /// Buffers staged for the next batch call.
    pub fn staged(&self) -> usize {
        self.staged
    }

    /// Copies `input` into the next free slot of the batch region and writes its
    /// descriptor (`off`, `len`, `status = 0`, `fwd = -1`); returns its index. The
    /// staged buffers go to the guest with [`WasmExtension::invoke_staged`].
    pub fn stage(&mut self, input: &[u8]) -> Result<usize, InvokeError> {
        if let Some(r) = &self.unloaded {
            return Err(InvokeError::Unloaded(r.to_string()));
        }
        let b = self.batch.ok_or(InvokeError::NoBatch)?;
        let i = self.staged;
        if i >= b.max {
            return Err(InvokeError::BatchTooLong {
                n: i + 1,
                max: b.max,
            });
        }
        if input.len() > b.slot {
            return Err(InvokeError::BatchInputTooLarge {
                index: i,
                len: input.len(),
                cap: b.slot,
            });
        }
        let l = self.live.as_mut().expect("live while not unloaded");
        let data = l.memory.data_mut(&mut l.store);
        write_desc(data, &b, i, input);
        self.staged = i + 1;
        Ok(i)
    }

    /// Runs batch entry `h` once on the staged buffers (one guest call, one accounted
    /// invocation with limit `n` × the acceptable limit), then reads every buffer's
    /// status and in-place verdict ([`WasmExtension::batch_items`]). Outputs are visited
    /// with [`WasmExtension::for_each_batch_output`].
    pub fn invoke_staged(&mut self, h: usize) -> Result<Outcome, InvokeError> {
        if let Some(r) = &self.unloaded {
            return Err(InvokeError::Unloaded(r.to_string()));
        }
        let b = self.batch.ok_or(InvokeError::NoBatch)?;
        if h >= self.batches.len() {
            return Err(InvokeError::NoBatchEntry(h));
        }
        let n = self.staged;
        if n == 0 {
            return Err(InvokeError::EmptyBatch);
        }
        self.staged = 0;
        {
            let l = self.live.as_mut().expect("live while not unloaded");
            let Live { store, memory, .. } = l;
            memory.data_mut(&mut *store)[b.base..b.base + 4].copy_from_slice(&0u32.to_le_bytes());
        }
        let (lc, lf) = (
            self.limit_cycles.saturating_mul(n as u64),
            self.limit_fuel_batch.saturating_mul(n as u64),
        );
        if let Some(l) = self.live.as_mut() {
            l.store.data_mut().begin(lc, host::MAX_EMITS * n, b.base);
        }
        let o = self.call(true, h, n as i32, lc, lf);
        self.items.clear();
        if let Some(l) = self.live.as_mut() {
            l.store.data_mut().batch_cur = usize::MAX;
            let outputs = l.store.data().output_names.len().max(1) as u32;
            let out_cap = l.store.data().caps.output_bytes;
            let data = l.memory.data(&l.store);
            for i in 0..n {
                self.items.push(read_verdict(
                    data,
                    &b,
                    i,
                    outputs,
                    out_cap,
                    o.trap.is_some(),
                ));
            }
        }
        if o.unloaded {
            // Between batches: the per-buffer results stay readable, the outputs go
            // with the instance (as a single invocation's do).
            self.unload_now();
        }
        Ok(o)
    }

    /// Runs batch entry `h` on `inputs` (1 ≤ len ≤ B): stages them and calls
    /// [`WasmExtension::invoke_staged`]. Checks every input before writing any.
    pub fn invoke_batch(&mut self, h: usize, inputs: &[&[u8]]) -> Result<Outcome, InvokeError> {
        if let Some(r) = &self.unloaded {
            return Err(InvokeError::Unloaded(r.to_string()));
        }
        let b = self.batch.ok_or(InvokeError::NoBatch)?;
        if inputs.is_empty() {
            return Err(InvokeError::EmptyBatch);
        }
        if inputs.len() > b.max {
            return Err(InvokeError::BatchTooLong {
                n: inputs.len(),
                max: b.max,
            });
        }
        if let Some((index, x)) = inputs.iter().enumerate().find(|(_, x)| x.len() > b.slot) {
            return Err(InvokeError::BatchInputTooLarge {
                index,
                len: x.len(),
                cap: b.slot,
            });
        }
        if h >= self.batches.len() {
            return Err(InvokeError::NoBatchEntry(h));
        }
        let l = self.live.as_mut().expect("live while not unloaded");
        let data = l.memory.data_mut(&mut l.store);
        for (i, x) in inputs.iter().enumerate() {
            write_desc(data, &b, i, x);
        }
        self.staged = inputs.len();
        self.invoke_staged(h)
    }

    /// Per-buffer results of the last batch call.
    pub fn batch_items(&self) -> &[BatchItem] {
        &self.items
    }

    /// Visits the outputs of the last batch call in delivery order — for each buffer,
    /// what it emitted, then its in-place forward — as (buffer, output, bytes). The
    /// forwarded bytes are read in place from the instance's memory (no copy).
    pub fn for_each_batch_output(&self, mut f: impl FnMut(usize, u32, &[u8])) {
        let (Some(l), Some(b)) = (&self.live, &self.batch) else {
            return;
        };
        let st = l.store.data();
        let data = l.memory.data(&l.store);
        let n = self.items.len();
        let mut next = 0usize; // next buffer whose forward is due
        let mut forward = |upto: usize, f: &mut dyn FnMut(usize, u32, &[u8])| {
            while next < upto.min(n) {
                if let Some((out, len)) = self.items[next].forward {
                    let at = b.slots + next * b.slot;
                    f(next, out, &data[at..at + len as usize]);
                }
                next += 1;
            }
        };
        for (out, buf, r) in &st.emitted {
            let buf = (*buf as usize).min(n.saturating_sub(1));
            // Forwards of the buffers before this one come first.
            forward(buf, &mut f);
            f(buf, *out, &st.out_bytes[r.clone()]);
        }
        forward(n, &mut f);
    }

    /// Messages emitted by the last invocation: (output id, bytes).
    pub fn emitted(&self) -> Vec<(u32, &[u8])> {
        match &self.live {
            Some(l) => {
                let st = l.store.data();
                st.emitted
                    .iter()
                    .map(|(o, _, r)| (*o, &st.out_bytes[r.clone()]))
                    .collect()
            }
            None => Vec::new(),
        }
    }

    /// Visits the messages of the last invocation without collecting them.
    pub fn for_each_emitted(&self, mut f: impl FnMut(u32, &[u8])) {
        if let Some(l) = &self.live {
            let st = l.store.data();
            for (o, _, r) in &st.emitted {
                f(*o, &st.out_bytes[r.clone()]);
            }
        }
    }

    pub fn unload_reason(&self) -> Option<&UnloadReason> {
        self.unloaded.as_ref()
    }

    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// Poll points passed and drains done so far.
    pub fn poll_stats(&self) -> (u64, u64) {
        self.live
            .as_ref()
            .map(|l| (l.store.data().polls, l.store.data().drains))
            .unwrap_or((0, 0))
    }

    /// Control-plane write into the offcode's linear memory (region 'C), e.g. to preload
    /// a table. Bounds-checked.
    pub fn memory_write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), MemoryWriteError> {
        let l = self.live.as_mut().ok_or(MemoryWriteError::Unloaded)?;
        let data = l.memory.data_mut(&mut l.store);
        let end = offset
            .checked_add(bytes.len())
            .filter(|e| *e <= data.len())
            .ok_or(MemoryWriteError::OutOfBounds {
                len: bytes.len(),
                offset,
                size: data.len(),
            })?;
        data[offset..end].copy_from_slice(bytes);
        Ok(())
    }

    pub fn memory_size(&self) -> usize {
        self.live
            .as_ref()
            .map(|l| l.memory.data_size(&l.store))
            .unwrap_or(0)
    }

    /// Control-plane read of a host key/value entry (region 'C).
    pub fn state_value(&self, key: i64) -> Option<&[u8]> {
        self.live
            .as_ref()
            .and_then(|l| l.store.data().state.get(&key))
            .map(std::vec::Vec::as_slice)
    }

    /// Control-plane read of the offcode's linear memory (region 'C). Bounds-checked.
    pub fn memory_read(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let l = self.live.as_ref()?;
        l.memory
            .data(&l.store)
            .get(offset..offset.checked_add(len)?)
    }

    /// Number of host key/value entries (region 'C).
    pub fn state_len(&self) -> usize {
        self.live
            .as_ref()
            .map(|l| l.store.data().state.len())
            .unwrap_or(0)
    }

    pub fn limit_cycles(&self) -> u64 {
        self.limit_cycles
    }
}

/// Writes buffer `i` into its slot and its descriptor (`off`, `len`, `status = 0`,
/// `fwd = -1`). The layout was checked against the memory size at load.
#[inline]
fn write_desc(data: &mut [u8], b: &BatchLayout, i: usize, input: &[u8]) {
    let off = b.slots + i * b.slot;
    data[off..off + input.len()].copy_from_slice(input);
    let d = b.desc(i);
    let mut w = [0u8; abi::BATCH_DESC];
    w[0..4].copy_from_slice(&(off as u32).to_le_bytes());
    w[4..8].copy_from_slice(&(input.len() as u32).to_le_bytes());
    w[12..16].copy_from_slice(&(-1i32).to_le_bytes());
    data[d..d + abi::BATCH_DESC].copy_from_slice(&w);
}

/// Reads buffer `i`'s status and verdict back. The host's own `off` is used, never the
/// guest's; a verdict naming an unknown output or a length over the slot or the output
/// cap is dropped and the buffer's status becomes `STATUS_BAD_VERDICT`. After a trap
/// nothing is forwarded (the guest's state is half-updated).
#[inline]
fn read_verdict(
    data: &[u8],
    b: &BatchLayout,
    i: usize,
    outputs: u32,
    out_cap: u64,
    trapped: bool,
) -> BatchItem {
    let d = b.desc(i);
    let w = |k: usize| {
        let x = &data[d + 4 * k..d + 4 * k + 4];
        u32::from_le_bytes([x[0], x[1], x[2], x[3]])
    };
    let (len, status, fwd) = (w(1), w(2) as i32, w(3) as i32);
    let item = |status, forward, bad_verdict| BatchItem {
        status,
        forward,
        bad_verdict,
    };
    if trapped {
        return item(if status < 0 { status } else { -1 }, None, None);
    }
    if fwd < 0 {
        return item(status, None, None);
    }
    let cap = (b.slot as u64).min(out_cap);
    let bad = if fwd as u32 >= outputs {
        Some(BadVerdict::UnknownOutput { fwd, outputs })
    } else if len as u64 > cap {
        Some(BadVerdict::TooLong { len, cap })
    } else {
        None
    };
    match bad {
        Some(_) => item(abi::STATUS_BAD_VERDICT, None, bad),
        None => item(status, Some((fwd as u32, len)), None),
    }
}

/// The trap code (e.g. "call stack exhausted") when there is one, else the whole chain.
fn trap_message(e: &wasmtime::Error) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(t) => format!("wasm trap: {t}"),
        None => format!("{e:#}"),
    }
}

/// The trap message of each declared-bound loop, indexed by the id its
/// instrumentation reports (`LoopReport::declared_id`).
fn declared_descriptions(a: &Admission) -> Vec<String> {
    let mut v = Vec::new();
    for l in &a.loops {
        if let Some(id) = l.declared_id {
            let id = id as usize;
            if v.len() <= id {
                v.resize(id + 1, String::new());
            }
            v[id] = format!(
                "loop #{} in {} at {:#x} ran past its declared bound {}",
                l.ordinal, l.func_name, l.offset, l.iterations
            );
        }
    }
    v
}

/// The host imports a module may use, for documentation and tools.
pub fn abi_imports() -> Vec<String> {
    abi::HOST_ABI
        .iter()
        .map(|h| format!("{}.{}", abi::MODULE, h.name))
        .collect()
}

/// Calls an exported `() -> i32` function (the guest's layout queries).
fn export_i32(
    instance: &wasmtime::Instance,
    store: &mut Store<HostState>,
    name: &str,
) -> Result<i32, LoadError> {
    let f = instance
        .get_typed_func::<(), i32>(&mut *store, name)
        .map_err(|e| LoadError::Abi(format!("export `{name}`: {e}")))?;
    f.call(&mut *store, ())
        .map_err(|e| LoadError::Abi(format!("`{name}` trapped: {e:?}")))
}

/// The batch region the guest reports at `base`: `max` descriptors and slots
/// of `slot` bytes, 4-byte aligned and inside linear memory of `size` bytes.
fn batch_layout(base: i32, max: usize, slot: usize, size: usize) -> Result<BatchLayout, LoadError> {
    let bytes = abi::batch_region_bytes(max, slot);
    if base < 0 || !(base as usize).is_multiple_of(4) || base as usize + bytes > size {
        return Err(LoadError::Abi(format!(
            "batch region at {base} of {bytes} bytes ({max} descriptors and slots of {slot} bytes) must be 4-byte aligned and inside linear memory ({size} bytes)"
        )));
    }
    let base = base as usize;
    Ok(BatchLayout {
        base,
        max,
        slots: base + abi::BATCH_HEADER + max * abi::BATCH_DESC,
        slot,
    })
}
