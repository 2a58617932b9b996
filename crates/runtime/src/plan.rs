//! Stage 4 of the pipeline, **plan**: from a placed manifest to a deployable
//! [`Plan`] (HYDRA §4.4, Figure 4.9).
//!
//! * **Offcodes.** Each gets the implementation for the PE it landed on (the
//!   library's, or the artifact loader of that kind), its pinned CPU for a
//!   `core` PE, and why it went there (from the layout), including why it fell
//!   back to the host when it declared other targets.
//! * **Channels.** Each gets a transport from where its ends landed
//!   ([`Transport::choose`]).
//! * **Groups.** Offcodes joined by imports or channels are "related": they
//!   start together once all of them are initialized.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sidecore_layout::Layout;
use sidecore_manifest::{Channel, Manifest, Timing};
use sidecore_offcode::Implementation;
use sidecore_types::calls::CallPortSpec;
use sidecore_types::{ChannelProps, PeKind, Priority, PropValue, RestartPolicy, SchedPolicy};

use crate::error::PlanError;
use crate::place::Placed;
use crate::resolve::{self, Excluded};
use crate::transport::Transport;

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
    /// What the supervisor does when it fails.
    pub restart: RestartPolicy,
    pub params: toml::Table,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// The call bindings it takes part in, with their port indices.
    pub calls: Vec<CallPortSpec>,
    /// Its period and worst-case turn, for a shared core's scheduler.
    pub timing: Timing,
    pub module: Option<PathBuf>,
    /// Why it went there (from the layout).
    pub reason: String,
    /// Set when it runs on the host although it declared other targets: why.
    pub fallback: Option<String>,
    /// PEs it could not use, and why.
    pub excluded: Vec<Excluded>,
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
    /// How each dedicated core shares its time among the offcodes on it.
    pub scheduler: SchedPolicy,
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

/// Turns a placed manifest into a plan.
pub fn plan(placed: &Placed<'_>) -> Result<Plan, PlanError> {
    let manifest = placed.resolved.manifest;
    let offcodes = manifest
        .offcodes
        .iter()
        .enumerate()
        .map(|(i, _)| planned_offcode(placed, i))
        .collect::<Result<Vec<_>, _>>()?;
    let channels = manifest
        .channels
        .iter()
        .map(|ch| planned_channel(ch, &offcodes))
        .collect();
    let inventory = placed.resolved.inventory;
    let nodes = offcodes
        .iter()
        .filter(|o| o.pe_kind == PeKind::Node)
        .filter_map(|o| match inventory.get(&o.pe)?.props.get("addr") {
            Some(PropValue::Str(a)) => Some((o.pe.clone(), a.clone())),
            _ => None,
        })
        .collect();
    Ok(Plan {
        app: manifest.app.clone(),
        groups: groups(manifest),
        offcodes,
        channels,
        layout: placed.layout.clone(),
        nodes,
        scheduler: manifest.scheduler,
    })
}

/// Offcode `i` as placed: its implementation there, its CPU, and why.
fn planned_offcode(placed: &Placed<'_>, i: usize) -> Result<PlannedOffcode, PlanError> {
    let r = &placed.resolved;
    let oc = &r.manifest.offcodes[i];
    let pe = &r.inventory.pes[placed.layout.assignment[i]];
    let module = oc.target(pe.kind).and_then(|t| t.module.clone());
    let fail = |problem: String| PlanError::Offcode {
        offcode: oc.name.clone(),
        origin: oc.origin.to_string(),
        problem,
    };
    let implementation = resolve::implementation(r.registry, oc, pe.kind, module.is_some())
        .map_err(|e| fail(e.to_string()))?
        .clone();
    implementation
        .check_ports(&oc.inputs, &oc.outputs)
        .map_err(|e| fail(e.to_string()))?;
    let reason = placed.layout.reasons[i].to_string();
    let declared_non_host = oc.targets.iter().any(|t| t.kind != PeKind::Host);
    let fallback = (pe.kind == PeKind::Host && declared_non_host).then(|| {
        let mut why: Vec<String> = r.excluded[i]
            .iter()
            .map(|e| format!("{}: {}", e.pe, e.why))
            .collect();
        why.push(reason.clone());
        why.join("; ")
    });
    let cpu = match pe.props.get("cpu") {
        Some(PropValue::Int(c)) if pe.kind == PeKind::Core => u32::try_from(*c).ok(),
        _ => None,
    };
    Ok(PlannedOffcode {
        name: oc.name.clone(),
        implementation,
        pe: pe.id.clone(),
        pe_kind: pe.kind,
        cpu,
        priority: oc.priority,
        watchdog: oc.watchdog,
        obsolete: oc.obsolete,
        restart: oc.restart,
        params: oc.params.clone(),
        inputs: oc.inputs.clone(),
        outputs: oc.outputs.clone(),
        calls: r.manifest.call_ports(i),
        timing: oc.timing,
        module,
        reason,
        fallback,
        excluded: r.excluded[i].clone(),
    })
}

/// A channel with its port indices and transport.
fn planned_channel(ch: &Channel, offcodes: &[PlannedOffcode]) -> PlannedChannel {
    // The manifest loader checked every port name against its offcode.
    let port = |oc: usize, name: &str, output: bool| {
        let list = if output {
            &offcodes[oc].outputs
        } else {
            &offcodes[oc].inputs
        };
        list.iter()
            .position(|p| p == name)
            .expect("the manifest loader validated every channel port")
    };
    let on_node = |oc: usize| offcodes[oc].pe_kind == PeKind::Node;
    let crosses = on_node(ch.from.offcode) || ch.to.iter().any(|t| on_node(t.offcode));
    PlannedChannel {
        name: ch.name.clone(),
        from: (ch.from.offcode, port(ch.from.offcode, &ch.from.port, true)),
        to: ch
            .to
            .iter()
            .map(|t| (t.offcode, port(t.offcode, &t.port, false)))
            .collect(),
        props: ch.props,
        transport: Transport::choose(&ch.props, crosses),
    }
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
