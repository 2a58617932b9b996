//! Deployment (HYDRA §4.1.1, §4.4): turns a plan into running offcodes and
//! keeps them accountable.
//!
//! * Instances are built from the library before anything is placed, so a bad
//!   parameter fails the deployment without side effects.
//! * Channels are created from the plan's transports.
//! * Offcodes land in priority order. Each is initialized on its own executor
//!   (phase 1: local resources only). When every offcode of a related group has
//!   landed, the group is started (phase 2), after each member is told over its
//!   out-of-band channel which channels are now connected.
//! * Everything is recorded in the resource tree under the app, so stopping the
//!   app (or a failure halfway through deployment) tears down exactly what was
//!   created, children first.
//! * A supervisor thread enforces watchdog periods and obsolete times, and
//!   reaps apps whose offcodes have all finished.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use serde::{Deserialize, Serialize};
use sidecore_channel::oob::{OobDirectory, OobMessage};
use sidecore_channel::parallel::work_queue;
use sidecore_channel::{Ring, RingConfig, Sender as RingSender};
use sidecore_offcode::{BuildSpec, Inlet, OffcodeInfo, Outlet, Registry};
use sidecore_types::PeKind;

use crate::events::{EventKind, EventLog};
use crate::executor::{
    self, Command, ExecutorSpec, ExecutorState, IdlePolicy, OffcodeHandle, OffcodeState, Slot,
};
use crate::plan::{Plan, Transport};
use crate::remote::{self, Attachment, Delegation, StreamEnd};
use crate::tree::{ResourceId, ResourceKind, ResourceTree};

/// How long to wait for an executor to answer a command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Runtime settings.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub idle: IdlePolicy,
    /// How often the supervisor looks at watchdogs and obsolete times.
    pub supervise_every: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            idle: IdlePolicy::Adaptive,
            supervise_every: Duration::from_millis(2),
        }
    }
}

/// Why a deployment failed. Nothing of it is left running.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("offcode `{offcode}`: cannot build it: {error}")]
    Build { offcode: String, error: String },
    #[error("channel `{channel}`: {error}")]
    Channel { channel: String, error: String },
    #[error("PE {pe}: {error}")]
    Executor { pe: String, error: String },
    #[error("offcode `{offcode}` on {pe}: {error}")]
    Offcode {
        offcode: String,
        pe: String,
        error: String,
    },
    #[error("an app named `{0}` is already running")]
    Duplicate(String),
    #[error("peer {node}: {error}")]
    Node { node: String, error: String },
}

/// Where a plan's remote parts stand when deployment begins.
enum Delegated {
    /// Still to be handed to the peers.
    Plan,
    /// Already connected (a peer deploying its part).
    Done(Delegation),
}

/// Identifies a deployed app.
pub type AppId = u64;

/// Life of an app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AppState {
    Running,
    /// Every offcode finished or was stopped by the runtime.
    Finished,
    /// Stopped by request.
    Stopped,
}

struct AppEntry {
    id: AppId,
    name: String,
    root: ResourceId,
    handles: Vec<Arc<OffcodeHandle>>,
    executors: Vec<Arc<ExecutorState>>,
    state: AppState,
    started: Instant,
    finished: Option<Instant>,
}

/// One offcode as `sidecore ps` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OffcodeStatus {
    pub name: String,
    pub implementation: String,
    pub pe: String,
    pub state: OffcodeState,
    pub uptime_ms: u64,
    pub handled: u64,
    pub sent: u64,
    pub dropped: u64,
    pub turns: u64,
    pub metrics: BTreeMap<String, u64>,
    pub stop_reason: Option<String>,
}

/// One app as `sidecore ps` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppStatus {
    pub id: AppId,
    pub name: String,
    pub state: AppState,
    pub uptime_ms: u64,
    pub offcodes: Vec<OffcodeStatus>,
}

fn app_status(a: &AppEntry) -> AppStatus {
    AppStatus {
        id: a.id,
        name: a.name.clone(),
        state: a.state,
        uptime_ms: a
            .finished
            .unwrap_or_else(Instant::now)
            .duration_since(a.started)
            .as_millis() as u64,
        offcodes: a
            .handles
            .iter()
            .map(|h| OffcodeStatus {
                name: h.name.clone(),
                implementation: h.implementation.clone(),
                pe: h.pe.clone(),
                state: h.state(),
                uptime_ms: h.landed_at.elapsed().as_millis() as u64,
                handled: h.handled.load(Ordering::Relaxed),
                sent: h.sent.load(Ordering::Relaxed),
                dropped: h.dropped.load(Ordering::Relaxed),
                turns: h.turns.load(Ordering::Relaxed),
                metrics: h.metrics.snapshot().into_iter().collect(),
                stop_reason: h.stop_reason(),
            })
            .collect(),
    }
}

/// The runtime: deploys apps and supervises them.
pub struct Runtime {
    config: RuntimeConfig,
    events: EventLog,
    oob: OobDirectory,
    tree: ResourceTree,
    apps: Mutex<Vec<AppEntry>>,
    next_id: AtomicU64,
    stop: Arc<AtomicBool>,
    supervisor: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Runtime {
    /// Starts a runtime (and its supervisor thread).
    pub fn new(config: RuntimeConfig) -> Arc<Runtime> {
        let rt = Arc::new(Runtime {
            config,
            events: EventLog::new(),
            oob: OobDirectory::new(),
            tree: ResourceTree::new(),
            apps: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            stop: Arc::new(AtomicBool::new(false)),
            supervisor: Mutex::new(None),
        });
        let weak = Arc::downgrade(&rt);
        let stop = Arc::clone(&rt.stop);
        let every = rt.config.supervise_every;
        let h = std::thread::Builder::new()
            .name("sc-supervisor".into())
            .spawn(move || supervise(weak, stop, every))
            .expect("spawn the supervisor thread");
        *rt.supervisor.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(h);
        rt
    }

    /// The event log.
    pub fn events(&self) -> &EventLog {
        &self.events
    }

    /// The out-of-band directory (endpoints are `app/offcode`).
    pub fn oob(&self) -> &OobDirectory {
        &self.oob
    }

    /// The resource tree.
    pub fn tree(&self) -> &ResourceTree {
        &self.tree
    }

    fn apps(&self) -> std::sync::MutexGuard<'_, Vec<AppEntry>> {
        self.apps.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Deploys a plan. Parts placed on peer nodes are handed to those peers
    /// (see [`crate::remote`]). On error nothing of it is left running, here or
    /// on the peers.
    pub fn deploy(&self, plan: &Plan, registry: &Registry) -> Result<AppId, DeployError> {
        let _ = registry;
        self.deploy_with(plan, Delegated::Plan)
    }

    /// Deploys a plan whose crossing channels are already connected: the part
    /// of a remote app that a peer node runs here.
    pub fn deploy_attached(
        &self,
        plan: &Plan,
        attachments: Vec<Attachment>,
    ) -> Result<AppId, DeployError> {
        self.deploy_with(
            plan,
            Delegated::Done(Delegation {
                attachments,
                parts: Vec::new(),
            }),
        )
    }

    fn deploy_with(&self, plan: &Plan, delegated: Delegated) -> Result<AppId, DeployError> {
        if self
            .apps()
            .iter()
            .any(|a| a.name == plan.app && a.state == AppState::Running)
        {
            return Err(DeployError::Duplicate(plan.app.clone()));
        }
        let app = plan.app.clone();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);

        // 1. Build every instance first: a bad parameter fails with no side effect.
        let mut instances = Vec::new();
        for oc in &plan.offcodes {
            if oc.pe_kind == PeKind::Node {
                // Built by the peer, which reports its own build errors.
                instances.push(None);
                continue;
            }
            let spec = BuildSpec {
                params: &oc.params,
                kind: oc.pe_kind,
                module: oc.module.as_deref(),
            };
            let inst = (oc.implementation.factory)(&spec).map_err(|e| DeployError::Build {
                offcode: oc.name.clone(),
                error: e.to_string(),
            })?;
            instances.push(Some(inst));
        }

        let root = self
            .tree
            .add(None, ResourceKind::App, format!("app {app}"), || {});
        // 2. Hand the peers their parts (the leases hang off the app's node).
        let delegation = match delegated {
            Delegated::Done(d) => Ok(d),
            Delegated::Plan => remote::delegate(plan),
        };
        let result = delegation.and_then(|d| self.deploy_into(plan, id, root, instances, d));
        match result {
            Ok(entry) => {
                self.apps().push(entry);
                Ok(id)
            }
            Err(e) => {
                self.events.emit(
                    &app,
                    "-",
                    EventKind::App {
                        message: format!("deployment failed: {e}; rolling back"),
                    },
                );
                self.tree.teardown(root);
                Err(e)
            }
        }
    }

    fn deploy_into(
        &self,
        plan: &Plan,
        id: AppId,
        root: ResourceId,
        mut instances: Vec<Option<Box<dyn sidecore_offcode::Offcode>>>,
        delegation: Delegation,
    ) -> Result<AppEntry, DeployError> {
        let app = &plan.app;
        let n = plan.offcodes.len();
        let remote: Vec<bool> = plan
            .offcodes
            .iter()
            .map(|o| o.pe_kind == PeKind::Node)
            .collect();

        // 2. Channels.
        let mut outlets: Vec<Vec<Outlet>> = plan
            .offcodes
            .iter()
            .map(|o| o.outputs.iter().map(|_| Outlet::Unconnected(0)).collect())
            .collect();
        let mut inlets: Vec<Vec<Inlet>> = plan
            .offcodes
            .iter()
            .map(|o| o.inputs.iter().map(|_| Inlet::Unconnected).collect())
            .collect();
        let mut connected: Vec<Vec<(String, String)>> = vec![Vec::new(); n];
        for ch in &plan.channels {
            let slots = ch.props.slots as usize;
            let slot_size = ch.props.slot_size as usize;
            match ch.transport {
                Transport::Ring => {
                    let (p, cs) = Ring::create(RingConfig {
                        slots,
                        slot_size,
                        consumers: ch.to.len(),
                        publish_batch: 32,
                        release_batch: 32,
                    })
                    .map_err(|e| DeployError::Channel {
                        channel: ch.name.clone(),
                        error: e.to_string(),
                    })?;
                    outlets[ch.from.0][ch.from.1] =
                        Outlet::Ring(RingSender::new(p, ch.props.delivery));
                    for (c, &(oc, port)) in cs.into_iter().zip(&ch.to) {
                        inlets[oc][port] = Inlet::Ring(c);
                    }
                }
                Transport::WorkQueue => {
                    let (p, c) =
                        work_queue(slots, slot_size).map_err(|e| DeployError::Channel {
                            channel: ch.name.clone(),
                            error: e.to_string(),
                        })?;
                    outlets[ch.from.0][ch.from.1] = Outlet::Parallel(p, ch.props.delivery, 0);
                    for &(oc, port) in &ch.to {
                        inlets[oc][port] = Inlet::Parallel(c.clone());
                    }
                }
                // Its local end is one of the delegation's attachments.
                Transport::Stream => continue,
            }
            connected[ch.from.0].push((
                ch.name.clone(),
                plan.offcodes[ch.from.0].outputs[ch.from.1].clone(),
            ));
            for &(oc, port) in &ch.to {
                connected[oc].push((ch.name.clone(), plan.offcodes[oc].inputs[port].clone()));
            }
            self.tree.add(
                Some(root),
                ResourceKind::Channel,
                format!(
                    "channel {} ({:?}, {} x {} B)",
                    ch.name, ch.transport, slots, slot_size
                ),
                || {},
            );
        }

        for a in delegation.attachments {
            let o = &plan.offcodes[a.offcode];
            let (port, label) = match a.end {
                StreamEnd::Send { port, sender } => {
                    let label = format!("stream {} to {}", a.channel, sender.peer());
                    outlets[a.offcode][port] = Outlet::Stream(sender);
                    (o.outputs[port].clone(), label)
                }
                StreamEnd::Recv { port, receiver } => {
                    let label = format!("stream {} from {}", a.channel, receiver.peer());
                    inlets[a.offcode][port] = Inlet::Stream(receiver);
                    (o.inputs[port].clone(), label)
                }
            };
            connected[a.offcode].push((a.channel.clone(), port));
            self.tree
                .add(Some(root), ResourceKind::Channel, label, || {});
        }

        // 3. Executors, one per PE (one per offcode on the host).
        struct Exec {
            tx: Sender<Command>,
            state: Arc<ExecutorState>,
            node: ResourceId,
        }
        let mut execs: BTreeMap<String, Exec> = BTreeMap::new();
        let exec_name = |i: usize| -> String {
            let o = &plan.offcodes[i];
            if o.pe_kind == PeKind::Host {
                format!("host/{}", o.name)
            } else {
                o.pe.clone()
            }
        };
        for i in (0..n).filter(|&i| !remote[i]) {
            let name = exec_name(i);
            if execs.contains_key(&name) {
                continue;
            }
            let o = &plan.offcodes[i];
            let spec = ExecutorSpec {
                name: name.clone(),
                pin: o.cpu,
                idle: self.config.idle,
            };
            let (tx, state, join) = executor::spawn(spec, app.clone(), self.events.clone())
                .map_err(|e| DeployError::Executor {
                    pe: o.pe.clone(),
                    error: e.to_string(),
                })?;
            let txc = tx.clone();
            let join = Mutex::new(Some(join));
            let node = self.tree.add(
                Some(root),
                ResourceKind::Executor,
                format!(
                    "executor {name}{}",
                    o.cpu
                        .map(|c| format!(" (pinned to CPU {c})"))
                        .unwrap_or_default()
                ),
                move || {
                    let _ = txc.send(Command::Shutdown);
                    if let Some(j) = join.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
                        let _ = j.join();
                    }
                },
            );
            execs.insert(name, Exec { tx, state, node });
        }

        // 4. Land in priority order; start each group once all of it has landed.
        let handles: Vec<Arc<OffcodeHandle>> = plan
            .offcodes
            .iter()
            .map(|o| {
                // A peer enforces the watchdog and obsolete time of its part.
                let here = o.pe_kind != PeKind::Node;
                Arc::new(OffcodeHandle::new(
                    app,
                    &o.name,
                    &o.pe,
                    &o.implementation.name,
                    o.watchdog.filter(|_| here),
                    o.obsolete.filter(|_| here),
                ))
            })
            .collect();
        // The peers' parts are in place (initialized and started there): follow
        // them, and make their leases part of the app.
        for part in delegation.parts {
            let hs = part
                .members
                .iter()
                .map(|&m| Arc::clone(&handles[m]))
                .collect();
            let label = format!("part on {} ({} offcodes)", part.node, part.members.len());
            let teardown = remote::follow(part, hs, app.clone(), self.events.clone());
            self.tree
                .add(Some(root), ResourceKind::Remote, label, teardown);
        }
        let mut landed = remote.clone();
        let mut started_groups = vec![false; plan.groups.len()];
        let group_of: Vec<usize> = {
            let mut g = vec![0; n];
            for (gi, members) in plan.groups.iter().enumerate() {
                for &m in members {
                    g[m] = gi;
                }
            }
            g
        };
        let order = plan.deployment_order();
        for &i in order.iter().filter(|&&i| !remote[i]) {
            let o = &plan.offcodes[i];
            let exec = &execs[&exec_name(i)];
            if let Some(why) = &o.fallback {
                self.events.emit(
                    app,
                    &o.name,
                    EventKind::Fallback {
                        wanted: "its declared targets".into(),
                        reason: why.clone(),
                    },
                );
            }
            self.events.emit(
                app,
                &o.name,
                EventKind::Placed {
                    pe: o.pe.clone(),
                    reason: o.reason.clone(),
                },
            );
            let oob =
                self.oob
                    .open(&format!("{app}/{}", o.name))
                    .map_err(|e| DeployError::Offcode {
                        offcode: o.name.clone(),
                        pe: o.pe.clone(),
                        error: e.to_string(),
                    })?;
            let info = OffcodeInfo {
                app: app.clone(),
                name: o.name.clone(),
                implementation: o.implementation.name.clone(),
                pe: o.pe.clone(),
                pe_kind: o.pe_kind,
                inputs: o.inputs.clone(),
                outputs: o.outputs.clone(),
            };
            let slot = Slot::new(
                Arc::clone(&handles[i]),
                instances[i].take().expect("each instance lands once"),
                info,
                o.params.clone(),
                std::mem::take(&mut inlets[i]),
                std::mem::take(&mut outlets[i]),
                Some(oob),
            );
            let (rtx, rrx) = crossbeam_channel::bounded(1);
            let fail = |error: String| DeployError::Offcode {
                offcode: o.name.clone(),
                pe: o.pe.clone(),
                error,
            };
            exec.tx
                .send(Command::Land(Box::new(slot), rtx))
                .map_err(|_| fail("executor is gone".into()))?;
            rrx.recv_timeout(COMMAND_TIMEOUT)
                .map_err(|_| fail("no answer from its executor".into()))?
                .map_err(fail)?;
            // The offcode's node: tearing it down stops it on its executor.
            let txc = exec.tx.clone();
            let name = o.name.clone();
            self.tree.add(
                Some(exec.node),
                ResourceKind::Offcode,
                format!("offcode {}", o.name),
                move || {
                    let (ack_tx, ack_rx) = crossbeam_channel::bounded(1);
                    if txc
                        .send(Command::Stop(name, "app stopped".into(), ack_tx))
                        .is_ok()
                    {
                        let _ = ack_rx.recv_timeout(COMMAND_TIMEOUT);
                    }
                },
            );
            landed[i] = true;

            let g = group_of[i];
            if !started_groups[g] && plan.groups[g].iter().all(|&m| landed[m]) {
                started_groups[g] = true;
                for &m in order
                    .iter()
                    .filter(|&&m| !remote[m] && plan.groups[g].contains(&m))
                {
                    let om = &plan.offcodes[m];
                    for (channel, port) in &connected[m] {
                        let _ = self.oob.send(
                            &format!("{app}/{}", om.name),
                            OobMessage::ChannelAvailable {
                                channel: channel.clone(),
                                port: port.clone(),
                            },
                        );
                    }
                    let (rtx, rrx) = crossbeam_channel::bounded(1);
                    let fail = |error: String| DeployError::Offcode {
                        offcode: om.name.clone(),
                        pe: om.pe.clone(),
                        error,
                    };
                    execs[&exec_name(m)]
                        .tx
                        .send(Command::Start(om.name.clone(), rtx))
                        .map_err(|_| fail("executor is gone".into()))?;
                    rrx.recv_timeout(COMMAND_TIMEOUT)
                        .map_err(|_| fail("no answer from its executor".into()))?
                        .map_err(fail)?;
                }
            }
        }

        Ok(AppEntry {
            id,
            name: app.clone(),
            root,
            handles,
            executors: execs.into_values().map(|e| e.state).collect(),
            state: AppState::Running,
            started: Instant::now(),
            finished: None,
        })
    }

    /// Status of every app. Each offcode's counters are read live, one after
    /// another, so two offcodes of a running app are seen at slightly different
    /// moments; [`Runtime::stop_app_with_status`] gives figures that agree.
    pub fn status(&self) -> Vec<AppStatus> {
        self.apps().iter().map(app_status).collect()
    }

    /// Status of one app.
    pub fn status_of(&self, id: AppId) -> Option<AppStatus> {
        self.apps().iter().find(|a| a.id == id).map(app_status)
    }

    /// Finds an app by id or name.
    pub fn find(&self, which: &str) -> Option<AppId> {
        self.apps()
            .iter()
            .find(|a| a.name == which || a.id.to_string() == which)
            .map(|a| a.id)
    }

    /// Stops an app: tears down its resource tree (offcodes newest first, then
    /// executors) and forgets it. Returns the resources released, in order.
    pub fn stop_app(&self, id: AppId) -> Option<Vec<String>> {
        self.stop_app_with_status(id).map(|(released, _)| released)
    }

    /// [`Runtime::stop_app`], also returning the app's final status, read once
    /// every offcode has stopped: its counters no longer move, so they agree with
    /// one another (no sink ahead of its source).
    pub fn stop_app_with_status(&self, id: AppId) -> Option<(Vec<String>, AppStatus)> {
        let a = {
            let mut apps = self.apps();
            let pos = apps.iter().position(|a| a.id == id)?;
            let a = apps.remove(pos);
            // Tell every offcode still running first, so none mistakes a peer that
            // stops before it for a failure (finished ones keep their own ending).
            for h in a.handles.iter().filter(|h| !h.state().is_final()) {
                h.request_stop("app stopped");
            }
            a
        };
        let released = self.tree.teardown(a.root);
        self.events.emit(
            &a.name,
            "-",
            EventKind::App {
                message: format!("stopped; released {} resources", released.len()),
            },
        );
        let mut last = app_status(&a);
        if last.state == AppState::Running {
            last.state = AppState::Stopped;
        }
        Some((released, last))
    }

    /// Waits until the app has finished (every offcode done or stopped by the
    /// runtime). Returns false on timeout or if the app is unknown.
    pub fn wait_finished(&self, id: AppId, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.apps().iter().find(|a| a.id == id) {
                None => return false,
                Some(a) if a.state != AppState::Running => return true,
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops every app and the supervisor.
    pub fn shutdown(&self) {
        let ids: Vec<AppId> = self.apps().iter().map(|a| a.id).collect();
        for id in ids {
            self.stop_app(id);
        }
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self
            .supervisor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }

    fn supervise_once(&self) {
        let mut finished = Vec::new();
        {
            let mut apps = self.apps();
            for a in apps.iter_mut() {
                // Watchdog: an offcode whose current turn has overrun its period.
                for e in &a.executors {
                    if let Some((h, elapsed)) = e.running()
                        && let Some(wd) = h.watchdog
                        && elapsed > wd
                    {
                        h.expire_watchdog(&self.events, &a.name, wd, elapsed, || {
                            format!(
                                "watchdog: no progress for {} ms (period {} ms)",
                                elapsed.as_millis(),
                                wd.as_millis()
                            )
                        });
                    }
                }
                // Obsolete time, counted from landing.
                for h in &a.handles {
                    if let Some(life) = h.obsolete
                        && h.landed_at.elapsed() > life
                        && !h.state().is_final()
                        && h.stop_reason().is_none()
                    {
                        self.events.emit(
                            &a.name,
                            &h.name,
                            EventKind::Obsolete {
                                lifetime_ms: life.as_millis() as u64,
                            },
                        );
                        h.request_stop(format!("obsolete after {} ms", life.as_millis()));
                    }
                }
                if a.state == AppState::Running && a.handles.iter().all(|h| h.exited()) {
                    a.state = AppState::Finished;
                    a.finished = Some(Instant::now());
                    finished.push((a.root, a.name.clone()));
                }
            }
        }
        for (root, name) in finished {
            // Everything has stopped: release the executors and channels.
            self.tree.teardown(root);
            self.events.emit(
                &name,
                "-",
                EventKind::App {
                    message: "all offcodes finished".into(),
                },
            );
        }
    }
}

fn supervise(rt: Weak<Runtime>, stop: Arc<AtomicBool>, every: Duration) {
    while !stop.load(Ordering::Acquire) {
        match rt.upgrade() {
            Some(rt) => rt.supervise_once(),
            None => return,
        }
        std::thread::sleep(every);
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}
