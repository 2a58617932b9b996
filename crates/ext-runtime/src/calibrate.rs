//! `sidecore calibrate`: measures this machine's cost model, as CAT measured its node
//! (thesis §3.2, §4.3.1, Tables 3.1 and 5.1):
//!
//! * per-instruction-class costs, by differential timing of Wasm micro-kernels compiled by
//!   the same engine the offcodes run on (a loop whose body repeats one operation K
//!   times, minus the same loop with an empty body);
//! * the fixed cost of one accounted invocation and of every host-ABI call (base, and
//!   per byte copied);
//! * memory latency by working-set size, mbench-style: strided reads and writes that
//!   touch a new cache line every access (Fig. 3.2, Table 5.1), plus a dependent
//!   pointer chase (Table 3.1's read latency).
//!
//! Results persist as JSON; `Calibration` in `sidecore-ext-verify` is the format.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sidecore_ext_verify::{Calibration, LatencyRow, OpClass, RegionCaps, abi};
use wasmtime::{Module, Store, StoreLimitsBuilder};

use crate::ext::{ExecMode, ExtConfig, ExtEngine, WasmExtension};
use crate::host::HostState;
use crate::tsc;

/// Where the calibration is read from and written to by default:
/// `$SIDECORE_CALIBRATION`, else `$XDG_CONFIG_HOME/sidecore/calibration.json`, else
/// `~/.config/sidecore/calibration.json`.
pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SIDECORE_CALIBRATION") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("sidecore").join("calibration.json")
}

/// Why a calibration file could not be read or written; every message names the file
/// (and, for bad JSON, the position).
#[derive(Debug, thiserror::Error)]
pub enum CalibrationFileError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: line {line}, column {column}: {source}")]
    Json {
        path: String,
        line: usize,
        column: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: tsc_per_ns must be positive, got {tsc_per_ns}")]
    BadTsc { path: String, tsc_per_ns: f64 },
    #[error(transparent)]
    Serialise(serde_json::Error),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CalibrationFileError + '_ {
    move |source| CalibrationFileError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Loads a calibration file, with a message saying what is wrong and where.
pub fn load(path: &Path) -> Result<Calibration, CalibrationFileError> {
    let text = std::fs::read_to_string(path).map_err(io_error(path))?;
    let cal: Calibration =
        serde_json::from_str(&text).map_err(|source| CalibrationFileError::Json {
            path: path.display().to_string(),
            line: source.line(),
            column: source.column(),
            source,
        })?;
    if cal.tsc_per_ns.is_nan() || cal.tsc_per_ns <= 0.0 {
        return Err(CalibrationFileError::BadTsc {
            path: path.display().to_string(),
            tsc_per_ns: cal.tsc_per_ns,
        });
    }
    Ok(cal)
}

/// Writes a calibration file (creating its directory).
pub fn save(cal: &Calibration, path: &Path) -> Result<(), CalibrationFileError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io_error(d))?;
    }
    let text = serde_json::to_string_pretty(cal).map_err(CalibrationFileError::Serialise)?;
    std::fs::write(path, text).map_err(io_error(path))
}

/// How thorough a calibration run is.
#[derive(Debug, Clone, Copy)]
pub struct Effort {
    pub reps: usize,
    /// Target duration of one timed run.
    pub run: Duration,
    pub sizes: &'static [u64],
}

impl Effort {
    pub const FULL: Effort = Effort {
        reps: 9,
        run: Duration::from_micros(2000),
        sizes: &[
            16 << 10,
            32 << 10,
            64 << 10,
            128 << 10,
            256 << 10,
            512 << 10,
            1 << 20,
            2 << 20,
            4 << 20,
            8 << 20,
            16 << 20,
            64 << 20,
        ],
    };
    pub const QUICK: Effort = Effort {
        reps: 9,
        run: Duration::from_micros(500),
        sizes: &[16 << 10, 64 << 10, 256 << 10, 1 << 20, 8 << 20, 64 << 20],
    };
}

const K: usize = 32;

/// The whole host ABI as WAT imports, each function named `$<name>`
/// (generated from [`abi::HOST_ABI`], so the kernels always import what the runtime links).
fn abi_imports_wat() -> String {
    let list = |kw: &str, vs: Vec<String>| {
        if vs.is_empty() {
            String::new()
        } else {
            format!(" ({kw} {})", vs.join(" "))
        }
    };
    abi::HOST_ABI
        .iter()
        .map(|f| {
            format!(
                "  (import \"{}\" \"{}\" (func ${}{}{}))\n",
                abi::MODULE,
                f.name,
                f.name,
                list(
                    "param",
                    f.params
                        .iter()
                        .map(std::string::ToString::to_string)
                        .collect()
                ),
                list(
                    "result",
                    f.results
                        .iter()
                        .map(std::string::ToString::to_string)
                        .collect()
                )
            )
        })
        .collect()
}

fn kernel(body: &str, reps: usize) -> String {
    let b = body.repeat(reps);
    let imports = abi_imports_wat();
    format!(
        r#"(module
{imports}  (import "sidecore" "poll" (func $poll))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "out")
  (type $t (func (param i32) (result i32)))
  (table 1 1 funcref)
  (elem (i32.const 0) $inc)
  (func $inc (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
  (func (export "k") (param $n i32) (result i32)
    (local $i i32) (local $x i32) (local $y i32) (local $z i32) (local $f f64)
    (local.set $x (local.get $n))
    (local.set $y (i32.const 8192))
    ;; $z: 3 at run time, unknown to the compiler (no constant folding of chains)
    (local.set $z (i32.add (i32.const 3) (i32.shr_u (local.get $n) (i32.const 31))))
    (local.set $f (f64.const 1.5))
    (block $out
      (loop $l
        {b}
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
    (i32.add (local.get $x) (i32.trunc_sat_f64_s (local.get $f))))
)"#
    )
}

struct Bench {
    engine: ExtEngine,
}

impl Bench {
    fn store(&self) -> Store<HostState> {
        let caps = RegionCaps {
            output_bytes: 1 << 16,
            ..RegionCaps::default()
        };
        let limits = StoreLimitsBuilder::new().build();
        let shared = Arc::new(vec![(
            "routes".to_string(),
            Arc::<[u8]>::from(vec![7u8; 8192]),
        )]);
        let mut st = HostState::new(caps, vec!["out".into()], shared, limits);
        st.max_emits = usize::MAX;
        st.state.insert(1, vec![0u8; 16]);
        st.state_used = 16;
        let mut s = Store::new(&self.engine.engine, st);
        s.limiter(|s| &mut s.limits);
        s
    }

    /// Median cycles per loop iteration of a kernel whose body is `body` × `reps`.
    fn per_iter(&self, body: &str, reps: usize, effort: Effort) -> f64 {
        let wat = kernel(body, reps);
        let module =
            Module::new(&self.engine.engine, wat.as_bytes()).expect("calibration kernel compiles");
        let mut store = self.store();
        let inst = self
            .engine
            .linker
            .instantiate(&mut store, &module)
            .expect("instantiate kernel");
        store.data_mut().memory = inst.get_memory(&mut store, "memory");
        let k = inst.get_typed_func::<i32, i32>(&mut store, "k").expect("k");
        // Size the run.
        let mut n = 16i32;
        loop {
            let t0 = tsc::now();
            let _ = k.call(&mut store, n);
            let dt = tsc::now() - t0;
            store.data_mut().emitted.clear();
            store.data_mut().out_bytes.clear();
            let target = effort.run.as_nanos() as f64 * tsc::ticks_per_ns_cached();
            if dt as f64 >= target / 4.0 || n >= 1 << 24 {
                break;
            }
            n *= 2;
        }
        let mut v = Vec::with_capacity(effort.reps);
        for _ in 0..effort.reps {
            store.data_mut().start = tsc::now();
            let t0 = tsc::now();
            let _ = k.call(&mut store, n);
            let dt = tsc::now() - t0;
            store.data_mut().emitted.clear();
            store.data_mut().out_bytes.clear();
            v.push(dt as f64 / n as f64);
        }
        median(&mut v)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Cycles per instruction of each cost class, from loops of `K` instructions
/// minus the empty loop; returns them with the empty loop's cost.
fn class_costs(bench: &Bench, effort: Effort) -> (BTreeMap<OpClass, f64>, f64) {
    let per = |body: &str| bench.per_iter(body, K, effort);
    let base = per("");
    let d = |body: &str, ops: f64| ((per(body) - base) / (K as f64 * ops)).max(0.0);
    let mv = d(
        "(local.set $y (local.get $x)) (local.set $x (local.get $y))",
        4.0,
    );
    let alu = d(
        "(local.set $x (i32.xor (i32.add (local.get $x) (i32.const 7)) (i32.const 3)))",
        2.0,
    );
    let mul = d(
        "(local.set $x (i32.mul (local.get $x) (local.get $z)))",
        1.0,
    );
    let div = (d(
        "(local.set $x (i32.or (i32.div_u (local.get $x) (local.get $z)) (i32.const 0x40000000)))",
        1.0,
    ) - alu)
        .max(alu);
    let float = d(
        "(local.set $f (f64.add (local.get $f) (f64.const 1.5)))",
        1.0,
    );
    let fdiv = d(
        "(local.set $f (f64.div (local.get $f) (f64.const 1.0000001)))",
        1.0,
    );
    let mut load_body = String::new();
    let mut store_body = String::new();
    for i in 0..K {
        load_body.push_str(&format!(
            "(local.set $x (i32.add (local.get $x) (i32.load offset={} (local.get $y))))",
            i * 64
        ));
        store_body.push_str(&format!(
            "(i32.store offset={} (local.get $y) (local.get $x))",
            i * 64
        ));
    }
    let load = ((bench.per_iter(&load_body, 1, effort) - base) / K as f64 - alu).max(0.0);
    let store = ((bench.per_iter(&store_body, 1, effort) - base) / K as f64).max(0.0);
    let branch = (d("(br_if $out (i32.eq (local.get $x) (i32.const -1)))", 1.0) - alu).max(0.0);
    let call = (d("(local.set $x (call $inc (local.get $x)))", 1.0) - alu).max(0.0);
    let call_ind = (d(
        "(local.set $x (call_indirect (type $t) (local.get $x) (i32.const 0)))",
        1.0,
    ) - alu)
        .max(0.0);
    let memsize = (d("(local.set $x (i32.add (local.get $x) (memory.size)))", 1.0) - alu).max(0.0);
    let fill = ((bench.per_iter(
        "(memory.fill (i32.const 8192) (local.get $x) (i32.const 4096))",
        4,
        effort,
    ) - base)
        / (4.0 * 4096.0))
        .max(0.0);

    let mut class_cycles = BTreeMap::new();
    for (c, v) in [
        (OpClass::Free, 0.0),
        (OpClass::Move, mv),
        (OpClass::Alu, alu),
        (OpClass::Mul, mul),
        (OpClass::Div, div),
        (OpClass::Float, float),
        (OpClass::FloatDiv, fdiv),
        (OpClass::Load, load),
        (OpClass::Store, store),
        (OpClass::Branch, branch),
        (OpClass::Call, call),
        (OpClass::CallIndirect, call_ind),
        (OpClass::MemSize, memsize),
        (OpClass::BulkByte, fill),
    ] {
        class_cycles.insert(c, (v * 1000.0).round() / 1000.0);
    }
    (class_cycles, base)
}

/// An empty accounted invocation, each host call's cost within an invocation,
/// the budget poll's, and the cost of each byte `emit` copies.
fn host_costs(
    bench: &Bench,
    effort: Effort,
    base: f64,
) -> Result<(f64, BTreeMap<String, f64>, f64), CalibrateError> {
    // Accounted invocation of an empty handler, then host calls measured the same way:
    // one call per invocation, minus the empty invocation (so each call is priced in the
    // context real handlers make it in, not amortised over a tight loop).
    let invoke = invoke_cost(&bench.engine, "", effort)?;
    let mut host_base = BTreeMap::new();
    let calls: &[(&str, &str)] = &[
        (
            "emit",
            "(drop (call $emit (i32.const 0) (i32.const 4096) (i32.const 0)))",
        ),
        (
            "output",
            "(drop (call $output (i32.const 16) (i32.const 3)))",
        ),
        (
            "state_get",
            "(drop (call $state_get (i64.const 1) (i32.const 64) (i32.const 16)))",
        ),
        (
            "state_put",
            "(drop (call $state_put (i64.const 1) (i32.const 64) (i32.const 16)))",
        ),
        ("state_del", "(drop (call $state_del (i64.const 2)))"),
        (
            "cache_put",
            "(drop (call $cache_put (i32.const 0) (i32.const 64) (i32.const 0)))",
        ),
        (
            "cache_get",
            "(drop (call $cache_get (i32.const 0) (i32.const 64) (i32.const 0)))",
        ),
        (
            "shared_lookup",
            "(drop (call $shared_lookup (i32.const 16) (i32.const 3)))",
        ),
        (
            "shared_read",
            "(drop (call $shared_read (i32.const 0) (i32.const 0) (i32.const 64) (i32.const 0)))",
        ),
    ];
    for (name, body) in calls {
        let c = (invoke_cost(&bench.engine, body, effort)? - invoke).max(0.0);
        host_base.insert(format!("{}.{name}", abi::MODULE), c.round());
    }
    let poll = ((bench.per_iter("(call $poll)", 8, effort) - base) / 8.0).max(0.0);
    host_base.insert(
        format!("{}.{}", abi::INJECT_MODULE, abi::INJECT_POLL),
        (poll * 10.0).round() / 10.0,
    );
    let emit_big = invoke_cost(
        &bench.engine,
        "(drop (call $emit (i32.const 0) (i32.const 4096) (i32.const 2048)))",
        effort,
    )? - invoke;
    let per_byte = ((emit_big - host_base["sc.emit"]) / 2048.0).max(0.0);
    Ok((invoke, host_base, per_byte))
}

/// Why a calibration run failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error(transparent)]
    Engine(#[from] crate::ext::EngineError),
    /// A probe module the calibration builds would not load or run.
    #[error("calibration probe: {0}")]
    Probe(String),
}

/// Runs the calibration.
pub fn calibrate(effort: Effort) -> Result<Calibration, CalibrateError> {
    let tsc_per_ns = tsc::ticks_per_ns(Duration::from_millis(if effort.reps > 5 {
        200
    } else {
        50
    }));
    tsc::set_ticks_per_ns(tsc_per_ns);
    let bench = Bench {
        engine: ExtEngine::new(ExecMode::Hybrid, 256 << 10, Duration::from_millis(1))?,
    };
    let (class_cycles, base) = class_costs(&bench, effort);
    let (invoke, host_base, per_byte) = host_costs(&bench, effort, base)?;
    let latency = effort.sizes.iter().map(|&ws| mbench(ws, effort)).collect();
    Ok(Calibration {
        machine: machine_name(),
        tsc_per_ns,
        class_cycles,
        invoke_cycles: invoke.round(),
        latency,
        host_base_cycles: host_base,
        host_per_byte_cycles: (per_byte * 1000.0).round() / 1000.0,
    })
}

/// Median cycles of an accounted invocation of a handler whose body is `body` (with the
/// whole host ABI imported and a shared area and a state entry present).
fn invoke_cost(engine: &ExtEngine, body: &str, effort: Effort) -> Result<f64, CalibrateError> {
    let imports = abi_imports_wat();
    let wat = format!(
        r#"(module
{imports}      (memory (export "memory") 1 1)
      (data (i32.const 16) "out")
      (func (export "sc_input_ptr") (result i32) (i32.const 4096))
      (func (export "sc_input_cap") (result i32) (i32.const 2048))
      (func (export "sc_init") (drop (call $state_put (i64.const 1) (i32.const 64) (i32.const 16))))
      (func (export "handle") (param i32) (result i32) {body} (local.get 0)))"#
    );
    let bytes = wat::parse_str(&wat).map_err(|e| CalibrateError::Probe(e.to_string()))?;
    let cfg = ExtConfig {
        violations: crate::policy::ViolationPolicy {
            k: u32::MAX,
            window: u32::MAX,
        },
        policy: sidecore_ext_verify::Policy {
            inflation: 1e9,
            ..Default::default()
        },
        ..ExtConfig::default()
    };
    let shared = Arc::new(vec![(
        "out".to_string(),
        Arc::<[u8]>::from(vec![7u8; 8192]),
    )]);
    let mut ext = WasmExtension::load(engine, &bytes, &cfg, &Calibration::fallback(), shared)
        .map_err(|e| CalibrateError::Probe(e.to_string()))?;
    for _ in 0..1000 {
        ext.invoke(0, &[])
            .map_err(|e| CalibrateError::Probe(e.to_string()))?;
    }
    let n = 2000 * effort.reps;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let o = ext
            .invoke(0, &[])
            .map_err(|e| CalibrateError::Probe(e.to_string()))?;
        v.push(o.cycles as f64);
    }
    Ok(median(&mut v))
}

/// mbench: average cycles per strided access (one new cache line per access) over a
/// working set of `ws` bytes, for writes and reads, and a dependent pointer chase.
pub fn mbench(ws: u64, effort: Effort) -> LatencyRow {
    const LINE: usize = 64;
    let lines = (ws as usize / LINE).max(2);
    let words = lines * LINE / 8;
    let mut buf = vec![0u64; words];
    let accesses = (1usize << 20).max(lines * 2) / if effort.reps > 5 { 1 } else { 4 };
    let passes = accesses.div_ceil(lines);
    let stride = LINE / 8;
    // writes
    let mut wv = Vec::new();
    let mut rv = Vec::new();
    for _ in 0..3 {
        let t0 = tsc::now();
        for p in 0..passes {
            for l in 0..lines {
                // SAFETY: `l * stride < words` because `lines * stride == words`.
                unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(l * stride), p as u64) };
            }
        }
        wv.push((tsc::now() - t0) as f64 / (passes * lines) as f64);
        let t0 = tsc::now();
        let mut s = 0u64;
        for _ in 0..passes {
            for l in 0..lines {
                // SAFETY: as above.
                s = s
                    .wrapping_add(unsafe { std::ptr::read_volatile(buf.as_ptr().add(l * stride)) });
            }
        }
        std::hint::black_box(s);
        rv.push((tsc::now() - t0) as f64 / (passes * lines) as f64);
    }
    // pointer chase over a random cyclic permutation of the lines (xorshift, fixed seed)
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = 0x9e3779b97f4a7c15u64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for w in 0..lines {
        buf[order[w] * stride] = order[(w + 1) % lines] as u64;
    }
    let steps = accesses.min(1 << 19);
    let t0 = tsc::now();
    let mut cur = order[0];
    for _ in 0..steps {
        // SAFETY: every stored index is a line index < lines.
        cur = unsafe { std::ptr::read_volatile(buf.as_ptr().add(cur * stride)) } as usize;
    }
    std::hint::black_box(cur);
    let chase = (tsc::now() - t0) as f64 / steps as f64;
    let r2 = |v: f64| (v * 100.0).round() / 100.0;
    LatencyRow {
        ws_bytes: ws,
        read_cycles: r2(median(&mut rv)),
        write_cycles: r2(median(&mut wv)),
        chase_cycles: r2(chase),
    }
}

fn machine_name() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("{cpu} on {host}, calibrated at unix time {secs}")
}
