//! `sidecore layout MANIFEST`: plans the manifest on this machine and prints
//! where each offcode goes and why (or, if nothing fits, the small set of
//! constraints that conflict).

use std::path::Path;
use std::process::ExitCode;

use crate::args::{PeArgs, discover_options};

pub fn run(path: &Path, pe: &PeArgs, json: bool) -> anyhow::Result<ExitCode> {
    let m = match sidecore_manifest::load(path) {
        Ok(m) => m,
        Err(e) => {
            eprint!("{}", e.render(crate::args::stderr_is_tty()));
            return Ok(ExitCode::from(2));
        }
    };
    let spin = crate::progress::Progress::spinner("probing PEs and solving the layout");
    let inv = sidecore_pe::discover(&discover_options(pe)?);
    let reg = crate::args::registry();
    let planned =
        sidecore_runtime::plan_manifest(&m, &inv, &reg, &sidecore_layout::SolveOptions::default());
    drop(spin);
    let plan = match planned {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(3));
        }
    };
    if json {
        let v = serde_json::json!({
            "app": plan.app,
            "placements": plan.offcodes.iter().map(|o| serde_json::json!({
                "offcode": o.name, "pe": o.pe, "kind": o.pe_kind, "impl": o.implementation.name,
                "reason": o.reason, "fallback": o.fallback, "excluded": o.excluded,
            })).collect::<Vec<_>>(),
            "channels": plan.channels.iter().map(|c| serde_json::json!({
                "name": c.name, "transport": c.transport,
            })).collect::<Vec<_>>(),
            "offloaded_weight": plan.layout.offloaded_weight,
            "cross_pe_bandwidth_bps": plan.layout.cross_bandwidth,
            "solve_ms": plan.layout.stats.time.as_secs_f64() * 1e3,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "layout of `{}` ({} offcodes on {} PEs):",
        plan.app,
        plan.offcodes.len(),
        inv.pes.len()
    );
    for o in &plan.offcodes {
        println!("  {:<16} → {:<10} {}", o.name, o.pe, o.reason);
        if let Some(f) = &o.fallback {
            println!("  {:<16}   fallback to host: {f}", "");
        }
        for e in &o.excluded {
            println!("  {:<16}   not {}: {}", "", e.pe, e.why);
        }
    }
    for c in &plan.channels {
        println!("  channel {:<12} {:?}", c.name, c.transport);
    }
    println!(
        "offloaded weight {}, cross-PE bandwidth {}, solved in {:.1} ms",
        plan.layout.offloaded_weight,
        // Whole bits per second: the sum of the flows' estimates.
        sidecore_types::Bandwidth::from_bps(plan.layout.cross_bandwidth.round() as u64),
        plan.layout.stats.time.as_secs_f64() * 1e3
    );
    Ok(ExitCode::SUCCESS)
}
