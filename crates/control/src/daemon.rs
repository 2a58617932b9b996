//! The daemon: one runtime, the offcode library and this machine's PEs.
//! `up` loads a manifest, plans it against the PEs minus what running apps
//! already hold, and deploys it; `ps` and `down` report and stop apps.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sidecore_layout::SolveOptions;
use sidecore_offcode::Registry;
use sidecore_pe::{DiscoverOptions, Inventory};
use sidecore_runtime::{AppId, AppStatus, DeployError, Plan, PlanError, Runtime, RuntimeConfig};

use crate::protocol::{Request, Response};

/// How long the daemon waits for an offcode to answer a control message.
const CONTROL_ANSWER: Duration = Duration::from_secs(5);

/// Why the daemon refused a request.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The manifest was rejected; the diagnostics, rendered with file:line.
    #[error("{0}")]
    Manifest(String),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Deploy(#[from] DeployError),
    #[error("no app named `{0}` (see `sidecore ps`)")]
    NoApp(String),
}

/// How the daemon discovers, solves and runs.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    pub discover: DiscoverOptions,
    pub solve: SolveOptions,
    pub runtime: RuntimeConfig,
}

/// What `up` did.
#[derive(Debug, Clone)]
pub struct UpReport {
    pub id: AppId,
    pub app: String,
    /// (offcode, PE, reason) in manifest order.
    pub placements: Vec<(String, String, String)>,
}

/// What one offcode of a running app holds: (PE id, cpu share, memory).
pub(crate) type Hold = (String, f64, u64);

/// The daemon.
pub struct Daemon {
    rt: Arc<Runtime>,
    registry: Registry,
    opts: DaemonOptions,
    inventory: Mutex<Option<Inventory>>,
    /// What each running app holds: PE id → (cpu, memory).
    held: Mutex<BTreeMap<AppId, Vec<Hold>>>,
    /// The manifest each app was deployed from by [`Daemon::up`] (for re-placement).
    manifests: Mutex<BTreeMap<AppId, std::path::PathBuf>>,
    /// Held while a dead PE's apps are re-placed: one declaration at a time.
    pub(crate) replacing: Mutex<()>,
    shutdown: (Mutex<bool>, Condvar),
}

impl Daemon {
    /// A daemon with its own runtime.
    pub fn new(registry: Registry, opts: DaemonOptions) -> Arc<Daemon> {
        Arc::new(Daemon {
            rt: Runtime::new(opts.runtime.clone()),
            registry,
            opts,
            inventory: Mutex::new(None),
            held: Mutex::new(BTreeMap::new()),
            manifests: Mutex::new(BTreeMap::new()),
            replacing: Mutex::new(()),
            shutdown: (Mutex::new(false), Condvar::new()),
        })
    }

    /// The runtime.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// What the node listener calls for a `deploy` request: deploys the part of
    /// an origin's app into this daemon's runtime and holds its lease.
    pub fn deploy_handler(self: &Arc<Self>) -> crate::node::DeployHandler {
        let d = Arc::clone(self);
        Arc::new(move |link, part, stop| {
            sidecore_runtime::node::peer::serve(&d.rt, &d.registry, link, part, stop);
        })
    }

    /// The offcode library.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The machine's PEs (probed once).
    pub fn inventory(&self) -> Inventory {
        let mut inv = self
            .inventory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inv.get_or_insert_with(|| sidecore_pe::discover(&self.opts.discover))
            .clone()
    }

    /// The PEs with what running apps hold subtracted, without those an Orion
    /// monitor of this process declared dead.
    fn free_inventory(&self) -> Inventory {
        let mut inv = self.inventory();
        inv.pes.retain(|p| !sidecore_orion::health::is_dead(&p.id));
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (pe, cpu, mem) in held.values().flatten() {
            if let Some(p) = inv.pes.iter_mut().find(|p| &p.id == pe) {
                p.capacity.cpu = (p.capacity.cpu - cpu).max(0.0);
                p.capacity.memory_bytes = p.capacity.memory_bytes.saturating_sub(*mem);
            }
        }
        inv
    }

    /// Loads, plans and deploys a manifest.
    pub fn up(&self, path: &Path) -> Result<UpReport, DaemonError> {
        let manifest =
            sidecore_manifest::load(path).map_err(|e| DaemonError::Manifest(e.render(false)))?;
        let plan = self.plan(&manifest)?;
        let r = self.deploy(&manifest, &plan)?;
        self.manifests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(r.id, path.to_owned());
        Ok(r)
    }

    /// The apps deployed from manifests, and their paths.
    pub fn manifests(&self) -> Vec<(AppId, std::path::PathBuf)> {
        self.manifests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(id, p)| (*id, p.clone()))
            .collect()
    }

    /// Plans a loaded manifest against the free PEs.
    pub fn plan(&self, manifest: &sidecore_manifest::Manifest) -> Result<Plan, DaemonError> {
        self.plan_held(manifest, &[])
    }

    /// [`Daemon::plan`] with some offcodes held to the PEs named, as
    /// (offcode, PE id).
    pub fn plan_held(
        &self,
        manifest: &sidecore_manifest::Manifest,
        held: &[(String, String)],
    ) -> Result<Plan, DaemonError> {
        Ok(sidecore_runtime::plan_manifest_held(
            manifest,
            &self.free_inventory(),
            &self.registry,
            &self.opts.solve,
            held,
        )?)
    }

    /// Deploys a plan made from `manifest`.
    pub fn deploy(
        &self,
        manifest: &sidecore_manifest::Manifest,
        plan: &Plan,
    ) -> Result<UpReport, DaemonError> {
        let id = self.rt.deploy(plan)?;
        self.hold(id, manifest, plan);
        Ok(UpReport {
            id,
            app: plan.app.clone(),
            placements: plan
                .offcodes
                .iter()
                .map(|o| (o.name.clone(), o.pe.clone(), o.reason.clone()))
                .collect(),
        })
    }

    /// Records what app `id`, placed by `plan`, holds on each PE.
    pub(crate) fn hold(&self, id: AppId, manifest: &sidecore_manifest::Manifest, plan: &Plan) {
        let holds = plan
            .offcodes
            .iter()
            .zip(&manifest.offcodes)
            .map(|(p, m)| {
                let t = m.target(p.pe_kind);
                (
                    p.pe.clone(),
                    t.and_then(|t| t.cpu).unwrap_or(m.cpu),
                    t.and_then(|t| t.memory).unwrap_or(m.memory),
                )
            })
            .collect();
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, holds);
    }

    /// Sets aside what app `id` holds (while it is planned again); the caller
    /// gives it back with [`Daemon::restore_holds`] or replaces it with
    /// [`Daemon::hold`].
    pub(crate) fn release_holds(&self, id: AppId) -> Option<Vec<Hold>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id)
    }

    /// Gives back what [`Daemon::release_holds`] set aside.
    pub(crate) fn restore_holds(&self, id: AppId, held: Option<Vec<Hold>>) {
        if let Some(h) = held {
            self.held
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(id, h);
        }
    }

    /// The CPU share running apps hold on each PE (PE id → share).
    pub fn held_cpu(&self) -> BTreeMap<String, f64> {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = BTreeMap::new();
        for (pe, cpu, _) in held.values().flatten() {
            *out.entry(pe.clone()).or_insert(0.0) += cpu;
        }
        out
    }

    /// Status of every app.
    pub fn ps(&self) -> Vec<AppStatus> {
        self.rt.status()
    }

    /// Stops one app, or all. Returns the names stopped.
    pub fn down(&self, app: Option<&str>) -> Result<Vec<String>, DaemonError> {
        let ids: Vec<AppId> = match app {
            Some(which) => vec![
                self.rt
                    .find(which)
                    .ok_or_else(|| DaemonError::NoApp(which.to_string()))?,
            ],
            None => self.rt.status().into_iter().map(|a| a.id).collect(),
        };
        Ok(ids
            .into_iter()
            .filter_map(|id| self.stop(id).map(|s| s.name))
            .collect())
    }

    /// Stops one app and releases what it held; returns its final status, read
    /// once its offcodes have stopped (`None`: no such app).
    pub fn stop(&self, id: AppId) -> Option<AppStatus> {
        let last = self.rt.stop_app_with_status(id).map(|(_, s)| s);
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
        self.manifests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
        last
    }

    /// Answers one control request.
    pub fn handle(&self, req: Request) -> Response {
        match req {
            Request::Ping => Response::ok("pong"),
            Request::Up { manifest } => match self.up(Path::new(&manifest)) {
                Ok(r) => Response::Ok {
                    message: Some(format!("deployed {} (id {})", r.app, r.id)),
                    apps: self.rt.status_of(r.id).into_iter().collect(),
                    lines: r
                        .placements
                        .iter()
                        .map(|(o, pe, why)| format!("{o} → {pe}: {why}"))
                        .collect(),
                },
                Err(e) => Response::error(e.to_string()),
            },
            Request::Ps => Response::Ok {
                message: None,
                apps: self.ps(),
                lines: Vec::new(),
            },
            Request::Down { app } => match self.down(app.as_deref()) {
                Ok(v) if v.is_empty() => Response::ok("no apps were running"),
                Ok(v) => Response::ok(format!("stopped {}", v.join(", "))),
                Err(e) => Response::error(e.to_string()),
            },
            Request::Events { app, json } => {
                let evs = match &app {
                    Some(a) => self.rt.events().of_app(a),
                    None => self.rt.events().snapshot(),
                };
                Response::Ok {
                    message: None,
                    apps: Vec::new(),
                    lines: evs
                        .iter()
                        .map(|e| {
                            if json {
                                serde_json::to_string(e).unwrap_or_else(|e| {
                                    format!("{{\"error\":\"cannot serialise an event: {e}\"}}")
                                })
                            } else {
                                e.to_string()
                            }
                        })
                        .collect(),
                }
            }
            Request::Control { app, offcode, body } => {
                match self.rt.control(&app, &offcode, body, CONTROL_ANSWER) {
                    Ok(answer) => Response::ok(answer.to_string()),
                    Err(e) => Response::error(e.to_string()),
                }
            }
            Request::Shutdown => {
                self.request_shutdown();
                Response::ok("shutting down")
            }
        }
    }

    /// Asks whoever waits in [`wait_shutdown`](Self::wait_shutdown) to stop.
    pub fn request_shutdown(&self) {
        let (m, c) = &self.shutdown;
        *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        c.notify_all();
    }

    /// True once shutdown was requested.
    pub fn shutting_down(&self) -> bool {
        *self
            .shutdown
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a shutdown request; true if one came within `timeout`.
    pub fn wait_shutdown(&self, timeout: Duration) -> bool {
        let (m, c) = &self.shutdown;
        let g = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (g, _) = c
            .wait_timeout_while(g, timeout, |s| !*s)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *g
    }

    /// Stops every app and the runtime.
    pub fn stop_all(&self) {
        let _ = self.down(None);
        self.rt.shutdown();
    }
}
