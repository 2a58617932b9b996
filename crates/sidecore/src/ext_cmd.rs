//! Command-line surface, mounted by the `sidecore` binary:
//! `sidecore ext check MODULE.wasm`, `sidecore ext run MODULE.wasm`, and
//! `sidecore calibrate`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use sidecore_ext::verify::{Policy, verify};

use sidecore_ext::calibrate::{self, Effort};
use sidecore_ext::ext::{ExecMode, ExtConfig, ExtEngine, WasmExtension};
use sidecore_ext::files::{load_calibration, read_module};

/// Work with untrusted Wasm extensions.
#[derive(Debug, Args)]
pub struct ExtCommand {
    #[command(subcommand)]
    pub cmd: ExtSub,
}

#[derive(Debug, Subcommand)]
pub enum ExtSub {
    /// Verify a module and print its admission report (exit status 1 if rejected).
    Check(CheckArgs),
    /// Admit a module and run its handler over inputs, reporting accounting.
    Run(RunArgs),
}

/// Admission parameters shared by `check` and `run`.
#[derive(Debug, Args, Clone)]
pub struct AdmitArgs {
    /// The module (.wasm, or .wat text).
    pub module: PathBuf,
    /// Acceptable limit: minimum inter-arrival time of the input served, ns.
    #[arg(long, value_name = "NS", default_value_t = 1230.0)]
    pub min_interarrival_ns: f64,
    /// Inflation factor: admit if bound ≤ limit × factor.
    #[arg(long, default_value_t = 64.0)]
    pub inflation: f64,
    /// Deployment symbol for declared bounds, e.g. `--symbol MTU=9000` (repeatable).
    #[arg(long = "symbol", value_name = "NAME=VALUE")]
    pub symbols: Vec<String>,
    /// Calibration file (default: $SIDECORE_CALIBRATION or ~/.config/sidecore/calibration.json).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub admit: AdmitArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the module sidecore would run (instrumented if needed) here.
    #[arg(long, value_name = "PATH")]
    pub emit: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub admit: AdmitArgs,
    /// Handler to call.
    #[arg(long, default_value = "handle")]
    pub handler: String,
    /// Input buffer as hex (repeatable); default one 64-byte zero buffer.
    #[arg(long = "input-hex")]
    pub inputs: Vec<String>,
    /// Invoke this many times per input.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Execution mode.
    /// `hybrid`, `unchecked`, `fuel` or `epoch`.
    #[arg(long, default_value = "hybrid", value_parser = parse_mode)]
    pub mode: ExecMode,
}

/// Measure this machine's cost model and save it.
#[derive(Debug, Args)]
pub struct CalibrateCommand {
    /// Output file (default: $SIDECORE_CALIBRATION or ~/.config/sidecore/calibration.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A faster, noisier run.
    #[arg(long)]
    pub quick: bool,
}

fn policy(a: &AdmitArgs) -> anyhow::Result<Policy> {
    let mut p = Policy::default();
    if a.min_interarrival_ns.is_nan() || a.min_interarrival_ns <= 0.0 {
        anyhow::bail!(
            "--min-interarrival-ns must be positive, got {}",
            a.min_interarrival_ns
        );
    }
    if a.inflation.is_nan() || a.inflation < 1.0 {
        anyhow::bail!("--inflation must be at least 1, got {}", a.inflation);
    }
    p.acceptable_limit_ns = a.min_interarrival_ns;
    p.inflation = a.inflation;
    for s in &a.symbols {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--symbol `{s}`: expected NAME=VALUE"))?;
        let v: u64 = v.parse().map_err(|_| {
            anyhow::anyhow!("--symbol `{s}`: value `{v}` is not a non-negative integer")
        })?;
        p.symbols.insert(k.to_string(), v);
    }
    Ok(p)
}

impl ExtCommand {
    /// Runs the command; returns the process exit status.
    pub fn run(&self) -> anyhow::Result<i32> {
        match &self.cmd {
            ExtSub::Check(c) => check(c),
            ExtSub::Run(r) => run(r),
        }
    }
}

fn check(c: &CheckArgs) -> anyhow::Result<i32> {
    let bytes = read_module(&c.admit.module)?;
    let (cal, src) = load_calibration(c.admit.calibration.as_deref())?;
    let p = policy(&c.admit)?;
    match verify(&bytes, &p, &cal) {
        Ok(a) => {
            if c.json {
                println!("{}", serde_json::to_string_pretty(&a)?);
            } else {
                println!(
                    "{}: ADMITTED (calibration: {src})",
                    c.admit.module.display()
                );
                print!("{}", a.report);
            }
            if let Some(out) = &c.emit {
                std::fs::write(out, &a.module)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
            }
            Ok(0)
        }
        Err(r) => {
            if c.json {
                let reasons: Vec<serde_json::Value> = r
                    .reasons
                    .iter()
                    .map(|x| serde_json::json!({"kind": x.kind(), "message": x.to_string()}))
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"admitted": false, "reasons": reasons, "report": r.report})
                );
            } else {
                println!(
                    "{}: REJECTED (calibration: {src})",
                    c.admit.module.display()
                );
                print!("{r}");
            }
            Ok(1)
        }
    }
}

fn parse_hex(s: &str) -> anyhow::Result<Vec<u8>> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if !s.len().is_multiple_of(2) {
        anyhow::bail!("--input-hex: odd number of hex digits");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| {
                anyhow::anyhow!("--input-hex: `{}` at position {i} is not hex", &s[i..i + 2])
            })
        })
        .collect()
}

fn run(r: &RunArgs) -> anyhow::Result<i32> {
    let bytes = read_module(&r.admit.module)?;
    let (cal, _) = load_calibration(r.admit.calibration.as_deref())?;
    let cfg = ExtConfig {
        policy: policy(&r.admit)?,
        mode: r.mode,
        ..ExtConfig::default()
    };
    let engine = ExtEngine::new(
        r.mode,
        cfg.policy.max_stack_bytes,
        Duration::from_micros(cfg.epoch_tick_us),
    )?;
    let mut ext = match WasmExtension::load(&engine, &bytes, &cfg, &cal, Arc::new(Vec::new())) {
        Ok(e) => e,
        Err(e) => {
            println!("{e}");
            return Ok(1);
        }
    };
    let h = ext.handler(&r.handler).ok_or_else(|| {
        anyhow::anyhow!(
            "no handler `{}`; the module has: {:?}",
            r.handler,
            ext.handler_names()
        )
    })?;
    let inputs: Vec<Vec<u8>> = if r.inputs.is_empty() {
        vec![vec![0u8; 64]]
    } else {
        r.inputs
            .iter()
            .map(|s| parse_hex(s))
            .collect::<anyhow::Result<_>>()?
    };
    let bound = ext
        .admission
        .entry(&r.handler)
        .map(|e| e.bound_cycles)
        .unwrap_or(0.0);
    for input in &inputs {
        for _ in 0..r.repeat {
            match ext.invoke(h, input) {
                Ok(o) => {
                    println!(
                        "status {} cycles {} (bound {:.0}, limit {}) violated {}{}",
                        o.status,
                        o.cycles,
                        bound,
                        ext.limit_cycles(),
                        o.violated,
                        o.trap
                            .as_ref()
                            .map(|t| format!(" trap: {t}"))
                            .unwrap_or_default()
                    );
                    for (out, bytes) in ext.emitted() {
                        println!("  output {out}: {} bytes", bytes.len());
                    }
                    if o.unloaded {
                        println!(
                            "unloaded: {}",
                            ext.unload_reason()
                                .map(std::string::ToString::to_string)
                                .unwrap_or_default()
                        );
                        return Ok(2);
                    }
                }
                Err(e) => {
                    println!("{e}");
                    return Ok(2);
                }
            }
        }
    }
    Ok(0)
}

impl CalibrateCommand {
    pub fn run(&self) -> anyhow::Result<i32> {
        let out = self.out.clone().unwrap_or_else(calibrate::default_path);
        let spin = crate::progress::Progress::spinner(
            "calibrating: timing operator classes, memory and invocations",
        );
        let cal = calibrate::calibrate(if self.quick {
            Effort::QUICK
        } else {
            Effort::FULL
        })?;
        drop(spin);
        // The message names the file and ends with the cause: printed flat, as before.
        calibrate::save(&cal, &out).map_err(|e| anyhow::anyhow!("{e}"))?;
        println!(
            "calibration of {} written to {}",
            cal.machine,
            out.display()
        );
        println!(
            "TSC: {:.3} ticks/ns; accounted invocation: {:.0} cycles",
            cal.tsc_per_ns, cal.invoke_cycles
        );
        println!("cycles per operator class:");
        for (c, v) in &cal.class_cycles {
            println!("  {c:?}: {v}");
        }
        println!(
            "host calls (base cycles; +{} per byte):",
            cal.host_per_byte_cycles
        );
        for (h, v) in &cal.host_base_cycles {
            println!("  {h}: {v}");
        }
        println!("memory latency by working set (cycles per access; Tables 3.1/5.1):");
        println!("  {:>10} {:>8} {:>8} {:>8}", "ws", "read", "write", "chase");
        for r in &cal.latency {
            println!(
                "  {:>9}K {:>8} {:>8} {:>8}",
                r.ws_bytes >> 10,
                r.read_cycles,
                r.write_cycles,
                r.chase_cycles
            );
        }
        Ok(0)
    }
}

/// An execution mode by its name (the names the manifest's `mode` uses).
fn parse_mode(s: &str) -> Result<ExecMode, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("`{s}` is not an execution mode (hybrid, unchecked, fuel or epoch)"))
}
