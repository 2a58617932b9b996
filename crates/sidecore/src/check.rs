//! `sidecore check MANIFEST`: validates a manifest, its imports, and the
//! parameters, ports and interfaces (method names and types, against what
//! the implementation serves or calls) of the offcodes whose implementation
//! is built in.

use std::path::Path;
use std::process::ExitCode;

use sidecore_types::PeKind;

pub fn run(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let m = match sidecore_manifest::load(path) {
        Ok(m) => m,
        Err(e) => {
            eprint!("{}", e.render(crate::args::stderr_is_tty()));
            eprintln!(
                "{}: {} problem(s) found",
                path.display(),
                e.diagnostics.len()
            );
            return Ok(ExitCode::from(2));
        }
    };
    let reg = crate::args::registry();
    let mut problems = Vec::new();
    for oc in &m.offcodes {
        let native: Vec<_> = oc.targets.iter().filter(|t| t.module.is_none()).collect();
        if native.is_empty() {
            continue;
        }
        match reg.get(&oc.implementation) {
            None => problems.push(format!(
                "{}: offcode `{}`: the library has no implementation `{}` (known: {})",
                oc.origin,
                oc.name,
                oc.implementation,
                reg.iter()
                    .map(|i| i.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some(imp) => {
                if let Err(e) = imp.check_ports(&oc.inputs, &oc.outputs) {
                    problems.push(format!("{}: offcode `{}`: {e}", oc.origin, oc.name));
                }
                if let Some(v) = &imp.validate
                    && let Err(e) = v(&oc.params)
                {
                    let at = oc.params_origin.as_ref().unwrap_or(&oc.origin);
                    problems.push(format!("{at}: offcode `{}`: {e}", oc.name));
                }
                // A host target always works: the planner falls back to it.
                for t in native.iter().filter(|t| t.kind != PeKind::Host) {
                    if let Err(e) = imp.check_runs_on(t.kind) {
                        problems.push(format!("{}: offcode `{}`: {e}", t.origin, oc.name));
                    }
                }
            }
        }
    }
    problems.extend(
        sidecore_runtime::interfaces::check(&m, &reg)
            .iter()
            .map(ToString::to_string),
    );
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("error: {p}");
        }
        eprintln!("{}: {} problem(s) found", path.display(), problems.len());
        return Ok(ExitCode::from(2));
    }
    if json {
        let v = serde_json::json!({
            "app": m.app,
            "offcodes": m.offcodes.iter().map(|o| serde_json::json!({
                "name": o.name, "id": o.id.to_string(), "impl": o.implementation,
                "priority": o.priority, "targets": o.targets.iter().map(|t| t.kind).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "constraints": m.constraints.iter().map(|c| serde_json::json!({
                "kind": c.kind, "from": m.offcodes[c.from].name, "to": m.offcodes[c.to].name, "at": c.origin.to_string(),
            })).collect::<Vec<_>>(),
            "channels": m.channels.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
            "calls": m.calls.iter().map(|b| serde_json::json!({
                "caller": m.offcodes[b.caller].name, "provider": m.offcodes[b.provider].name,
                "interface": m.offcodes[b.provider].interfaces[b.interface].name,
                "methods": b.methods, "at": b.origin.to_string(),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "{}: ok — app `{}`: {} offcode(s), {} constraint(s), {} channel(s), {} call binding(s), {} file(s)",
            path.display(),
            m.app,
            m.offcodes.len(),
            m.constraints.len(),
            m.channels.len() - 2 * m.calls.len(),
            m.calls.len(),
            m.offcodes
                .iter()
                .map(|o| &o.file)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
