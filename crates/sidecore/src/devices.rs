//! `sidecore devices`: the processing elements this machine offers, and the
//! kinds it does not offer with the reason.

use std::process::ExitCode;

use sidecore_offcode::Registry;
use sidecore_types::PeKind;

use crate::args::{PeArgs, bytes, discover_options, registry};

/// What this build can run on a PE of `kind`: its native implementations and
/// the artifacts it has a loader for. Empty: nothing can be placed there.
pub fn loads(reg: &Registry, kind: PeKind) -> Vec<String> {
    let mut v: Vec<String> = reg
        .iter()
        .filter(|i| !i.name.starts_with("loader:") && i.runs_on(kind))
        .map(|i| i.name.clone())
        .collect();
    if reg.lookup(&Registry::loader_name(kind), kind).is_some() {
        v.push(format!("{kind} modules"));
    }
    v
}

pub fn run(pe: &PeArgs, json: bool) -> anyhow::Result<ExitCode> {
    let inv = sidecore_pe::discover(&discover_options(pe)?);
    let reg = registry();
    if json {
        let mut v = serde_json::to_value(&inv)?;
        for (p, j) in inv.pes.iter().zip(
            v["pes"]
                .as_array_mut()
                .map(|a| a.iter_mut())
                .into_iter()
                .flatten(),
        ) {
            j["loads"] = serde_json::json!(loads(&reg, p.kind));
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<12} {:<7} {:>6} {:>10}  DETAIL",
        "PE", "KIND", "CPU", "MEMORY"
    );
    for p in &inv.pes {
        let cpu = if p.kind == sidecore_types::PeKind::Host {
            "shared".to_string()
        } else {
            format!("{:.1}", p.capacity.cpu)
        };
        println!(
            "{:<12} {:<7} {:>6} {:>10}  {}",
            p.id,
            p.kind.to_string(),
            cpu,
            bytes(p.capacity.memory_bytes),
            p.detail
        );
        let l = loads(&reg, p.kind);
        println!(
            "{:<12} loads: {}",
            "",
            if l.is_empty() {
                "nothing this build can place here yet".to_string()
            } else {
                l.join(", ")
            }
        );
    }
    if !inv.not_dedicatable.is_empty() {
        println!("\nCPUs not dedicatable:");
        for (cpu, why) in &inv.not_dedicatable {
            println!("  CPU {cpu}: {why}");
        }
    }
    if !inv.absent.is_empty() {
        println!("\nabsent:");
        for a in &inv.absent {
            println!("  {:<7} {}", a.kind.to_string(), a.reason);
        }
    }
    Ok(ExitCode::SUCCESS)
}
