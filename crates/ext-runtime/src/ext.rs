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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sidecore_ext_verify::{Admission, Calibration, Policy, Rejection, abi, verify};
use wasmtime::{
    Config, Engine, Instance, Linker, Memory, Module, Store, TypedFunc, UpdateDeadline,
};

use crate::host::{self, BoundExceeded, DrainHook, HostState, SharedAreas};
use crate::policy::{Tracker, UnloadReason, ViolationPolicy};
use crate::tsc;

/// How invocations are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
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
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

impl ExtEngine {
    pub fn new(
        mode: ExecMode,
        max_stack_bytes: u64,
        epoch_tick: Duration,
    ) -> anyhow::Result<ExtEngine> {
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
        let engine = Engine::new(&cfg).map_err(anyhow::Error::from)?;
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

/// Why a module could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Rejected(Rejection),
    #[error("instantiation failed: {0}")]
    Instantiate(String),
    #[error("host ABI: {0}")]
    Abi(String),
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
    input_ptr: usize,
    input_cap: usize,
    mode: ExecMode,
    limit_cycles: u64,
    limit_fuel: u64,
    tracker: Tracker,
    unloaded: Option<UnloadReason>,
    pub admission: Admission,
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
        cfg.violations.validate().map_err(LoadError::Abi)?;
        let admission = verify(wasm, &cfg.policy, cal).map_err(LoadError::Rejected)?;
        let bytes = if engine.mode == ExecMode::Hybrid {
            admission.module.clone()
        } else {
            wasm.to_vec()
        };
        Self::instantiate(engine, &bytes, admission, cfg, cal, shared)
    }

    /// Instantiates `bytes` under an existing admission (the runtime never runs a module
    /// that was not admitted; tests use this to run a contained module as given).
    pub fn instantiate(
        engine: &ExtEngine,
        bytes: &[u8],
        admission: Admission,
        cfg: &ExtConfig,
        cal: &Calibration,
        shared: SharedAreas,
    ) -> Result<WasmExtension, LoadError> {
        let caps = cfg.policy.caps.clone();
        let module = Module::new(&engine.engine, bytes)
            .map_err(|e| LoadError::Instantiate(format!("{e:?}")))?;
        let mut linker = Linker::new(&engine.engine);
        host::link(&mut linker).map_err(|e| LoadError::Instantiate(format!("{e:?}")))?;
        let limits = host::store_limits(&caps);
        let mut state = HostState::new(caps.clone(), cfg.outputs.clone(), shared, limits);
        state.declared_loops = declared_descriptions(&admission);
        let mut store = Store::new(&engine.engine, state);
        store.limiter(|s| &mut s.limits);
        let limit_cycles = admission.limit_cycles.max(1.0) as u64;
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
        let instance = linker
            .instantiate(&mut store, &module)
            .map_err(|e| LoadError::Instantiate(format!("{e:?}")))?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| LoadError::Abi("no exported memory `memory`".into()))?;
        store.data_mut().memory = Some(memory);
        let get_i32 = |store: &mut Store<HostState>, name: &str| -> Result<i32, LoadError> {
            let f = instance
                .get_typed_func::<(), i32>(&mut *store, name)
                .map_err(|e| LoadError::Abi(format!("export `{name}`: {e}")))?;
            f.call(&mut *store, ())
                .map_err(|e| LoadError::Abi(format!("`{name}` trapped: {e:?}")))
        };
        if let Ok(init) = instance.get_typed_func::<(), ()>(&mut store, "sc_init") {
            init.call(&mut store, ())
                .map_err(|e| LoadError::Abi(format!("`sc_init` trapped: {e:?}")))?;
        }
        let ptr = get_i32(&mut store, "sc_input_ptr")?;
        let cap = get_i32(&mut store, "sc_input_cap")?;
        if ptr < 0 || cap <= 0 {
            return Err(LoadError::Abi(format!(
                "input buffer at {ptr} of {cap} bytes is invalid"
            )));
        }
        if cap as u64 > caps.scratch_bytes {
            return Err(LoadError::Abi(format!(
                "input buffer of {cap} bytes exceeds the per-packet region cap ('A) of {} bytes",
                caps.scratch_bytes
            )));
        }
        if ptr as usize + cap as usize > memory.data_size(&store) {
            return Err(LoadError::Abi(format!(
                "input buffer {ptr}..{} lies outside linear memory ({} bytes)",
                ptr + cap,
                memory.data_size(&store)
            )));
        }
        let mut handlers = Vec::new();
        for e in admission.entries.iter().filter(|e| e.handler) {
            let f = instance
                .get_typed_func::<i32, i32>(&mut store, &e.name)
                .map_err(|err| LoadError::Abi(format!("handler `{}`: {err}", e.name)))?;
            handlers.push((e.name.clone(), f));
        }
        // Fuel accounting limit: the acceptable limit scaled by the handler's
        // fuel-per-cycle ratio from the static analysis.
        let limit_fuel = admission
            .entries
            .iter()
            .filter(|e| e.handler && e.bound_cycles > 0.0)
            .map(|e| (admission.limit_cycles * e.bound_fuel / e.bound_cycles).max(1.0) as u64)
            .min()
            .unwrap_or(u64::MAX);
        let _ = cal;
        Ok(WasmExtension {
            live: Some(Live {
                store,
                memory,
                _instance: instance,
            }),
            handlers,
            input_ptr: ptr as usize,
            input_cap: cap as usize,
            mode: engine.mode,
            limit_cycles,
            limit_fuel,
            tracker: Tracker::new(cfg.violations),
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
        let f = self
            .handlers
            .get(h)
            .ok_or(InvokeError::NoHandler(h))?
            .1
            .clone();
        let live = self.live.as_mut().expect("live while not unloaded");
        let Live { store, memory, .. } = live;
        memory.data_mut(&mut *store)[self.input_ptr..self.input_ptr + input.len()]
            .copy_from_slice(input);
        {
            let st = store.data_mut();
            st.emitted.clear();
            st.out_bytes.clear();
            st.violated = false;
        }
        let mode = self.mode;
        let fuel0 = if mode == ExecMode::Fuel {
            store.get_fuel().unwrap_or(0)
        } else {
            0
        };
        if mode == ExecMode::Epoch {
            store.set_epoch_deadline(1);
        }
        if mode == ExecMode::Unchecked {
            let r = f.call(&mut *store, input.len() as i32);
            return Ok(match r {
                Ok(status) => Outcome {
                    status,
                    cycles: 0,
                    fuel: None,
                    violated: false,
                    trap: None,
                    bound_exceeded: false,
                    unloaded: false,
                },
                Err(e) => Outcome {
                    status: -1,
                    cycles: 0,
                    fuel: None,
                    violated: false,
                    trap: Some(trap_message(&e)),
                    bound_exceeded: false,
                    unloaded: false,
                },
            });
        }
        let t0 = tsc::now();
        store.data_mut().start = t0;
        let r = f.call(&mut *store, input.len() as i32);
        let t1 = tsc::now();
        let cycles = t1.wrapping_sub(t0);
        let fuel =
            (mode == ExecMode::Fuel).then(|| fuel0.saturating_sub(store.get_fuel().unwrap_or(0)));
        let (status, trap, bound_exceeded) = match r {
            Ok(s) => (s, None, false),
            Err(e) => {
                let be = e.downcast_ref::<BoundExceeded>().map(|b| b.to_string());
                let msg = be.clone().unwrap_or_else(|| trap_message(&e));
                (-1, Some(msg), be.is_some())
            }
        };
        let over = match fuel {
            Some(used) => used > self.limit_fuel,
            None => cycles > self.limit_cycles,
        };
        let violated = over || store.data().violated;
        let unload = self.tracker.record(violated, trap.clone());
        if unload {
            // Idle now: the call has returned. Drop the instance and its state.
            self.unloaded = self.tracker.pending_unload.clone();
            self.live = None;
        }
        Ok(Outcome {
            status,
            cycles,
            fuel,
            violated,
            trap,
            bound_exceeded,
            unloaded: unload,
        })
    }

    /// Messages emitted by the last invocation: (output id, bytes).
    pub fn emitted(&self) -> Vec<(u32, &[u8])> {
        match &self.live {
            Some(l) => {
                let st = l.store.data();
                st.emitted
                    .iter()
                    .map(|(o, r)| (*o, &st.out_bytes[r.clone()]))
                    .collect()
            }
            None => Vec::new(),
        }
    }

    /// Visits the messages of the last invocation without collecting them.
    pub fn for_each_emitted(&self, mut f: impl FnMut(u32, &[u8])) {
        if let Some(l) = &self.live {
            let st = l.store.data();
            for (o, r) in &st.emitted {
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
    pub fn memory_write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), String> {
        let l = self.live.as_mut().ok_or("offcode unloaded")?;
        let data = l.memory.data_mut(&mut l.store);
        let end = offset
            .checked_add(bytes.len())
            .filter(|e| *e <= data.len())
            .ok_or_else(|| {
                format!(
                    "write of {} bytes at {offset} is outside linear memory ({} bytes)",
                    bytes.len(),
                    data.len()
                )
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

/// The trap code (e.g. "call stack exhausted") when there is one, else the whole chain.
fn trap_message(e: &wasmtime::Error) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(t) => format!("wasm trap: {t}"),
        None => format!("{e:#}"),
    }
}

fn declared_descriptions(a: &Admission) -> Vec<String> {
    // Same order as `instrument::Plan::declared` (keyed by (function, ordinal)).
    let mut v: Vec<(u32, u32, String)> = a
        .loops
        .iter()
        .filter(|l| matches!(l.source, sidecore_ext_verify::BoundSource::Declared(_)))
        .map(|l| {
            (
                l.func,
                l.ordinal,
                format!(
                    "loop #{} in {} at {:#x} ran past its declared bound {}",
                    l.ordinal, l.func_name, l.offset, l.iterations
                ),
            )
        })
        .collect();
    v.sort_by_key(|x| (x.0, x.1));
    v.into_iter().map(|x| x.2).collect()
}

/// The host imports a module may use, for documentation and tools.
pub fn abi_imports() -> Vec<String> {
    abi::HOST_ABI
        .iter()
        .map(|h| format!("{}.{}", abi::MODULE, h.name))
        .collect()
}
