//! Planning: from a manifest, the machine's PEs and the offcode library to a
//! deployable plan (HYDRA §4.4, Figure 4.9).
//!
//! 1. **Library lookup.** For every offcode and every target it declares, the
//!    PEs of that kind whose properties satisfy the target's `require`, and for
//!    which the library has an implementation (or, for an artifact such as a
//!    `.wasm` module, a loader), become its candidates. If the implementation
//!    also runs on `host`, the host is always a candidate: the fallback when no
//!    PE fits, by capability or by capacity.
//! 2. **Layout.** The candidates, constraints, capacities and channel
//!    bandwidths go to the MILP solver (`sidecore-layout`).
//! 3. **Channels.** Each channel gets a transport from where its ends landed
//!    (HYDRA's channel executive choosing a provider).
//! 4. **Groups.** Offcodes joined by imports or channels are "related": they
//!    start together once all of them are initialized.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use sidecore_layout::{
    Candidate, ConstraintSpec, Flow, Layout, LayoutError, OffcodeSpec, PeSpec, Problem,
    SolveOptions,
};
use sidecore_manifest::Manifest;
use sidecore_offcode::{Implementation, Registry};
use sidecore_pe::Inventory;
use sidecore_types::{ChannelProps, Order, PeKind, Priority};

/// Why an offcode could not use a PE.
#[derive(Debug, Clone, Serialize)]
pub struct Excluded {
    pub pe: String,
    pub why: String,
}

/// An offcode with its place and implementation.
#[derive(Debug, Clone)]
pub struct PlannedOffcode {
    pub name: String,
    pub implementation: Implementation,
    pub pe: String,
    pub pe_kind: PeKind,
    /// The CPU to pin to, for `core` PEs.
    pub cpu: Option<u32>,
    pub priority: Priority,
    pub watchdog: Option<Duration>,
    pub obsolete: Option<Duration>,
    pub params: toml::Table,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub module: Option<PathBuf>,
    /// Why it went there (from the layout).
    pub reason: String,
    /// Set when it runs on the host although it declared other targets: why.
    pub fallback: Option<String>,
    /// PEs it could not use, and why.
    pub excluded: Vec<Excluded>,
}

/// How a channel's messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// Shared-memory ring (unicast or multicast) in this daemon.
    Ring,
    /// Shared-memory work queue: each message to one receiver.
    WorkQueue,
    /// TCP stream to a peer node.
    Stream,
}

/// A channel with its transport.
#[derive(Debug, Clone)]
pub struct PlannedChannel {
    pub name: String,
    /// (offcode, output port index).
    pub from: (usize, usize),
    /// (offcode, input port index) per receiver.
    pub to: Vec<(usize, usize)>,
    pub props: ChannelProps,
    pub transport: Transport,
}

/// A deployable plan.
#[derive(Debug, Clone)]
pub struct Plan {
    pub app: String,
    pub offcodes: Vec<PlannedOffcode>,
    pub channels: Vec<PlannedChannel>,
    /// Related offcodes (connected by imports or channels).
    pub groups: Vec<Vec<usize>>,
    pub layout: Layout,
    /// Node-port address of each peer node PE (by PE id) that offcodes landed on.
    pub nodes: BTreeMap<String, String>,
}

impl Plan {
    /// Offcode indices in deployment order: highest priority first, then
    /// manifest order.
    pub fn deployment_order(&self) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.offcodes.len()).collect();
        v.sort_by_key(|&i| (std::cmp::Reverse(self.offcodes[i].priority), i));
        v
    }
}

/// Why planning failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("offcode `{offcode}` ({origin}): {problem}")]
    Offcode {
        offcode: String,
        origin: String,
        problem: String,
    },
    #[error("no layout satisfies the manifest: {0}")]
    Layout(#[from] LayoutError),
}

fn impl_for<'r>(
    registry: &'r Registry,
    oc: &sidecore_manifest::Offcode,
    kind: PeKind,
    has_module: bool,
) -> Result<&'r Implementation, String> {
    if has_module {
        let loader = Registry::loader_name(kind);
        return registry
            .lookup(&loader, kind)
            .ok_or_else(|| format!("this sidecore has no loader for {kind} modules"));
    }
    let i = registry
        .get(&oc.implementation)
        .ok_or_else(|| format!("the library has no implementation `{}`", oc.implementation))?;
    i.check_runs_on(kind)?;
    Ok(i)
}

/// Builds the layout problem and solves it into a plan.
pub fn plan(
    manifest: &Manifest,
    inventory: &Inventory,
    registry: &Registry,
    opts: &SolveOptions,
) -> Result<Plan, PlanError> {
    let pes: Vec<PeSpec> = inventory
        .pes
        .iter()
        .map(|p| PeSpec {
            id: p.id.clone(),
            kind: p.kind,
            cpu: p.capacity.cpu,
            memory: p.capacity.memory,
            slots: p.capacity.slots,
        })
        .collect();
    let host = inventory.pes.iter().position(|p| p.kind == PeKind::Host);

    let mut specs = Vec::new();
    let mut excluded_all = Vec::new();
    for oc in &manifest.offcodes {
        let mut candidates = Vec::new();
        let mut excluded = Vec::new();
        let mut host_impl_declared = false;
        for t in &oc.targets {
            let impl_ok = impl_for(registry, oc, t.kind, t.module.is_some());
            if t.kind == PeKind::Host {
                host_impl_declared = impl_ok.is_ok();
            }
            let of_kind: Vec<(usize, &sidecore_pe::Pe)> = inventory
                .pes
                .iter()
                .enumerate()
                .filter(|(_, p)| p.kind == t.kind)
                .collect();
            if of_kind.is_empty() {
                let why = inventory
                    .absent
                    .iter()
                    .filter(|a| a.kind == t.kind)
                    .map(|a| a.reason.clone())
                    .collect::<Vec<_>>()
                    .join("; ");
                excluded.push(Excluded {
                    pe: t.kind.to_string(),
                    why: if why.is_empty() {
                        format!("this machine has no {} PE", t.kind)
                    } else {
                        why
                    },
                });
                continue;
            }
            for (i, pe) in of_kind {
                if let Err(e) = &impl_ok {
                    excluded.push(Excluded {
                        pe: pe.id.clone(),
                        why: e.clone(),
                    });
                    continue;
                }
                if let Err(e) = pe.satisfies(&t.require) {
                    excluded.push(Excluded {
                        pe: pe.id.clone(),
                        why: e,
                    });
                    continue;
                }
                candidates.push(Candidate {
                    pe: i,
                    cpu: t.cpu.unwrap_or(oc.cpu),
                    memory: t.memory.unwrap_or(oc.memory),
                });
            }
        }
        // Host fallback: the implementation runs on the host even if the
        // manifest did not list it.
        if let Some(h) = host
            && !candidates.iter().any(|c| c.pe == h)
            && !host_impl_declared
            && registry.lookup(&oc.implementation, PeKind::Host).is_some()
            && oc.targets.iter().all(|t| t.module.is_none())
        {
            candidates.push(Candidate {
                pe: h,
                cpu: oc.cpu,
                memory: oc.memory,
            });
        }
        if candidates.is_empty() {
            let why: Vec<String> = excluded
                .iter()
                .map(|e| format!("{}: {}", e.pe, e.why))
                .collect();
            return Err(PlanError::Offcode {
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
            });
        }
        specs.push(OffcodeSpec {
            name: oc.name.clone(),
            weight: oc.priority.weight(),
            candidates,
        });
        excluded_all.push(excluded);
    }

    let constraints = manifest
        .constraints
        .iter()
        .map(|c| ConstraintSpec {
            kind: c.kind,
            a: c.from,
            b: c.to,
            origin: c.origin.to_string(),
        })
        .collect();
    let mut flows = Vec::new();
    for ch in &manifest.channels {
        for t in &ch.to {
            if t.offcode != ch.from.offcode {
                flows.push(Flow {
                    a: ch.from.offcode,
                    b: t.offcode,
                    bandwidth: ch.bandwidth_mbps,
                    origin: ch.origin.to_string(),
                });
            }
        }
    }
    let problem = Problem {
        pes,
        offcodes: specs,
        constraints,
        flows,
    };
    let layout = sidecore_layout::solve(&problem, opts)?;

    let mut offcodes = Vec::new();
    for (i, oc) in manifest.offcodes.iter().enumerate() {
        let pe = &inventory.pes[layout.assignment[i]];
        let target = oc.target(pe.kind);
        let module = target.and_then(|t| t.module.clone());
        let implementation = impl_for(registry, oc, pe.kind, module.is_some())
            .map_err(|problem| PlanError::Offcode {
                offcode: oc.name.clone(),
                origin: oc.origin.to_string(),
                problem,
            })?
            .clone();
        implementation
            .check_ports(&oc.inputs, &oc.outputs)
            .map_err(|problem| PlanError::Offcode {
                offcode: oc.name.clone(),
                origin: oc.origin.to_string(),
                problem,
            })?;
        let declared_non_host = oc.targets.iter().any(|t| t.kind != PeKind::Host);
        let fallback = (pe.kind == PeKind::Host && declared_non_host).then(|| {
            let mut why: Vec<String> = excluded_all[i]
                .iter()
                .map(|e| format!("{}: {}", e.pe, e.why))
                .collect();
            why.push(layout.reasons[i].to_string());
            why.join("; ")
        });
        let cpu = match pe.props.get("cpu") {
            Some(sidecore_types::PropValue::Int(c)) if pe.kind == PeKind::Core => Some(*c as u32),
            _ => None,
        };
        offcodes.push(PlannedOffcode {
            name: oc.name.clone(),
            implementation,
            pe: pe.id.clone(),
            pe_kind: pe.kind,
            cpu,
            priority: oc.priority,
            watchdog: oc.watchdog,
            obsolete: oc.obsolete,
            params: oc.params.clone(),
            inputs: oc.inputs.clone(),
            outputs: oc.outputs.clone(),
            module,
            reason: layout.reasons[i].to_string(),
            fallback,
            excluded: excluded_all[i].clone(),
        });
    }

    let mut channels = Vec::new();
    for ch in &manifest.channels {
        let port_of = |oc: usize, port: &str, outputs: bool| {
            let list = if outputs {
                &offcodes[oc].outputs
            } else {
                &offcodes[oc].inputs
            };
            list.iter()
                .position(|p| p == port)
                .expect("validated by the manifest")
        };
        let on_node = |oc: usize| offcodes[oc].pe_kind == PeKind::Node;
        let remote = on_node(ch.from.offcode) || ch.to.iter().any(|t| on_node(t.offcode));
        let transport = if remote {
            Transport::Stream
        } else if ch.props.order == Order::Parallel {
            Transport::WorkQueue
        } else {
            Transport::Ring
        };
        channels.push(PlannedChannel {
            name: ch.name.clone(),
            from: (
                ch.from.offcode,
                port_of(ch.from.offcode, &ch.from.port, true),
            ),
            to: ch
                .to
                .iter()
                .map(|t| (t.offcode, port_of(t.offcode, &t.port, false)))
                .collect(),
            props: ch.props,
            transport,
        });
    }

    let nodes = offcodes
        .iter()
        .filter(|o| o.pe_kind == PeKind::Node)
        .filter_map(|o| {
            let pe = inventory.pes.iter().find(|p| p.id == o.pe)?;
            match pe.props.get("addr") {
                Some(sidecore_types::PropValue::Str(a)) => Some((o.pe.clone(), a.clone())),
                _ => None,
            }
        })
        .collect();
    Ok(Plan {
        app: manifest.app.clone(),
        groups: groups(manifest),
        offcodes,
        channels,
        layout,
        nodes,
    })
}

/// Connected components of the import and channel graph.
fn groups(m: &Manifest) -> Vec<Vec<usize>> {
    let n = m.offcodes.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], x: usize) -> usize {
        let mut r = x;
        while p[r] != r {
            r = p[r];
        }
        let mut y = x;
        while p[y] != r {
            let next = p[y];
            p[y] = r;
            y = next;
        }
        r
    }
    let mut join = |a: usize, b: usize| {
        let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
        if ra != rb {
            parent[ra.max(rb)] = ra.min(rb);
        }
    };
    for c in &m.constraints {
        join(c.from, c.to);
    }
    for ch in &m.channels {
        for t in &ch.to {
            join(ch.from.offcode, t.offcode);
        }
    }
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut root_of = std::collections::BTreeMap::new();
    for i in 0..n {
        let r = find(&mut parent, i);
        let g = *root_of.entry(r).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[g].push(i);
    }
    out
}
