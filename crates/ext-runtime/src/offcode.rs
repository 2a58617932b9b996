//! A Wasm module as an ordinary sidecore offcode: the loader registered for PE kind
//! `wasm` (`loader:wasm`). A manifest offcode with a `wasm` target and
//! `module = "path.wasm"` is *admitted at deploy time* (the factory runs the verifier with
//! the admission parameters from `params`, and a rejection fails the deployment with the
//! report), instantiated at `initialize` with the manifest's output names, and run on the
//! wasm PE: each message on input `X` calls the export `handle_X` (or `handle`), and what
//! the module emits goes to the named outputs.
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
use sidecore_ext_verify::{Admission, Calibration, RegionCaps, verify};
use sidecore_offcode::{
    BuildSpec, Implementation, InitCx, InputId, Metric, Offcode, OffcodeError, OutputId, Registry,
    RunCx,
};
use sidecore_types::PeKind;

use crate::ext::{ExecMode, ExtConfig, ExtEngine, InvokeError, WasmExtension};
use crate::policy::ViolationPolicy;

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

impl WasmParams {
    pub fn config(&self) -> Result<ExtConfig, String> {
        let mut cfg = ExtConfig::default();
        if let Some(v) = self.min_interarrival_ns {
            if v.is_nan() || v <= 0.0 {
                return Err(format!("min_interarrival_ns must be positive, got {v}"));
            }
            cfg.policy.acceptable_limit_ns = v;
        }
        if let Some(v) = self.inflation {
            if v.is_nan() || v < 1.0 {
                return Err(format!("inflation must be at least 1, got {v}"));
            }
            cfg.policy.inflation = v;
        }
        if let Some(v) = self.violations {
            v.validate()?;
            cfg.violations = v;
        }
        if let Some(c) = &self.caps {
            cfg.policy.caps = c.clone();
            cfg.policy
                .symbols
                .insert("PACKET_LEN_MAX".into(), c.scratch_bytes);
            cfg.policy
                .symbols
                .insert("STATE_VALUE_MAX".into(), c.state_value_bytes);
            cfg.policy
                .symbols
                .insert("CACHE_SLOTS".into(), c.cache_slots as u64);
        }
        if let Some(s) = &self.symbols {
            cfg.policy.symbols.extend(s.clone());
        }
        Ok(cfg)
    }
}

fn engine() -> Result<&'static ExtEngine, OffcodeError> {
    static ENGINE: OnceLock<Result<ExtEngine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            ExtEngine::new(ExecMode::Hybrid, 256 << 10, Duration::from_millis(1))
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| OffcodeError::failed(format!("wasm engine: {e}")))
}

/// An admitted Wasm module, instantiated at `initialize`.
pub struct WasmOffcode {
    bytes: Vec<u8>,
    cfg: ExtConfig,
    cal: Calibration,
    pub admission: Admission,
    ext: Option<WasmExtension>,
    /// Handler index for each input port.
    handlers: Vec<usize>,
    m_invocations: Metric,
    m_violations: Metric,
    m_cycles: Metric,
    m_dropped: Metric,
}

impl WasmOffcode {
    /// Admits `module` under `params` (deploy time).
    pub fn admit(
        module: &std::path::Path,
        params: &toml::Table,
    ) -> Result<WasmOffcode, OffcodeError> {
        let p: WasmParams = sidecore_offcode::parse_params(params)?;
        let cfg = p.config().map_err(OffcodeError::Params)?;
        let bytes =
            crate::cli::read_module(module).map_err(|e| OffcodeError::failed(e.to_string()))?;
        let (cal, _) = crate::cli::load_calibration(p.calibration.as_deref())
            .map_err(|e| OffcodeError::failed(e.to_string()))?;
        let admission = verify(&bytes, &cfg.policy, &cal)
            .map_err(|r| OffcodeError::failed(format!("{}: {r}", module.display())))?;
        Ok(WasmOffcode {
            bytes,
            cfg,
            cal,
            admission,
            ext: None,
            handlers: Vec::new(),
            m_invocations: Metric::default(),
            m_violations: Metric::default(),
            m_cycles: Metric::default(),
            m_dropped: Metric::default(),
        })
    }
}

impl Offcode for WasmOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        let info = cx.info().clone();
        self.cfg.outputs = info.outputs.clone();
        let ext = WasmExtension::instantiate(
            engine()?,
            &self.admission.module,
            self.admission.clone(),
            &self.cfg,
            &self.cal,
            Arc::new(Vec::new()),
        )
        .map_err(|e| OffcodeError::failed(e.to_string()))?;
        let _ = &self.bytes;
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
        }
        self.m_invocations = cx.metric("invocations");
        self.m_violations = cx.metric("violations");
        self.m_cycles = cx.metric("last_cycles");
        self.m_dropped = cx.metric("dropped");
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
                self.m_dropped.add(1);
                return Ok(());
            }
            Err(e) => return Err(OffcodeError::failed(e.to_string())),
        };
        self.m_invocations.add(1);
        self.m_cycles.set(o.cycles);
        if o.violated || o.trap.is_some() {
            self.m_violations.add(1);
        }
        let mut err = None;
        ext.for_each_emitted(|out, bytes| {
            if err.is_none()
                && let Err(e) = cx.send_bytes(OutputId(out as usize), bytes)
            {
                err = Some(e);
            }
        });
        if o.unloaded {
            // The invocation is over (idle): report, and the runtime takes it down.
            let why = ext
                .unload_reason()
                .map(|u| u.to_string())
                .unwrap_or_default();
            return Err(OffcodeError::failed(format!(
                "wasm offcode unloaded: {why}"
            )));
        }
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The `loader:wasm` implementation for the registry.
pub fn loader() -> Implementation {
    Implementation {
        name: Registry::loader_name(PeKind::Wasm),
        description: "untrusted Wasm offcode admitted by hybrid resource control (RBClick)".into(),
        kinds: vec![PeKind::Wasm],
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
            p.config().map(|_| ()).map_err(OffcodeError::Params)
        })),
    }
}

/// Registers the Wasm loader.
pub fn register(reg: &mut Registry) {
    reg.register(loader());
}
