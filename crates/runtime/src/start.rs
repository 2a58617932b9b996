//! Stage 5 of the pipeline, **start** (HYDRA §4.1.1, §4.4): turns a plan into
//! running offcodes.
//!
//! 1. Build every instance from the library first, so a bad parameter fails
//!    the deployment with no side effect.
//! 2. Hand the parts placed on peer nodes to those peers ([`origin`]).
//! 3. Connect the channels: local ones through the [`transport`] factory,
//!    crossing ones from the streams the peers connected.
//! 4. Spawn one executor per PE (one per offcode on the host).
//! 5. Land the offcodes in priority order (phase 1, `initialize`); when every
//!    member of a related group has landed, tell each which channels are
//!    connected and start the group (phase 2).
//!
//! Everything goes into the resource tree under the app's root, so a failure
//! halfway (or a later stop) tears down exactly what was created, children
//! first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use sidecore_channel::oob::{OobDirectory, OobMessage};
use sidecore_offcode::{BuildSpec, Inlet, Offcode, OffcodeInfo, Outlet};
use sidecore_types::{AppId, AppState, PeKind, RestartPolicy};

use crate::app::{AppEntry, ChannelEntry};
use crate::dead::DEAD_PE_GRACE;
use crate::dispatch::TaskSpec;
use crate::error::DeployError;
use crate::events::{EventKind, EventLog};
use crate::executor::{
    self, Command, ExecError, ExecutorSpec, ExecutorState, IdlePolicy, Rebuild, Reply, Slot,
};
use crate::handle::OffcodeHandle;
use crate::node::origin::{self, Delegation};
use crate::plan::{Plan, PlannedOffcode};
use crate::restart::{RestartTracker, Restarter};
use crate::transport::{self, Attachment, StreamEnd, Transport};
use crate::tree::{ResourceId, ResourceKind, ResourceTree};

/// How long to wait for an executor to answer a command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// What the start stage uses of the runtime it starts into.
pub struct Env<'a> {
    pub idle: IdlePolicy,
    pub events: &'a EventLog,
    pub oob: &'a OobDirectory,
    pub tree: &'a ResourceTree,
}

/// Where a plan's remote parts stand when it starts.
pub enum Delegated {
    /// Still to be handed to the peers.
    Plan,
    /// Already connected (a peer starting its part of a remote app).
    Done(Vec<Attachment>),
}

/// Starts `plan` as app `id`; on error nothing of it is left running, here or
/// on the peers.
pub fn start(
    env: &Env<'_>,
    plan: &Plan,
    id: AppId,
    delegated: Delegated,
) -> Result<AppEntry, DeployError> {
    let instances = build_instances(plan)?;
    let root = env
        .tree
        .add(None, ResourceKind::App, format!("app {}", plan.app), || {});
    let result = (|| {
        let delegation = match delegated {
            Delegated::Plan => origin::delegate(plan)?,
            Delegated::Done(attachments) => Delegation {
                attachments,
                parts: Vec::new(),
            },
        };
        let mut ports = connect_channels(env, plan, root, delegation.attachments)?;
        let execs = spawn_executors(env, plan, root)?;
        let handles = handles(plan);
        let restarters = restarters(plan, &execs);
        for part in delegation.parts {
            follow_part(env, plan, root, &handles, part);
        }
        land_and_start(env, plan, &execs, &handles, instances, &mut ports)?;
        Ok(AppEntry {
            id,
            name: plan.app.clone(),
            root,
            handles,
            restarters,
            executors: execs.into_values().map(|e| e.state).collect(),
            channels: std::mem::take(&mut ports.channels),
            state: AppState::Running,
            started: Instant::now(),
            finished: None,
        })
    })();
    if let Err(e) = &result {
        env.events.emit(
            &plan.app,
            "-",
            EventKind::App {
                message: format!("deployment failed: {e}; rolling back"),
            },
        );
        env.tree.teardown(root);
    }
    result
}

/// Step 1: one instance per local offcode (`None` for those on peers, which
/// build their own and report their own errors).
fn build_instances(plan: &Plan) -> Result<Vec<Option<Box<dyn Offcode>>>, DeployError> {
    plan.offcodes
        .iter()
        .map(|oc| {
            (oc.pe_kind != PeKind::Node)
                .then(|| build_instance(oc))
                .transpose()
        })
        .collect()
}

/// An instance of a planned offcode, from its implementation's factory.
pub(crate) fn build_instance(oc: &PlannedOffcode) -> Result<Box<dyn Offcode>, DeployError> {
    let spec = BuildSpec {
        params: &oc.params,
        kind: oc.pe_kind,
        module: oc.module.as_deref(),
    };
    (oc.implementation.factory)(&spec).map_err(|e| DeployError::Build {
        offcode: oc.name.clone(),
        error: e.to_string(),
    })
}

/// Every local offcode's ports, and the channels each is joined to as
/// (channel, port) for its out-of-band "channel available" messages.
pub(crate) struct Ports {
    pub(crate) outlets: Vec<Vec<Outlet>>,
    pub(crate) inlets: Vec<Vec<Inlet>>,
    pub(crate) connected: Vec<Vec<(String, String)>>,
    /// Every channel of the plan, for status and metrics.
    pub(crate) channels: Vec<ChannelEntry>,
}

/// Step 3: local channels from the transport factory, crossing ones from the
/// attached streams.
pub(crate) fn connect_channels(
    env: &Env<'_>,
    plan: &Plan,
    root: ResourceId,
    attachments: Vec<Attachment>,
) -> Result<Ports, DeployError> {
    let mut p = Ports {
        outlets: plan
            .offcodes
            .iter()
            .map(|o| o.outputs.iter().map(|_| Outlet::Unconnected(0)).collect())
            .collect(),
        inlets: plan
            .offcodes
            .iter()
            .map(|o| o.inputs.iter().map(|_| Inlet::Unconnected).collect())
            .collect(),
        connected: vec![Vec::new(); plan.offcodes.len()],
        channels: plan
            .channels
            .iter()
            .map(|ch| ChannelEntry {
                name: ch.name.clone(),
                transport: format!("{:?}", ch.transport),
                from: plan.offcodes[ch.from.0].name.clone(),
                to: ch
                    .to
                    .iter()
                    .map(|&(o, _)| plan.offcodes[o].name.clone())
                    .collect(),
                probe: None,
            })
            .collect(),
    };
    for ch in plan
        .channels
        .iter()
        .filter(|c| c.transport != Transport::Stream)
    {
        let ends = transport::build(&ch.name, ch.transport, &ch.props, ch.to.len())?;
        if let Some(entry) = p.channels.iter_mut().find(|e| e.name == ch.name) {
            entry.probe = ends.probe;
        }
        let (from, port) = ch.from;
        p.outlets[from][port] = ends.outlet;
        p.connected[from].push((ch.name.clone(), plan.offcodes[from].outputs[port].clone()));
        for (inlet, &(oc, port)) in ends.inlets.into_iter().zip(&ch.to) {
            p.inlets[oc][port] = inlet;
            p.connected[oc].push((ch.name.clone(), plan.offcodes[oc].inputs[port].clone()));
        }
        let label = format!(
            "channel {} ({:?}, {} x {} B)",
            ch.name, ch.transport, ch.props.slots, ch.props.slot_size
        );
        env.tree
            .add(Some(root), ResourceKind::Channel, label, || {});
    }
    for a in attachments {
        let o = &plan.offcodes[a.offcode];
        let (port, label) = match a.end {
            StreamEnd::Send { port, sender } => {
                let label = format!("stream {} to {}", a.channel, sender.peer());
                p.outlets[a.offcode][port] = Outlet::Stream(sender);
                (o.outputs[port].clone(), label)
            }
            StreamEnd::Recv { port, receiver } => {
                let label = format!("stream {} from {}", a.channel, receiver.peer());
                p.inlets[a.offcode][port] = Inlet::Stream(receiver);
                (o.inputs[port].clone(), label)
            }
        };
        p.connected[a.offcode].push((a.channel, port));
        env.tree
            .add(Some(root), ResourceKind::Channel, label, || {});
    }
    Ok(p)
}

/// A running executor as the start stage drives it.
pub(crate) struct Exec {
    pub(crate) tx: Sender<Command>,
    pub(crate) state: Arc<ExecutorState>,
    /// Its node in the resource tree: its offcodes' nodes go under it.
    pub(crate) node: ResourceId,
}

/// The executor an offcode runs on: its core's, or its own on the host.
pub(crate) fn exec_name(plan: &Plan, i: usize) -> String {
    let o = &plan.offcodes[i];
    if o.pe_kind == PeKind::Host {
        format!("host/{}", o.name)
    } else {
        o.pe.clone()
    }
}

/// Step 4: one executor per PE that local offcodes landed on.
fn spawn_executors(
    env: &Env<'_>,
    plan: &Plan,
    root: ResourceId,
) -> Result<BTreeMap<String, Exec>, DeployError> {
    let mut execs = BTreeMap::new();
    for (i, o) in plan.offcodes.iter().enumerate() {
        let name = exec_name(plan, i);
        if o.pe_kind == PeKind::Node || execs.contains_key(&name) {
            continue;
        }
        execs.insert(name, spawn_executor(env, plan, root, i)?);
    }
    Ok(execs)
}

/// Spawns the executor that offcode `i` of `plan` runs on, as a node under
/// `parent` whose teardown shuts it down.
pub(crate) fn spawn_executor(
    env: &Env<'_>,
    plan: &Plan,
    parent: ResourceId,
    i: usize,
) -> Result<Exec, DeployError> {
    let o = &plan.offcodes[i];
    let name = exec_name(plan, i);
    let spec = ExecutorSpec {
        name: name.clone(),
        pin: o.cpu,
        idle: env.idle,
        policy: plan.scheduler,
    };
    let (tx, state, join) =
        executor::spawn(spec, plan.app.clone(), env.events.clone()).map_err(|e| {
            DeployError::Executor {
                pe: o.pe.clone(),
                error: e.to_string(),
            }
        })?;
    let txc = tx.clone();
    let join = Mutex::new(Some(join));
    let (pe, app, events) = (o.pe.clone(), plan.app.clone(), env.events.clone());
    // The out-of-band endpoints its offcodes hold, to take back if it is
    // left behind.
    let endpoints: Vec<String> = (0..plan.offcodes.len())
        .filter(|&j| plan.offcodes[j].pe_kind != PeKind::Node && exec_name(plan, j) == name)
        .map(|j| format!("{}/{}", plan.app, plan.offcodes[j].name))
        .collect();
    let oob = env.oob.clone();
    let pinned = o
        .cpu
        .map(|c| format!(" (pinned to CPU {c})"))
        .unwrap_or_default();
    let node = env.tree.add(
        Some(parent),
        ResourceKind::Executor,
        format!("executor {name}{pinned}"),
        move || {
            let _ = txc.send(Command::Shutdown);
            let taken = join
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(j) = taken
                && !join_executor(j, &pe, &app, &events)
            {
                for e in &endpoints {
                    oob.evict(e);
                }
            }
        },
    );
    Ok(Exec { tx, state, node })
}

/// Waits for an executor told to shut down; on a PE declared dead, for at
/// most [`DEAD_PE_GRACE`], after which it is left behind (it exits if its
/// CPU ever runs it again) and the log says so. Whether it exited (if not,
/// the caller takes back its offcodes' out-of-band names, so that the app
/// can start again at once).
fn join_executor(j: std::thread::JoinHandle<()>, pe: &str, app: &str, events: &EventLog) -> bool {
    const POLL: Duration = Duration::from_millis(5);
    if !sidecore_orion::health::is_dead(pe) {
        let _ = j.join();
        return true;
    }
    let deadline = Instant::now() + DEAD_PE_GRACE;
    while !j.is_finished() && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    if j.is_finished() {
        let _ = j.join();
        return true;
    }
    events.emit(
        app,
        "-",
        EventKind::App {
            message: format!(
                "executor on {pe} did not exit within {} ms of being told to (its PE is \
                 declared dead): left behind, its offcodes' endpoints taken back",
                DEAD_PE_GRACE.as_millis()
            ),
        },
    );
    false
}

/// A handle per offcode; a peer enforces the watchdog, obsolete time and
/// restarts of the offcodes it runs, so theirs have none here.
pub(crate) fn handles(plan: &Plan) -> Vec<Arc<OffcodeHandle>> {
    plan.offcodes
        .iter()
        .map(|o| {
            let here = o.pe_kind != PeKind::Node;
            Arc::new(
                OffcodeHandle::new(
                    &plan.app,
                    &o.name,
                    &o.pe,
                    &o.implementation.name,
                    o.watchdog.filter(|_| here),
                    o.obsolete.filter(|_| here),
                )
                .with_restart(if here {
                    o.restart
                } else {
                    RestartPolicy::NEVER
                }),
            )
        })
        .collect()
}

/// The supervisor's restart book-keeping per offcode, with the executor it
/// sends restarts to (a peer restarts the offcodes it runs itself).
fn restarters(plan: &Plan, execs: &BTreeMap<String, Exec>) -> Vec<Restarter> {
    plan.offcodes
        .iter()
        .enumerate()
        .map(|(i, o)| Restarter {
            tx: (o.pe_kind != PeKind::Node)
                .then(|| execs.get(&exec_name(plan, i)).map(|e| e.tx.clone()))
                .flatten(),
            tracker: RestartTracker::new(o.restart),
        })
        .collect()
}

/// A peer's part is in place (initialized and started there): follow it, and
/// make its lease part of the app.
pub(crate) fn follow_part(
    env: &Env<'_>,
    plan: &Plan,
    root: ResourceId,
    handles: &[Arc<OffcodeHandle>],
    part: origin::PartLink,
) {
    let hs = part
        .members
        .iter()
        .map(|&m| Arc::clone(&handles[m]))
        .collect();
    let label = format!("part on {} ({} offcodes)", part.node, part.members.len());
    let teardown = origin::follow(part, hs, plan.app.clone(), env.events.clone());
    env.tree
        .add(Some(root), ResourceKind::Remote, label, teardown);
}

/// Sends a command and waits for the executor's answer.
pub(crate) fn ask(
    tx: &Sender<Command>,
    cmd: impl FnOnce(Reply) -> Command,
) -> Result<(), ExecError> {
    let (rtx, rrx) = crossbeam_channel::bounded(1);
    tx.send(cmd(rtx)).map_err(|_| ExecError::Gone)?;
    rrx.recv_timeout(COMMAND_TIMEOUT)
        .map_err(|_| ExecError::NoAnswer)?
}

/// Step 5: land in priority order; start each group once all of it has landed.
/// An offcode without an instance is in place already (on a peer, which
/// starts its own part, or, in a re-placement, one that runs on): it counts
/// as landed and is neither landed nor started here.
pub(crate) fn land_and_start(
    env: &Env<'_>,
    plan: &Plan,
    execs: &BTreeMap<String, Exec>,
    handles: &[Arc<OffcodeHandle>],
    mut instances: Vec<Option<Box<dyn Offcode>>>,
    ports: &mut Ports,
) -> Result<(), DeployError> {
    let in_place: Vec<bool> = instances.iter().map(Option::is_none).collect();
    let mut landed = in_place.clone();
    let mut started = vec![false; plan.groups.len()];
    let mut group_of = vec![0; plan.offcodes.len()];
    for (g, members) in plan.groups.iter().enumerate() {
        for &m in members {
            group_of[m] = g;
        }
    }
    let order = plan.deployment_order();
    for &i in order.iter().filter(|&&i| !in_place[i]) {
        let instance = instances[i]
            .take()
            .expect("each local offcode has one instance and lands once");
        land(
            env,
            plan,
            &execs[&exec_name(plan, i)],
            &handles[i],
            instance,
            i,
            ports,
        )?;
        landed[i] = true;
        let g = group_of[i];
        if !started[g] && plan.groups[g].iter().all(|&m| landed[m]) {
            started[g] = true;
            for &m in order
                .iter()
                .filter(|&&m| !in_place[m] && plan.groups[g].contains(&m))
            {
                start_one(
                    env,
                    plan,
                    &execs[&exec_name(plan, m)],
                    m,
                    &ports.connected[m],
                )?;
            }
        }
    }
    Ok(())
}

/// Phase 1 for offcode `i`: hand it to its executor, which initializes it.
fn land(
    env: &Env<'_>,
    plan: &Plan,
    exec: &Exec,
    handle: &Arc<OffcodeHandle>,
    instance: Box<dyn Offcode>,
    i: usize,
    ports: &mut Ports,
) -> Result<(), DeployError> {
    let (app, o) = (&plan.app, &plan.offcodes[i]);
    let fail = |error: String| DeployError::Offcode {
        offcode: o.name.clone(),
        pe: o.pe.clone(),
        error,
    };
    if let Some(why) = &o.fallback {
        let kind = EventKind::Fallback {
            wanted: "its declared targets".into(),
            reason: why.clone(),
        };
        env.events.emit(app, &o.name, kind);
    }
    let placed = EventKind::Placed {
        pe: o.pe.clone(),
        reason: o.reason.clone(),
    };
    env.events.emit(app, &o.name, placed);
    let oob = env
        .oob
        .open(&format!("{app}/{}", o.name))
        .map_err(|e| fail(e.to_string()))?;
    let info = OffcodeInfo {
        app: app.clone(),
        name: o.name.clone(),
        implementation: o.implementation.name.clone(),
        pe: o.pe.clone(),
        pe_kind: o.pe_kind,
        inputs: o.inputs.clone(),
        outputs: o.outputs.clone(),
        calls: o.calls.clone(),
    };
    // A provider on this very executor cannot serve a call its caller waits on.
    let here = exec_name(plan, i);
    let colocated = |peer: &str| {
        plan.offcodes
            .iter()
            .position(|p| p.name == peer)
            .is_some_and(|p| plan.offcodes[p].pe_kind != PeKind::Node && exec_name(plan, p) == here)
    };
    let slot = Slot::new(
        Arc::clone(handle),
        instance,
        info,
        o.params.clone(),
        std::mem::take(&mut ports.inlets[i]),
        std::mem::take(&mut ports.outlets[i]),
        Some(oob),
    )
    .with_calls(colocated)
    .with_task(task_spec(o));
    let slot = if o.restart.restarts() {
        slot.with_rebuild(Rebuild {
            factory: Arc::clone(&o.implementation.factory),
            module: o.module.clone(),
            connected: ports.connected[i].clone(),
        })
    } else {
        slot
    };
    ask(&exec.tx, |r| Command::Land(Box::new(slot), r)).map_err(|e| fail(e.to_string()))?;
    // The offcode's node: tearing it down stops it on its executor (on a
    // dead PE without waiting: the executor's own teardown bounds that).
    let (txc, name, pe) = (exec.tx.clone(), o.name.clone(), o.pe.clone());
    env.tree.add(
        Some(exec.node),
        ResourceKind::Offcode,
        format!("offcode {}", o.name),
        move || {
            let (ack_tx, ack_rx) = crossbeam_channel::bounded(1);
            if txc
                .send(Command::Stop(name, "app stopped".into(), ack_tx))
                .is_ok()
                && !sidecore_orion::health::is_dead(&pe)
            {
                let _ = ack_rx.recv_timeout(COMMAND_TIMEOUT);
            }
        },
    );
    Ok(())
}

/// What a core's scheduler is to know of a planned offcode.
fn task_spec(o: &PlannedOffcode) -> TaskSpec {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let wcet_ns = o.timing.wcet.map(ns);
    TaskSpec {
        name: o.name.clone(),
        periodic: o.timing.period.map(ns).zip(wcet_ns),
        wcet_ns,
        priority: u8::try_from(o.priority.weight()).unwrap_or(u8::MAX),
    }
}

/// Phase 2 for offcode `m`: tell it which channels are connected, then start it.
fn start_one(
    env: &Env<'_>,
    plan: &Plan,
    exec: &Exec,
    m: usize,
    connected: &[(String, String)],
) -> Result<(), DeployError> {
    let o = &plan.offcodes[m];
    let endpoint = format!("{}/{}", plan.app, o.name);
    for (channel, port) in connected {
        let msg = OobMessage::ChannelAvailable {
            channel: channel.clone(),
            port: port.clone(),
        };
        let _ = env.oob.send(&endpoint, msg);
    }
    ask(&exec.tx, |r| Command::Start(o.name.clone(), r)).map_err(|e| DeployError::Offcode {
        offcode: o.name.clone(),
        pe: o.pe.clone(),
        error: e.to_string(),
    })
}
