//! The [`Runtime`]: the apps a daemon runs. It starts plans ([`crate::start`]),
//! keeps each app's entry, runs the supervisor thread ([`crate::supervisor`])
//! over them, and reports and stops them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use sidecore_channel::oob::{OobDirectory, OobMessage};
use sidecore_types::{AppId, AppState, AppStatus};

use crate::app::AppEntry;
use crate::error::{ControlError, DeployError};
use crate::events::{EventKind, EventLog};
use crate::executor::IdlePolicy;
use crate::plan::Plan;
use crate::start::{self, Delegated, Env};
use crate::supervisor;
use crate::transport::Attachment;
use crate::tree::ResourceTree;

/// How often [`Runtime::wait_finished`] looks.
const WAIT_POLL: Duration = Duration::from_millis(2);

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

/// The runtime: deploys apps and supervises them.
pub struct Runtime {
    config: RuntimeConfig,
    events: EventLog,
    oob: OobDirectory,
    tree: ResourceTree,
    apps: Mutex<Vec<AppEntry>>,
    next_id: AtomicU64,
    /// Numbers the reply endpoints of control messages.
    next_control: AtomicU64,
    stop: Arc<AtomicBool>,
    supervisor: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Runtime {
    /// Starts a runtime (and its supervisor thread).
    ///
    /// # Panics
    /// If the supervisor thread cannot be spawned: a runtime without one
    /// would run offcodes nobody watches.
    pub fn new(config: RuntimeConfig) -> Arc<Runtime> {
        let rt = Arc::new(Runtime {
            config,
            events: EventLog::new(),
            oob: OobDirectory::new(),
            tree: ResourceTree::new(),
            apps: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            next_control: AtomicU64::new(1),
            stop: Arc::new(AtomicBool::new(false)),
            supervisor: Mutex::new(None),
        });
        let weak = Arc::downgrade(&rt);
        let stop = Arc::clone(&rt.stop);
        let every = rt.config.supervise_every;
        let h = std::thread::Builder::new()
            .name("sc-supervisor".into())
            .spawn(move || supervise(&weak, &stop, every))
            .expect("spawn the supervisor thread");
        *rt.supervisor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(h);
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

    /// What the start stage uses of this runtime.
    pub(crate) fn env(&self) -> Env<'_> {
        Env {
            idle: self.config.idle,
            events: &self.events,
            oob: &self.oob,
            tree: &self.tree,
        }
    }

    pub(crate) fn apps(&self) -> MutexGuard<'_, Vec<AppEntry>> {
        self.apps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Deploys a plan. Parts placed on peer nodes are handed to those peers
    /// (see [`crate::node`]). On error nothing of it is left running, here or
    /// on the peers.
    pub fn deploy(&self, plan: &Plan) -> Result<AppId, DeployError> {
        self.deploy_with(plan, Delegated::Plan)
    }

    /// Deploys a plan whose crossing channels are already connected: the part
    /// of a remote app that a peer node runs here.
    pub fn deploy_attached(
        &self,
        plan: &Plan,
        attachments: Vec<Attachment>,
    ) -> Result<AppId, DeployError> {
        self.deploy_with(plan, Delegated::Done(attachments))
    }

    fn deploy_with(&self, plan: &Plan, delegated: Delegated) -> Result<AppId, DeployError> {
        if self
            .apps()
            .iter()
            .any(|a| a.name == plan.app && a.state == AppState::Running)
        {
            return Err(DeployError::Duplicate(plan.app.clone()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = start::start(&self.env(), plan, id, delegated)?;
        self.apps().push(entry);
        Ok(id)
    }

    /// Status of every app. Each offcode's counters are read live, one after
    /// another, so two offcodes of a running app are seen at slightly different
    /// moments; [`Runtime::stop_app_with_status`] gives figures that agree.
    pub fn status(&self) -> Vec<AppStatus> {
        self.apps().iter().map(AppEntry::status).collect()
    }

    /// Status of one app.
    pub fn status_of(&self, id: AppId) -> Option<AppStatus> {
        self.apps()
            .iter()
            .find(|a| a.id == id)
            .map(AppEntry::status)
    }

    /// Finds an app by id or name.
    pub fn find(&self, which: &str) -> Option<AppId> {
        self.apps()
            .iter()
            .find(|a| a.name == which || a.id.to_string() == which)
            .map(|a| a.id)
    }

    /// Sends an application-level control message to one offcode of a running
    /// app over its out-of-band channel and waits up to `timeout` for its
    /// answer (HYDRA's OOB channel; the firewall reloads its rules this way).
    pub fn control(
        &self,
        app: &str,
        offcode: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, ControlError> {
        let id = self
            .find(app)
            .ok_or_else(|| ControlError::NoApp(app.to_string()))?;
        let status = self
            .status_of(id)
            .ok_or_else(|| ControlError::NoApp(app.to_string()))?;
        if !status.offcodes.iter().any(|o| o.name == offcode) {
            return Err(ControlError::NoOffcode {
                app: app.to_string(),
                offcode: offcode.to_string(),
                known: status
                    .offcodes
                    .iter()
                    .map(|o| o.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let to = format!("{}/{offcode}", status.name);
        let n = self.next_control.fetch_add(1, Ordering::Relaxed);
        let me = self
            .oob
            .open(&format!("control/{n}"))
            .map_err(|e| ControlError::Oob(to.clone(), e))?;
        self.oob
            .send(
                &to,
                OobMessage::Control {
                    from: me.name().to_string(),
                    body,
                },
            )
            .map_err(|e| ControlError::Oob(to.clone(), e))?;
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match me.recv_timeout(left) {
                Some(OobMessage::Control { body, .. }) => return Ok(body),
                Some(_) => {}
                None => break,
            }
        }
        Err(ControlError::NoAnswer(to, timeout))
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
        let mut last = a.status();
        if last.state == AppState::Running {
            last.state = AppState::Stopped;
        }
        Some((released, last))
    }

    /// Fails now, with the declaration as the reason, every offcode running
    /// here on a PE an Orion monitor declared dead (the supervisor does it at
    /// its next sweep too; this is for whoever acts on the declaration first).
    pub fn fail_on_dead_pes(&self) {
        for a in self.apps().iter().filter(|a| a.state == AppState::Running) {
            crate::dead::sweep(a, &self.events);
        }
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
            std::thread::sleep(WAIT_POLL);
        }
    }

    /// Stops every app and the supervisor.
    pub fn shutdown(&self) {
        let ids: Vec<AppId> = self.apps().iter().map(|a| a.id).collect();
        for id in ids {
            self.stop_app(id);
        }
        self.stop.store(true, Ordering::Release);
        let h = self
            .supervisor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(h) = h
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }

    /// One supervisor sweep; apps that just finished release their executors
    /// and channels.
    fn supervise_once(&self) {
        let finished = supervisor::sweep(&mut self.apps(), &self.events);
        for (root, name) in finished {
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

/// The supervisor thread: sweeps until the runtime stops or is dropped.
fn supervise(rt: &Weak<Runtime>, stop: &AtomicBool, every: Duration) {
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
