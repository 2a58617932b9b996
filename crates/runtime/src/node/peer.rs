//! The peer's side of a remote part: builds the plan of a part an origin asked
//! for (every offcode on a host executor), listens for the channels coming in
//! and connects the ones going out, deploys it into this daemon's runtime, and
//! holds the lease: status reports every [`STATUS_EVERY`] until the origin says
//! stop or goes away, then the part stops and its last report goes back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sidecore_offcode::{ImplError, Registry};
use sidecore_types::{AppId, PeKind};
use sidecore_wire::session::PeerGrammar;
use sidecore_wire::{Link, LinkError, Message, Received, RemotePart};

use super::{ChannelSetupError, STATUS_EVERY, accept_end, connect_end, listen};
use crate::error::DeployError;
use crate::plan::{Plan, PlannedChannel, PlannedOffcode};
use crate::runtime::Runtime;
use crate::transport::Transport;

/// Why a peer cannot build the part it was asked for.
#[derive(Debug, thiserror::Error)]
pub enum PartPlanError {
    #[error(
        "offcode `{offcode}`: this node's library has no implementation `{implementation}` that runs here"
    )]
    NoImplementation {
        offcode: String,
        implementation: String,
    },
    #[error("offcode `{offcode}`: {source}")]
    Ports {
        offcode: String,
        #[source]
        source: ImplError,
    },
}

/// Why a peer could not deploy a part (sent back to the origin as its reason).
#[derive(Debug, thiserror::Error)]
enum PeerError {
    #[error(transparent)]
    Plan(#[from] PartPlanError),
    #[error(transparent)]
    Channel(#[from] ChannelSetupError),
    #[error(transparent)]
    Deploy(#[from] DeployError),
    #[error(transparent)]
    Link(#[from] LinkError),
}

/// Serves a deploy request that arrived on `link`: deploys the part into `rt`,
/// then reports its status until the origin stops it, the lease closes, or
/// `stop` is set. A failure goes back to the origin as its reason.
pub fn serve(
    rt: &Arc<Runtime>,
    registry: &Registry,
    link: &Link<PeerGrammar>,
    part: &RemotePart,
    stop: &AtomicBool,
) {
    match deploy_part(rt, registry, link, part) {
        Ok(id) => lease(rt, id, link, stop),
        Err(e) => {
            let _ = link.send(&Message::Error {
                error: e.to_string(),
            });
        }
    }
}

/// The plan of a part for this node: every offcode on a host executor, all of
/// them one related group (the origin's layout related them).
pub fn part_plan(part: &RemotePart, registry: &Registry) -> Result<Plan, PartPlanError> {
    let mut offcodes = Vec::new();
    for o in &part.offcodes {
        let imp = registry
            .get(&o.implementation)
            .filter(|i| i.runs_on(PeKind::Host) || i.runs_on(PeKind::Core))
            .ok_or_else(|| PartPlanError::NoImplementation {
                offcode: o.name.clone(),
                implementation: o.implementation.clone(),
            })?;
        imp.check_ports(&o.inputs, &o.outputs)
            .map_err(|source| PartPlanError::Ports {
                offcode: o.name.clone(),
                source,
            })?;
        offcodes.push(PlannedOffcode {
            name: o.name.clone(),
            implementation: imp.clone(),
            pe: "host".into(),
            pe_kind: PeKind::Host,
            cpu: None,
            priority: o.priority,
            watchdog: o.watchdog_ms.map(Duration::from_millis),
            obsolete: o.obsolete_ms.map(Duration::from_millis),
            restart: o.restart.unwrap_or_default(),
            params: o.params.clone(),
            inputs: o.inputs.clone(),
            outputs: o.outputs.clone(),
            calls: o.calls.clone(),
            timing: sidecore_manifest::Timing::default(),
            module: None,
            reason: format!("placed on this node by {}", part.origin),
            fallback: None,
            excluded: Vec::new(),
        });
    }
    // Channels with both ends here; the others are streams, attached.
    let channels = part
        .channels
        .iter()
        .filter_map(|c| {
            let from = c.from?;
            (!c.to.is_empty()).then(|| PlannedChannel {
                name: c.name.clone(),
                from,
                to: c.to.clone(),
                props: c.props,
                transport: Transport::choose(&c.props, false),
            })
        })
        .collect();
    let n = offcodes.len();
    Ok(Plan {
        app: format!("{}@{}", part.app, part.origin),
        offcodes,
        channels,
        groups: vec![(0..n).collect()],
        layout: sidecore_layout::Layout {
            assignment: vec![0; n],
            offloaded_weight: 0,
            cross_bandwidth: 0.0,
            reasons: Vec::new(),
            stats: sidecore_layout::SolveStats::default(),
        },
        nodes: BTreeMap::new(),
        // Each offcode of a part has a host thread of its own.
        scheduler: sidecore_types::SchedPolicy::RoundRobin,
    })
}

fn deploy_part(
    rt: &Arc<Runtime>,
    registry: &Registry,
    link: &Link<PeerGrammar>,
    part: &RemotePart,
) -> Result<AppId, PeerError> {
    let plan = part_plan(part, registry)?;
    let here = link.local_addr()?.ip();
    let mut listeners = Vec::new();
    let mut listening = BTreeMap::new();
    for c in part.channels.iter().filter(|c| c.from.is_none()) {
        let (l, addr) = listen(here, &c.name)?;
        listening.insert(c.name.clone(), addr);
        listeners.push((c, l));
    }
    link.send(&Message::Listening {
        channels: listening,
    })?;
    let mut attachments = Vec::new();
    for (c, l) in listeners {
        attachments.push(accept_end(&l, &c.name, c.to[0])?);
    }
    for c in &part.channels {
        if let (Some(from), Some(a)) = (c.from, &c.connect) {
            attachments.push(connect_end(a, &c.name, c.props.delivery, from)?);
        }
    }
    let id = rt.deploy_attached(&plan, attachments)?;
    if let Err(e) = link.send(&Message::Deployed {
        app: plan.app.clone(),
    }) {
        rt.stop_app(id);
        return Err(e.into());
    }
    Ok(id)
}

/// Reports the part's status until the origin says stop or goes away, then
/// stops the part and sends its last report, read at rest: the origin's final
/// status then agrees with what really ran here.
fn lease(rt: &Arc<Runtime>, id: AppId, link: &Link<PeerGrammar>, stop: &AtomicBool) {
    let mut next = Instant::now();
    while !stop.load(Ordering::Acquire) {
        if Instant::now() >= next {
            next = Instant::now() + STATUS_EVERY;
            let Some(s) = rt.status_of(id) else { break };
            if link.send(&Message::Status(s)).is_err() {
                break;
            }
        }
        let wait = next.saturating_duration_since(Instant::now());
        match link.recv(Some(wait.max(Duration::from_millis(1)))) {
            Ok(Received::TimedOut) => {}
            // `stop`, an error from the origin, its close, or a broken link:
            // the lease is over.
            Ok(Received::Message(_) | Received::Closed) | Err(_) => break,
        }
    }
    if let Some((_, s)) = rt.stop_app_with_status(id) {
        let _ = link.send(&Message::Status(s));
    }
}
