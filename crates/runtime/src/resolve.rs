//! Stage 2 of the pipeline, **resolve** (HYDRA §4.4, Figure 4.9's library
//! lookup): for every offcode and every target it declares, the PEs of that
//! kind whose properties satisfy the target's `require`, and for which the
//! library has an implementation (or, for an artifact such as a `.wasm`
//! module, a loader), become its candidates. If the implementation also runs
//! on `host`, the host is always a candidate: the fallback when no PE fits, by
//! capability or by capacity. The result is the layout problem, plus why each
//! offcode could not use the PEs it was not offered.

use serde::Serialize;
use sidecore_layout::{Candidate, ConstraintSpec, Flow, LinkCap, OffcodeSpec, PeSpec, Problem};
use sidecore_manifest::{Manifest, Offcode, Target};
use sidecore_offcode::{ImplError, Implementation, Registry};
use sidecore_pe::{Inventory, Pe};
use sidecore_types::PeKind;

use crate::error::PlanError;

/// Why an offcode could not use a PE.
#[derive(Debug, Clone, Serialize)]
pub struct Excluded {
    pub pe: String,
    pub why: String,
}

/// What resolving produced: the layout problem over the inventory's PEs (in
/// inventory order) and the manifest's offcodes (in manifest order), and for
/// each offcode the PEs it was refused, with the reason.
#[derive(Debug)]
pub struct Resolved<'a> {
    pub manifest: &'a Manifest,
    pub inventory: &'a Inventory,
    pub registry: &'a Registry,
    pub problem: Problem,
    pub excluded: Vec<Vec<Excluded>>,
}

impl Resolved<'_> {
    /// Holds offcode `name` to PE `pe`: its other candidates (the host's
    /// fallback included) are dropped. False, and nothing changes, when `pe`
    /// is not one of its candidates (gone, full of other things, or never
    /// allowed).
    pub fn hold(&mut self, name: &str, pe: &str) -> bool {
        let Some(at) = self.inventory.pes.iter().position(|p| p.id == pe) else {
            return false;
        };
        let Some(o) = self.problem.offcodes.iter_mut().find(|o| o.name == name) else {
            return false;
        };
        if !o.candidates.iter().any(|c| c.pe == at) {
            return false;
        }
        o.candidates.retain(|c| c.pe == at);
        true
    }
}

/// The implementation an offcode uses on a PE of `kind`: the library's
/// implementation by name, or for an artifact (`module = ...`) the loader of
/// that kind.
pub fn implementation<'r>(
    registry: &'r Registry,
    oc: &Offcode,
    kind: PeKind,
    has_module: bool,
) -> Result<&'r Implementation, ImplError> {
    if has_module {
        // A Wasm sandbox may run on a dedicated core, sharing it with the
        // offcodes there (the wasm loader runs on `core` too).
        return registry
            .lookup(&Registry::loader_name(kind), kind)
            .or_else(|| registry.lookup(&Registry::loader_name(PeKind::Wasm), kind))
            .ok_or(ImplError::NoLoader(kind));
    }
    let i = registry
        .get(&oc.implementation)
        .ok_or_else(|| ImplError::Unknown(oc.implementation.clone()))?;
    i.check_runs_on(kind)?;
    Ok(i)
}

/// Resolves every offcode of `manifest` against the PEs of `inventory`.
pub fn resolve<'a>(
    manifest: &'a Manifest,
    inventory: &'a Inventory,
    registry: &'a Registry,
) -> Result<Resolved<'a>, PlanError> {
    if let Some(p) = crate::interfaces::check(manifest, registry)
        .into_iter()
        .next()
    {
        return Err(PlanError::Offcode {
            offcode: p.offcode,
            origin: p.origin,
            problem: p.problem,
        });
    }
    let mut offcodes = Vec::new();
    let mut excluded = Vec::new();
    for oc in &manifest.offcodes {
        let (candidates, refused) = candidates(oc, inventory, registry);
        if candidates.is_empty() {
            return Err(no_candidate(oc, &refused));
        }
        offcodes.push(OffcodeSpec {
            name: oc.name.clone(),
            weight: oc.priority.weight(),
            candidates,
        });
        excluded.push(refused);
    }
    Ok(Resolved {
        manifest,
        inventory,
        registry,
        problem: Problem {
            pes: inventory.pes.iter().map(pe_spec).collect(),
            offcodes,
            constraints: constraints(manifest),
            flows: flows(manifest),
            links: links(inventory),
        },
        excluded,
    })
}

fn pe_spec(p: &Pe) -> PeSpec {
    PeSpec {
        id: p.id.clone(),
        kind: p.kind,
        cpu: p.capacity.cpu,
        memory_bytes: p.capacity.memory_bytes,
        slots: p.capacity.slots,
    }
}

/// An offcode's can-run row, and the PEs it was refused with why.
fn candidates(
    oc: &Offcode,
    inventory: &Inventory,
    registry: &Registry,
) -> (Vec<Candidate>, Vec<Excluded>) {
    let mut candidates = Vec::new();
    let mut refused = Vec::new();
    let mut host_impl_declared = false;
    for t in &oc.targets {
        let imp = implementation(registry, oc, t.kind, t.module.is_some());
        if t.kind == PeKind::Host {
            host_impl_declared = imp.is_ok();
        }
        let mut of_kind = inventory
            .pes
            .iter()
            .enumerate()
            .filter(|(_, p)| p.kind == t.kind)
            .peekable();
        if of_kind.peek().is_none() {
            refused.push(absent(inventory, t.kind));
            continue;
        }
        for (i, pe) in of_kind {
            match (&imp, pe.satisfies(&t.require)) {
                (Err(e), _) => refused.push(Excluded {
                    pe: pe.id.clone(),
                    why: e.to_string(),
                }),
                (Ok(_), Err(e)) => refused.push(Excluded {
                    pe: pe.id.clone(),
                    why: e.to_string(),
                }),
                (Ok(_), Ok(())) => candidates.push(candidate(oc, Some(t), i)),
            }
        }
    }
    // Host fallback: the implementation runs on the host even if the manifest
    // did not list it.
    if let Some(h) = inventory.pes.iter().position(|p| p.kind == PeKind::Host)
        && !candidates.iter().any(|c| c.pe == h)
        && !host_impl_declared
        && registry.lookup(&oc.implementation, PeKind::Host).is_some()
        && oc.targets.iter().all(|t| t.module.is_none())
    {
        candidates.push(candidate(oc, None, h));
    }
    (candidates, refused)
}

/// The offcode's demand on PE `pe`, with the target's overrides.
fn candidate(oc: &Offcode, target: Option<&Target>, pe: usize) -> Candidate {
    Candidate {
        pe,
        cpu: target.and_then(|t| t.cpu).unwrap_or(oc.cpu),
        memory_bytes: target.and_then(|t| t.memory).unwrap_or(oc.memory),
    }
}

/// Why no PE of `kind` was offered.
fn absent(inventory: &Inventory, kind: PeKind) -> Excluded {
    let why = inventory
        .absent
        .iter()
        .filter(|a| a.kind == kind)
        .map(|a| a.reason.clone())
        .collect::<Vec<_>>()
        .join("; ");
    Excluded {
        pe: kind.to_string(),
        why: if why.is_empty() {
            format!("this machine has no {kind} PE")
        } else {
            why
        },
    }
}

fn no_candidate(oc: &Offcode, refused: &[Excluded]) -> PlanError {
    let why: Vec<String> = refused
        .iter()
        .map(|e| format!("{}: {}", e.pe, e.why))
        .collect();
    PlanError::Offcode {
        offcode: oc.name.clone(),
        origin: oc.origin.to_string(),
        problem: format!(
            "no PE can run it and no host implementation exists ({})",
            if why.is_empty() {
                "no targets".into()
            } else {
                why.join("; ")
            }
        ),
    }
}

fn constraints(manifest: &Manifest) -> Vec<ConstraintSpec> {
    manifest
        .constraints
        .iter()
        .map(|c| ConstraintSpec {
            kind: c.kind,
            a: c.from,
            b: c.to,
            origin: c.origin.to_string(),
        })
        .collect()
}

/// The declared bandwidth of each PE's link to the host, as a cap on the flows
/// between them (HYDRA's B_kl).
fn links(inventory: &Inventory) -> Vec<LinkCap> {
    let Some(host) = inventory.pes.iter().position(|p| p.kind == PeKind::Host) else {
        return Vec::new();
    };
    inventory
        .pes
        .iter()
        .enumerate()
        .filter_map(|(k, p)| {
            Some(LinkCap {
                a: host,
                b: k,
                bandwidth_bps: p.link?.bps_f64(),
                origin: format!("the declared link of {}", p.id),
            })
        })
        .collect()
}

/// One flow per (sender, receiver) pair of every channel between two offcodes.
fn flows(manifest: &Manifest) -> Vec<Flow> {
    let mut flows = Vec::new();
    for ch in &manifest.channels {
        for t in ch.to.iter().filter(|t| t.offcode != ch.from.offcode) {
            flows.push(Flow {
                a: ch.from.offcode,
                b: t.offcode,
                bandwidth_bps: ch.bandwidth.bps_f64(),
                origin: ch.origin.to_string(),
            });
        }
    }
    flows
}
