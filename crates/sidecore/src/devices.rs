//! `sidecore devices`: the processing elements this machine offers, and the
//! kinds it does not offer with the reason.

use std::process::ExitCode;

use crate::args::{PeArgs, bytes, discover_options};

pub fn run(pe: &PeArgs, json: bool) -> anyhow::Result<ExitCode> {
    let inv = sidecore_pe::discover(&discover_options(pe)?);
    if json {
        println!("{}", serde_json::to_string_pretty(&inv)?);
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
