//! A Wasm module as an ordinary sidecore offcode: the loader registered for PE kind
//! `wasm` (`loader:wasm`). A manifest offcode with a `wasm` target and
//! `module = "path.wasm"` is *admitted at deploy time* (the factory runs the verifier with
//! the admission parameters from `params`, and a rejection fails the deployment with the
//! report), instantiated at `initialize` with the manifest's output names, and run on the
//! wasm PE: each message on input `X` calls the export `handle_X` (or `handle`), and what
//! the module emits goes to the named outputs. If the module also exports the batch entry
//! `batch_X` (or `batch`), a burst waiting on the input is taken with the inlet's batched
//! receive, up to `B` messages straight into the module's batch slots, and handed over in
//! one call; its emits and in-place verdicts go out in buffer order.
//!
//! `params` (all optional):
//!
//! ```toml
//! params = { min_interarrival_ns = 1230, inflation = 64,
//!            violations = { k = 3, window = 64 },
//!            caps = { scratch_bytes = 2048, memory_bytes = 1048576, state_bytes = 1048576 },
//!            symbols = { MTU = 9000 }, calibration = "/etc/sidecore/calibration.json" }
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Deserialize;
use sidecore_ext_verify::{Admission, RegionCaps, verify};
use sidecore_offcode::{
    BuildSpec, Drained, Implementation, InitCx, Inlet, InputId, Interfaces, Metric, Offcode,
    OffcodeError, OutputId, Registry, RunCx,
};
use sidecore_types::PeKind;

use crate::ext::{
    EngineError, ExecMode, ExtConfig, ExtEngine, InvokeError, Outcome, WasmExtension,
};
use crate::policy::{BadPolicy, ViolationPolicy};

/// Admission and runtime parameters of a Wasm offcode (the manifest's `params`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WasmParams {
    /// The acceptable limit: minimum inter-arrival time of the input served, ns.
    pub min_interarrival_ns: Option<f64>,
    pub inflation: Option<f64>,
    pub violations: Option<ViolationPolicy>,
    pub caps: Option<RegionCaps>,
    pub symbols: Option<BTreeMap<String, u64>>,
    /// Calibration file; default `sidecore calibrate`'s default path.
    pub calibration: Option<PathBuf>,
}

/// Why a Wasm offcode's `params` cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum BadParams {
    #[error("min_interarrival_ns must be positive, got {0}")]
    MinInterarrival(f64),
    #[error("inflation must be at least 1, got {0}")]
    Inflation(f64),
    #[error(transparent)]
    Violations(#[from] BadPolicy),
}

impl WasmParams {
    pub fn config(&self) -> Result<ExtConfig, BadParams> {
        let mut cfg = ExtConfig::default();
        if let Some(v) = self.min_interarrival_ns {
            if v.is_nan() || v <= 0.0 {
                return Err(BadParams::MinInterarrival(v));
            }
            cfg.policy.acceptable_limit_ns = v;
        }
        if let Some(v) = self.inflation {
            if v.is_nan() || v < 1.0 {
                return Err(BadParams::Inflation(v));
            }
            cfg.policy.inflation = v;
        }
        if let Some(v) = self.violations {
            v.validate()?;
            cfg.violations = v;
        }
        if let Some(c) = &self.caps {
            cfg.policy.set_caps(c.clone());
        }
        if let Some(s) = &self.symbols {
            cfg.policy.symbols.extend(s.clone());
        }
        Ok(cfg)
    }
}

fn engine() -> Result<&'static ExtEngine, OffcodeError> {
    static ENGINE: OnceLock<Result<ExtEngine, EngineError>> = OnceLock::new();
    ENGINE
        .get_or_init(|| ExtEngine::new(ExecMode::Hybrid, 256 << 10, Duration::from_millis(1)))
        .as_ref()
        .map_err(|e| OffcodeError::failed(format!("wasm engine: {e}")))
}

/// An admitted Wasm module, instantiated at `initialize`.
pub struct WasmOffcode {
    cfg: ExtConfig,
    pub admission: Admission,
    ext: Option<WasmExtension>,
    /// Handler index for each input port.
    handlers: Vec<usize>,
    /// Batch entry index for each input port, if the module has one for it.
    batches: Vec<Option<usize>>,
    m: Metrics,
}

/// The counters a Wasm offcode publishes.
#[derive(Default)]
struct Metrics {
    batches: Metric,
    invocations: Metric,
    violations: Metric,
    /// Overruns excused because the thread was preempted meanwhile.
    preempted: Metric,
    cycles: Metric,
    dropped: Metric,
}

impl WasmOffcode {
    /// Admits `module` under `params` (deploy time).
    pub fn admit(
        module: &std::path::Path,
        params: &toml::Table,
    ) -> Result<WasmOffcode, OffcodeError> {
        let p: WasmParams = sidecore_offcode::parse_params(params)?;
        let cfg = p
            .config()
            .map_err(|e| OffcodeError::Params(e.to_string()))?;
        let bytes =
            crate::files::read_module(module).map_err(|e| OffcodeError::failed(e.to_string()))?;
        let (cal, _) = crate::files::load_calibration(p.calibration.as_deref())
            .map_err(|e| OffcodeError::failed(e.to_string()))?;
        let admission = verify(&bytes, &cfg.policy, &cal)
            .map_err(|r| OffcodeError::failed(format!("{}: {r}", module.display())))?;
        Ok(WasmOffcode {
            cfg,
            admission,
            ext: None,
            handlers: Vec::new(),
            batches: Vec::new(),
            m: Metrics::default(),
        })
    }
}

impl Offcode for WasmOffcode {
    /// A turn handles at most a burst per input, each within the admitted
    /// per-invocation bound: that bound, in ns, is the ticket <EDF>++ fits
    /// into the slack of a shared core.
    fn ticket_ns(&self) -> Option<u64> {
        let per_ns = crate::tsc::ticks_per_ns_cached();
        let inputs = self.handlers.len().max(1) as f64;
        let ns =
            self.admission.limit_cycles * (sidecore_offcode::TURN_BURST as f64) * inputs / per_ns;
        (ns.is_finite() && ns > 0.0).then(|| ns.min(u64::MAX as f64) as u64)
    }

    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        let info = cx.info().clone();
        self.cfg.outputs = info.outputs.clone();
        let ext = WasmExtension::instantiate(
            engine()?,
            &self.admission.module,
            self.admission.clone(),
            &self.cfg,
            Arc::new(Vec::new()),
        )
        .map_err(|e| OffcodeError::failed(e.to_string()))?;
        self.handlers.clear();
        for input in &info.inputs {
            let h = ext
                .handler(&format!("handle_{input}"))
                .or_else(|| ext.handler("handle"))
                .ok_or_else(|| {
                    OffcodeError::failed(format!(
                        "module has no handler for input `{input}` (export `handle_{input}` or `handle`; it has {:?})",
                        ext.handler_names()
                    ))
                })?;
            self.handlers.push(h);
            self.batches.push(
                ext.batch_entry(&sidecore_ext_verify::abi::batch_name(input))
                    .or_else(|| ext.batch_entry("batch")),
            );
        }
        self.m = Metrics {
            batches: cx.metric("batches"),
            invocations: cx.metric("invocations"),
            violations: cx.metric("violations"),
            preempted: cx.metric("preempted_overruns"),
            cycles: cx.metric("last_cycles"),
            dropped: cx.metric("dropped"),
        };
        self.ext = Some(ext);
        Ok(())
    }

    fn handle(
        &mut self,
        cx: &mut RunCx<'_>,
        input: InputId,
        msg: &[u8],
    ) -> Result<(), OffcodeError> {
        let ext = self
            .ext
            .as_mut()
            .ok_or_else(|| OffcodeError::failed("not initialized"))?;
        let h = *self
            .handlers
            .get(input.0)
            .ok_or_else(|| OffcodeError::failed(format!("no input #{}", input.0)))?;
        let o = match ext.invoke(h, msg) {
            Ok(o) => o,
            Err(InvokeError::InputTooLarge { .. }) => {
                self.m.dropped.add(1);
                return Ok(());
            }
            Err(e) => return Err(OffcodeError::failed(e.to_string())),
        };
        settle(&self.m, cx, ext, &o, 1, false)
    }

    fn handle_burst(
        &mut self,
        cx: &mut RunCx<'_>,
        input: InputId,
        inlet: &mut Inlet,
        max: usize,
    ) -> Result<Drained, OffcodeError> {
        let batch = self.batches.get(input.0).copied().flatten();
        let (Some(b), Some(bmax)) = (
            batch,
            self.ext
                .as_ref()
                .and_then(super::ext::WasmExtension::batch_max),
        ) else {
            return inlet.drain(max, |m| self.handle(cx, input, m));
        };
        let mut total = Drained::default();
        while total.messages < max && !total.closed {
            let want = bmax.min(max - total.messages);
            let ext = self
                .ext
                .as_mut()
                .ok_or_else(|| OffcodeError::failed("not initialized"))?;
            let dropped = &self.m.dropped;
            // Each message is copied from its ring slot straight into a batch slot.
            let d = inlet.drain(want, |m| match ext.stage(m) {
                Ok(_) => Ok(()),
                Err(InvokeError::BatchInputTooLarge { .. }) => {
                    dropped.add(1);
                    Ok(())
                }
                Err(e) => Err(OffcodeError::failed(e.to_string())),
            })?;
            total.messages += d.messages;
            total.closed = d.closed;
            let staged = ext.staged();
            if staged > 0 {
                self.run_batch(cx, b, staged)?;
            }
            if d.messages < want {
                break;
            }
        }
        Ok(total)
    }
}

impl WasmOffcode {
    /// One batch call on the staged buffers, then its outputs in buffer order.
    fn run_batch(&mut self, cx: &mut RunCx<'_>, b: usize, n: usize) -> Result<(), OffcodeError> {
        let ext = self
            .ext
            .as_mut()
            .ok_or_else(|| OffcodeError::failed("not initialized"))?;
        let o = ext
            .invoke_staged(b)
            .map_err(|e| OffcodeError::failed(e.to_string()))?;
        settle(&self.m, cx, ext, &o, n as u64, true)
    }
}

/// After one invocation of `buffers` buffers (one batch call when `batch`): counts it
/// (per buffer; `batches` counts the calls), sends what it emitted in order (every send
/// is tried, the first error is returned), and turns an unload — the invocation is over,
/// the instance idle — into the offcode's failure, which the runtime takes down.
fn settle(
    m: &Metrics,
    cx: &mut RunCx<'_>,
    ext: &WasmExtension,
    o: &Outcome,
    buffers: u64,
    batch: bool,
) -> Result<(), OffcodeError> {
    m.invocations.add(buffers);
    if batch {
        m.batches.add(1);
    }
    m.cycles.set(o.cycles);
    if o.violated || o.trap.is_some() {
        m.violations.add(1);
    }
    if o.preempted {
        m.preempted.add(1);
    }
    let mut err = None;
    let mut send = |out: u32, bytes: &[u8]| {
        if err.is_none()
            && let Err(e) = cx.send_bytes(OutputId(out as usize), bytes)
        {
            err = Some(e);
        }
    };
    if batch {
        ext.for_each_batch_output(|_, out, bytes| send(out, bytes));
    } else {
        ext.for_each_emitted(&mut send);
    }
    if o.unloaded {
        let why = ext
            .unload_reason()
            .map(std::string::ToString::to_string)
            .unwrap_or_default();
        return Err(OffcodeError::failed(format!(
            "wasm offcode unloaded: {why}"
        )));
    }
    err.map_or(Ok(()), Err)
}

/// The `loader:wasm` implementation for the registry.
pub fn loader() -> Implementation {
    Implementation {
        name: Registry::loader_name(PeKind::Wasm),
        description: "untrusted Wasm offcode admitted by hybrid resource control (RBClick)".into(),
        // The sandbox runs on the wasm PE's thread, or on a dedicated core
        // beside the offcodes there (`kind = "core"` with `module = ...`).
        kinds: vec![PeKind::Wasm, PeKind::Core],
        inputs: None,
        outputs: None,
        factory: Arc::new(|spec: &BuildSpec<'_>| {
            let module = spec.module.ok_or_else(|| {
                OffcodeError::failed("a wasm target needs `module = \"path.wasm\"`")
            })?;
            Ok(Box::new(WasmOffcode::admit(module, spec.params)?) as Box<dyn Offcode>)
        }),
        validate: Some(Arc::new(|params: &toml::Table| {
            let p: WasmParams = sidecore_offcode::parse_params(params)?;
            p.config()
                .map(|_| ())
                .map_err(|e| OffcodeError::Params(e.to_string()))
        })),
        interfaces: Interfaces::default(),
    }
}

/// Registers the Wasm loader.
pub fn register(reg: &mut Registry) {
    reg.register(loader());
}
