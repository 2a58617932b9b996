//! TCPServers as offcodes, so that `sidecore up` deploys a server from a
//! manifest and the layout places it: the PPEs on dedicated cores, the
//! application beside them on an application core (the host).
//!
//! | name | PEs | what it is |
//! |---|---|---|
//! | `tcps-ppe` | core | one PPE, run by its core's executor ([`Ppe::turn`] each turn). `role = "master"` binds `listen`, accepts and serves every queue; `role = "helper"` joins AllowedPPE on its core and sleeps until ActivePPE grows onto it |
//! | `tcps-http` | host, core | the static HTTP/1.1 file server ([`HttpApp`]) over the regular files of `root` |
//! | `tcps-stream` | host, core | the block streamer ([`StreamApp`]): `block`-byte blocks of a `bytes`-byte in-memory file, one per acknowledgement |
//! | `tcps-autoscale` | host, core | grows and shrinks ActivePPE within AllowedPPE from the PPEs' load ([`crate::autoscale`]) |
//!
//! The offcodes of one server find each other by the `server` parameter
//! (default `"tcps"`) within their app: the master publishes its
//! [`TcpServers`] in a process-wide table under `app/server`, and the others
//! attach to it on their first turns (an error after [`ATTACH_TIMEOUT`] if no
//! master appears). They share no channel: connections come and go by the
//! hundred, each with rings of its own, which a manifest's fixed channels
//! cannot describe.
//!
//! ```toml
//! [[offcode]]
//! name = "ppe"
//! impl = "tcps-ppe"
//! params = { role = "master", listen = "127.0.0.1:8080" }
//!   [[offcode.target]]
//!   kind = "core"
//! [[offcode]]
//! name = "www"
//! impl = "tcps-http"
//! params = { root = "examples/tcps/www" }
//!   [[offcode.target]]
//!   kind = "host"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sidecore_offcode::{
    Implementation, InitCx, Interfaces, Metric, Offcode, OffcodeError, Progress, Registry, RunCx,
    parse_params,
};
use sidecore_types::PeKind;

use crate::apps::{HttpApp, HttpLimits, Pages, Site, StreamApp, read_pages};
use crate::autoscale::{Autoscaler, Decision, Policy, Sample};
use crate::conn::{App, BlobId};
use crate::ppe::{Ppe, Turn};
use crate::server::TcpServers;
use crate::shared::{Config, CoreSet};
use crate::{Backend, Snapshot};

/// The PPE's implementation name.
pub const PPE: &str = "tcps-ppe";
/// The file server's.
pub const HTTP: &str = "tcps-http";
/// The block streamer's.
pub const STREAM: &str = "tcps-stream";
/// The autoscaler's.
pub const AUTOSCALE: &str = "tcps-autoscale";
/// How long a helper PPE or an application waits for its master PPE.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a PPE offcode copies its counters into its metrics.
const METRICS_EVERY: Duration = Duration::from_millis(100);
/// Bounds of the streamer's file and block, bytes.
pub const MAX_STREAM_BYTES: u64 = 1 << 30;
/// Bounds of the file server's longest request head, bytes.
pub const MIN_HEAD_BYTES: usize = 256;
pub const MAX_HEAD_BYTES: usize = 1 << 20;
/// Bounds of the autoscaler's sampling interval, ms.
pub const MIN_INTERVAL_MS: u64 = 10;
pub const MAX_INTERVAL_MS: u64 = 60_000;

/// Servers of this process by `app/server`, as their master PPEs published them.
static SERVERS: Mutex<BTreeMap<String, Arc<TcpServers>>> = Mutex::new(BTreeMap::new());

fn table() -> std::sync::MutexGuard<'static, BTreeMap<String, Arc<TcpServers>>> {
    SERVERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn key(app: &str, server: &str) -> String {
    format!("{app}/{server}")
}

fn default_server() -> String {
    "tcps".into()
}

fn bad(msg: String) -> OffcodeError {
    OffcodeError::Params(msg)
}

/// Waits for the master of `server` in `app` to publish it.
struct Attach {
    key: String,
    server: String,
    since: Option<Instant>,
}

impl Attach {
    fn new(app: &str, server: &str) -> Attach {
        Attach {
            key: key(app, server),
            server: server.to_string(),
            since: None,
        }
    }

    /// The server once published; an error once [`ATTACH_TIMEOUT`] passed.
    fn poll(&mut self, now: Instant) -> Result<Option<Arc<TcpServers>>, OffcodeError> {
        if let Some(s) = table().get(&self.key) {
            return Ok(Some(Arc::clone(s)));
        }
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) > ATTACH_TIMEOUT {
            return Err(OffcodeError::failed(format!(
                "no master PPE of server `{}` appeared within {} s: give one `{PPE}` offcode of this app params `server = \"{}\"` and `role = \"master\"`",
                self.server,
                ATTACH_TIMEOUT.as_secs(),
                self.server
            )));
        }
        Ok(None)
    }
}

/// [`Attach::poll`] once `initialize` set the attach up; `None` before.
fn poll_attach(
    attach: &mut Option<Attach>,
    now: Instant,
) -> Result<Option<Arc<TcpServers>>, OffcodeError> {
    attach.as_mut().map_or(Ok(None), |a| a.poll(now))
}

// ---------------------------------------------------------------- tcps-ppe

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum RoleParam {
    #[default]
    Master,
    Helper,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum BackendParam {
    #[default]
    IoUring,
    Epoll,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PpeParams {
    #[serde(default = "default_server")]
    server: String,
    #[serde(default)]
    role: RoleParam,
    /// Master only: the address to listen on.
    listen: Option<String>,
    /// Master only.
    backend: Option<BackendParam>,
    /// Master only: never park (every PPE of the server).
    spin: Option<bool>,
    /// Master only: the control socket for `sidecore tcps stats|ppe`.
    control: Option<PathBuf>,
    /// Master only: idle and first-byte timeouts, ms.
    idle_timeout_ms: Option<u64>,
    first_byte_timeout_ms: Option<u64>,
}

/// Checked `tcps-ppe` parameters.
#[derive(Debug, Clone)]
struct PpeSettings {
    server: String,
    master: bool,
    listen: Option<SocketAddr>,
    backend: Backend,
    spin: bool,
    control: Option<PathBuf>,
    idle_timeout: Option<Duration>,
    first_byte_timeout: Option<Duration>,
}

fn ppe_settings(params: &toml::Table) -> Result<PpeSettings, OffcodeError> {
    let p: PpeParams = parse_params(params)?;
    let master = p.role == RoleParam::Master;
    if !master {
        let only = [
            ("listen", p.listen.is_some()),
            ("backend", p.backend.is_some()),
            ("spin", p.spin.is_some()),
            ("control", p.control.is_some()),
            ("idle_timeout_ms", p.idle_timeout_ms.is_some()),
            ("first_byte_timeout_ms", p.first_byte_timeout_ms.is_some()),
        ];
        if let Some((name, _)) = only.iter().find(|(_, given)| *given) {
            return Err(bad(format!(
                "`{name}` belongs on the master PPE: a helper (role = \"helper\") takes the server's settings from its master"
            )));
        }
    }
    let listen = match (&p.listen, master) {
        (Some(l), _) => Some(l.parse::<SocketAddr>().map_err(|e| {
            bad(format!(
                "`listen` = \"{l}\": {e} (expected IP:PORT, e.g. 127.0.0.1:8080)"
            ))
        })?),
        (None, true) => {
            return Err(bad(
                "`listen` is missing: the master PPE needs the address to listen on (IP:PORT)"
                    .into(),
            ));
        }
        (None, false) => None,
    };
    let ms = |name: &str, v: Option<u64>| match v {
        Some(0) => Err(bad(format!("`{name}` must be at least 1 ms"))),
        v => Ok(v.map(Duration::from_millis)),
    };
    Ok(PpeSettings {
        server: p.server,
        master,
        listen,
        backend: match p.backend.unwrap_or_default() {
            BackendParam::IoUring => Backend::IoUring { sqpoll: false },
            BackendParam::Epoll => Backend::Epoll,
        },
        spin: p.spin.unwrap_or(false),
        control: p.control,
        idle_timeout: ms("idle_timeout_ms", p.idle_timeout_ms)?,
        first_byte_timeout: ms("first_byte_timeout_ms", p.first_byte_timeout_ms)?,
    })
}

/// The core an offcode was placed on (`core:N`).
fn placed_cpu(cx: &InitCx<'_>, what: &str) -> Result<usize, OffcodeError> {
    let info = cx.info();
    info.pe
        .strip_prefix("core:")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&c| c <= CoreSet::MAX_CPU)
        .ok_or_else(|| {
            OffcodeError::failed(format!(
                "{what} runs on a dedicated core (a `core` target) and was placed on `{}`",
                info.pe
            ))
        })
}

enum PpeState {
    /// Not initialized yet.
    Unplaced,
    /// A helper waiting for its master to publish the server.
    Waiting(Attach),
    Running {
        server: Arc<TcpServers>,
        ppe: Box<Ppe>,
    },
}

struct PpeMetrics {
    active: Metric,
    conns: Metric,
    accepted: Metric,
    bytes_in: Metric,
    bytes_out: Metric,
    busy_ms: Metric,
    rq_full: Metric,
}

/// The `tcps-ppe` offcode.
pub struct PpeOffcode {
    settings: PpeSettings,
    cpu: usize,
    state: PpeState,
    metrics: Option<PpeMetrics>,
    last_metrics: Instant,
    /// The master's control socket thread and its stop flag.
    control: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    published: Option<String>,
}

impl PpeOffcode {
    fn new(params: &toml::Table) -> Result<PpeOffcode, OffcodeError> {
        Ok(PpeOffcode {
            settings: ppe_settings(params)?,
            cpu: 0,
            state: PpeState::Unplaced,
            metrics: None,
            last_metrics: Instant::now(),
            control: None,
            published: None,
        })
    }

    /// The master: bind, publish, serve the control socket.
    fn start_master(&mut self, app: &str) -> Result<(), OffcodeError> {
        let s = &self.settings;
        let listen = s
            .listen
            .ok_or_else(|| bad("`listen` is missing on the master PPE".into()))?;
        let allowed = CoreSet::of(&[self.cpu]).map_err(|e| OffcodeError::failed(e.to_string()))?;
        let mut cfg = Config::new(listen, allowed);
        cfg.master = self.cpu;
        // The executor already runs pinned to this core.
        cfg.pin = false;
        cfg.backend = s.backend;
        cfg.spin = s.spin;
        if let Some(t) = s.idle_timeout {
            cfg.idle_timeout = t;
        }
        if let Some(t) = s.first_byte_timeout {
            cfg.first_byte_timeout = t;
        }
        let k = key(app, &s.server);
        if table().contains_key(&k) {
            return Err(OffcodeError::failed(format!(
                "server `{}` of app `{app}` already has a master PPE: give each server one `role = \"master\"`",
                s.server
            )));
        }
        let (server, ppe) = TcpServers::hosted(cfg).map_err(|e| {
            OffcodeError::failed(format!("master PPE of server `{}`: {e}", s.server))
        })?;
        let server = Arc::new(server);
        if let Some(path) = &s.control {
            let stop = Arc::new(AtomicBool::new(false));
            let h = crate::ctl::serve(Arc::clone(&server), path, Arc::clone(&stop))
                .map_err(|e| OffcodeError::failed(format!("`control`: {e}")))?;
            self.control = Some((stop, h));
        }
        table().insert(k.clone(), Arc::clone(&server));
        self.published = Some(k);
        self.state = PpeState::Running {
            server,
            ppe: Box::new(ppe),
        };
        Ok(())
    }

    /// Copies the PPE's counters into its metrics, at most every
    /// [`METRICS_EVERY`] unless `force`.
    fn publish_metrics(&mut self, now: Instant, force: bool) {
        if !force && now.duration_since(self.last_metrics) < METRICS_EVERY {
            return;
        }
        self.last_metrics = now;
        let (Some(m), PpeState::Running { server, .. }) = (&self.metrics, &self.state) else {
            return;
        };
        let snap = server.stats();
        let Some(p) = snap.ppes.iter().find(|p| p.cpu == self.cpu) else {
            return;
        };
        m.active.set(u64::from(p.active));
        m.conns.set(p.conns);
        m.accepted.set(p.accepted);
        m.bytes_in.set(p.bytes_in);
        m.bytes_out.set(p.bytes_out);
        m.busy_ms.set(p.busy_ns / 1_000_000);
        m.rq_full.set(p.rq_full_stalls);
    }
}

impl Offcode for PpeOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.cpu = placed_cpu(cx, PPE)?;
        self.metrics = Some(PpeMetrics {
            active: cx.metric("active"),
            conns: cx.metric("conns"),
            accepted: cx.metric("accepted"),
            bytes_in: cx.metric("bytes_in"),
            bytes_out: cx.metric("bytes_out"),
            busy_ms: cx.metric("busy_ms"),
            rq_full: cx.metric("rq_full_stalls"),
        });
        let app = cx.info().app.clone();
        if self.settings.master {
            self.start_master(&app)
        } else {
            self.state = PpeState::Waiting(Attach::new(&app, &self.settings.server));
            Ok(())
        }
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let now = cx.now();
        if let PpeState::Waiting(a) = &mut self.state {
            let Some(server) = a.poll(now)? else {
                std::thread::sleep(Duration::from_millis(1));
                return Ok(Progress::Idle);
            };
            let ppe = server
                .join(self.cpu)
                .map_err(|e| OffcodeError::failed(format!("helper PPE: {e}")))?;
            self.state = PpeState::Running {
                server,
                ppe: Box::new(ppe),
            };
        }
        self.publish_metrics(now, false);
        let PpeState::Running { server, ppe } = &mut self.state else {
            return Ok(Progress::Idle);
        };
        if !server.is_running(self.cpu) {
            if server.is_stopping() {
                return Ok(Progress::Done);
            }
            // Dormant: in AllowedPPE, not in ActivePPE.
            ppe.doze();
            return Ok(Progress::Idle);
        }
        Ok(match ppe.turn() {
            Turn::Busy => Progress::Busy,
            Turn::Idle => Progress::Idle,
            Turn::Stopped if server.is_stopping() => Progress::Done,
            // Removed from ActivePPE: dormant from now on.
            Turn::Stopped => Progress::Idle,
        })
    }

    fn stop(&mut self, cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        // The counters at rest, before the server goes.
        self.publish_metrics(cx.now(), true);
        if let Some((stop, h)) = self.control.take() {
            stop.store(true, Ordering::Release);
            let _ = h.join();
        }
        if let Some(k) = self.published.take() {
            table().remove(&k);
        }
        let state = std::mem::replace(&mut self.state, PpeState::Unplaced);
        if let PpeState::Running { server, mut ppe } = state {
            if self.settings.master {
                server.shutdown();
                // Closes what this PPE still owns.
                ppe.turn();
            } else {
                server.leave(&mut ppe);
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- applications

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpParams {
    #[serde(default = "default_server")]
    server: String,
    root: PathBuf,
    #[serde(default = "default_head")]
    max_head_bytes: usize,
    #[serde(default = "default_head_timeout")]
    head_timeout_ms: u64,
}

fn default_head() -> usize {
    HttpLimits::default().max_head
}

fn default_head_timeout() -> u64 {
    HttpLimits::default().head_timeout.as_millis() as u64
}

fn http_params(params: &toml::Table) -> Result<HttpParams, OffcodeError> {
    let p: HttpParams = parse_params(params)?;
    if !(MIN_HEAD_BYTES..=MAX_HEAD_BYTES).contains(&p.max_head_bytes) {
        return Err(bad(format!(
            "`max_head_bytes` = {}: must be {MIN_HEAD_BYTES} to {MAX_HEAD_BYTES}",
            p.max_head_bytes
        )));
    }
    if p.head_timeout_ms == 0 {
        return Err(bad("`head_timeout_ms` must be at least 1".into()));
    }
    if !p.root.is_dir() {
        return Err(bad(format!(
            "`root` = \"{}\" is not a directory (paths are relative to where sidecore runs)",
            p.root.display()
        )));
    }
    Ok(p)
}

/// An application offcode's link to its server, once attached.
struct Attached<T> {
    server: Arc<TcpServers>,
    app: App,
    state: T,
}

impl<T> Attached<T> {
    /// A turn's outcome: busy if it did something, done once the server
    /// stops, else idle.
    fn progress(&self, did: bool) -> Progress {
        if did {
            Progress::Busy
        } else if self.server.is_stopping() {
            Progress::Done
        } else {
            Progress::Idle
        }
    }
}

/// The `tcps-http` offcode.
pub struct HttpOffcode {
    params: HttpParams,
    pages: Option<Pages>,
    attach: Option<Attach>,
    run: Option<Attached<(HttpApp, Site)>>,
    responses: Metric,
    conns: Metric,
}

impl HttpOffcode {
    fn new(params: &toml::Table) -> Result<HttpOffcode, OffcodeError> {
        Ok(HttpOffcode {
            params: http_params(params)?,
            pages: None,
            attach: None,
            run: None,
            responses: Metric::default(),
            conns: Metric::default(),
        })
    }
}

impl Offcode for HttpOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        let pages = read_pages(&self.params.root).map_err(|e| bad(format!("`root`: {e}")))?;
        self.pages = Some(pages);
        self.attach = Some(Attach::new(&cx.info().app, &self.params.server));
        self.responses = cx.metric("records");
        self.conns = cx.metric("conns");
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        if self.run.is_none() {
            let Some(server) = poll_attach(&mut self.attach, cx.now())? else {
                return Ok(Progress::Idle);
            };
            let site = Site::register(&server, self.pages.take().unwrap_or_default());
            let limits = HttpLimits {
                max_head: self.params.max_head_bytes,
                head_timeout: Duration::from_millis(self.params.head_timeout_ms),
            };
            let h = HttpApp::new(limits, server.counters());
            self.run = Some(Attached {
                app: server.app(),
                server,
                state: (h, site),
            });
        }
        let Some(r) = self.run.as_mut() else {
            return Ok(Progress::Idle);
        };
        let (h, site) = &mut r.state;
        let did = h.step(&r.app, site, None);
        self.responses.set(h.responses);
        self.conns.set(h.open() as u64);
        Ok(r.progress(did))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamParams {
    #[serde(default = "default_server")]
    server: String,
    #[serde(default = "default_stream_bytes")]
    bytes: u64,
    #[serde(default = "default_block")]
    block: u64,
}

fn default_stream_bytes() -> u64 {
    16 << 20
}

fn default_block() -> u64 {
    8192
}

fn stream_params(params: &toml::Table) -> Result<StreamParams, OffcodeError> {
    let p: StreamParams = parse_params(params)?;
    if p.bytes == 0 || p.bytes > MAX_STREAM_BYTES {
        return Err(bad(format!(
            "`bytes` = {}: must be 1 to {MAX_STREAM_BYTES}",
            p.bytes
        )));
    }
    if p.block == 0 || p.block > p.bytes {
        return Err(bad(format!(
            "`block` = {}: must be 1 to `bytes` ({})",
            p.block, p.bytes
        )));
    }
    Ok(p)
}

/// The streamer's file: byte `i` is `i % 251` (what clients check).
pub fn stream_file(bytes: u64) -> Vec<u8> {
    (0..bytes).map(|i| (i % 251) as u8).collect()
}

/// The `tcps-stream` offcode.
pub struct StreamOffcode {
    params: StreamParams,
    attach: Option<Attach>,
    run: Option<Attached<StreamApp>>,
    blocks: Metric,
    conns: Metric,
}

impl Offcode for StreamOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.attach = Some(Attach::new(&cx.info().app, &self.params.server));
        self.blocks = cx.metric("records");
        self.conns = cx.metric("conns");
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        if self.run.is_none() {
            let Some(server) = poll_attach(&mut self.attach, cx.now())? else {
                return Ok(Progress::Idle);
            };
            let p = &self.params;
            let blob: BlobId = server.register_blob(stream_file(p.bytes).into());
            self.run = Some(Attached {
                app: server.app(),
                state: StreamApp::new(blob, p.bytes, p.block),
                server,
            });
        }
        let Some(r) = self.run.as_mut() else {
            return Ok(Progress::Idle);
        };
        let did = r.state.step(&r.app, None);
        self.blocks.set(r.state.blocks);
        self.conns.set(r.state.open() as u64);
        Ok(r.progress(did))
    }
}

// ---------------------------------------------------------------- tcps-autoscale

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AutoscaleParams {
    #[serde(default = "default_server")]
    server: String,
    #[serde(default = "default_interval")]
    interval_ms: u64,
    high: Option<f64>,
    low: Option<f64>,
    up_after: Option<u32>,
    down_after: Option<u32>,
    cooldown: Option<u32>,
}

fn default_interval() -> u64 {
    100
}

fn autoscale_params(params: &toml::Table) -> Result<(AutoscaleParams, Policy), OffcodeError> {
    let p: AutoscaleParams = parse_params(params)?;
    if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&p.interval_ms) {
        return Err(bad(format!(
            "`interval_ms` = {}: must be {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS}",
            p.interval_ms
        )));
    }
    let d = Policy::default();
    let policy = Policy {
        high: p.high.unwrap_or(d.high),
        low: p.low.unwrap_or(d.low),
        up_after: p.up_after.unwrap_or(d.up_after),
        down_after: p.down_after.unwrap_or(d.down_after),
        cooldown: p.cooldown.unwrap_or(d.cooldown),
    };
    policy.validate().map_err(|e| bad(e.to_string()))?;
    Ok((p, policy))
}

struct AutoscaleMetrics {
    active: Metric,
    added: Metric,
    removed: Metric,
    refused: Metric,
    load_pct: Metric,
    samples: Metric,
}

/// The `tcps-autoscale` offcode: every `interval_ms` it reads each active
/// PPE's busy time, asks the [`Autoscaler`] and adds or removes a PPE.
pub struct AutoscaleOffcode {
    params: AutoscaleParams,
    scaler: Autoscaler,
    attach: Option<Attach>,
    server: Option<Arc<TcpServers>>,
    last: Option<(Instant, Snapshot)>,
    metrics: Option<AutoscaleMetrics>,
}

impl AutoscaleOffcode {
    fn new(params: &toml::Table) -> Result<AutoscaleOffcode, OffcodeError> {
        let (params, policy) = autoscale_params(params)?;
        Ok(AutoscaleOffcode {
            params,
            scaler: Autoscaler::new(policy),
            attach: None,
            server: None,
            last: None,
            metrics: None,
        })
    }

    /// One interval's sample from two snapshots `dt` apart.
    fn sample(before: &Snapshot, now: &Snapshot, dt: Duration) -> Sample {
        let dt_ns = dt.as_nanos().max(1) as f64;
        let active = CoreSet::of(&now.active_ppe).unwrap_or_default();
        let ppes = now
            .ppes
            .iter()
            .filter(|p| active.contains(p.cpu))
            .map(|p| {
                let b0 = before
                    .ppes
                    .iter()
                    .find(|q| q.cpu == p.cpu)
                    .map_or(0, |q| q.busy_ns);
                (p.cpu, p.busy_ns.saturating_sub(b0) as f64 / dt_ns, p.conns)
            })
            .collect();
        Sample {
            allowed: CoreSet::of(&now.allowed_ppe).unwrap_or_default(),
            active,
            master: now.master,
            ppes,
        }
    }

    fn act(&mut self, server: &TcpServers, d: Decision) {
        let Some(m) = &self.metrics else {
            return;
        };
        let r = match d {
            Decision::Hold => return,
            Decision::Add(cpu) => server.add_ppe(cpu).map(|()| m.added.add(1)),
            Decision::Remove(cpu) => server.remove_ppe(cpu).map(|()| m.removed.add(1)),
        };
        if let Err(e) = r {
            eprintln!("{AUTOSCALE}: {d:?} refused: {e}");
            m.refused.add(1);
            self.scaler.failed();
        }
    }
}

impl Offcode for AutoscaleOffcode {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        self.attach = Some(Attach::new(&cx.info().app, &self.params.server));
        self.metrics = Some(AutoscaleMetrics {
            active: cx.metric("active_ppes"),
            added: cx.metric("added"),
            removed: cx.metric("removed"),
            refused: cx.metric("refused"),
            load_pct: cx.metric("load_pct"),
            samples: cx.metric("samples"),
        });
        Ok(())
    }

    fn poll(&mut self, cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        let now = cx.now();
        if self.server.is_none() {
            self.server = poll_attach(&mut self.attach, now)?;
        }
        let Some(server) = self.server.clone() else {
            return Ok(Progress::Idle);
        };
        if server.is_stopping() {
            return Ok(Progress::Done);
        }
        let interval = Duration::from_millis(self.params.interval_ms);
        if self
            .last
            .as_ref()
            .is_some_and(|(t, _)| now.duration_since(*t) < interval)
        {
            return Ok(Progress::Idle);
        }
        let snap = server.stats();
        let Some((t0, before)) = self.last.replace((now, snap.clone())) else {
            return Ok(Progress::Idle);
        };
        let s = Self::sample(&before, &snap, now.duration_since(t0));
        if let Some(m) = &self.metrics {
            m.samples.add(1);
            m.load_pct.set((s.mean_load() * 100.0).round() as u64);
        }
        let d = self.scaler.observe(&s);
        self.act(&server, d);
        if let Some(m) = &self.metrics {
            m.active.set(server.active().len() as u64);
        }
        Ok(if d == Decision::Hold {
            Progress::Idle
        } else {
            Progress::Busy
        })
    }
}

// ---------------------------------------------------------------- registration

/// Adds `tcps-ppe`, `tcps-http`, `tcps-stream` and `tcps-autoscale` to `reg`.
pub fn register(reg: &mut Registry) {
    let none = || Some(Vec::new());
    reg.register(Implementation {
        name: PPE.into(),
        description: "TCPServers' packet processing engine on a dedicated core: owns the listening and connected sockets (role = \"master\": listen, accept, every queue; \"helper\": Ready only, dormant until ActivePPE grows onto its core)".into(),
        kinds: vec![PeKind::Core],
        inputs: none(),
        outputs: none(),
        factory: Arc::new(|spec| Ok(Box::new(PpeOffcode::new(spec.params)?))),
        validate: Some(Arc::new(|p| ppe_settings(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: HTTP.into(),
        description: "static HTTP/1.1 file server on TCPServers: the regular files of `root`, in memory, sent by the PPEs without copying".into(),
        kinds: vec![PeKind::Host, PeKind::Core],
        inputs: none(),
        outputs: none(),
        factory: Arc::new(|spec| Ok(Box::new(HttpOffcode::new(spec.params)?))),
        validate: Some(Arc::new(|p| http_params(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: STREAM.into(),
        description: "the TCPServers block streamer: `block`-byte blocks of an in-memory file, the next on each acknowledgement byte".into(),
        kinds: vec![PeKind::Host, PeKind::Core],
        inputs: none(),
        outputs: none(),
        factory: Arc::new(|spec| {
            Ok(Box::new(StreamOffcode {
                params: stream_params(spec.params)?,
                attach: None,
                run: None,
                blocks: Metric::default(),
                conns: Metric::default(),
            }))
        }),
        validate: Some(Arc::new(|p| stream_params(p).map(drop))),
        interfaces: Interfaces::default(),
    });
    reg.register(Implementation {
        name: AUTOSCALE.into(),
        description: "grows ActivePPE within AllowedPPE when the PPEs are saturated and shrinks it when they idle, with hysteresis".into(),
        kinds: vec![PeKind::Host, PeKind::Core],
        inputs: none(),
        outputs: none(),
        factory: Arc::new(|spec| Ok(Box::new(AutoscaleOffcode::new(spec.params)?))),
        validate: Some(Arc::new(|p| autoscale_params(p).map(drop))),
        interfaces: Interfaces::default(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_of(text: &str) -> toml::Table {
        text.parse().unwrap_or_default()
    }

    fn err(r: Result<impl Sized, OffcodeError>) -> String {
        match r {
            Ok(_) => String::from("(accepted)"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn ppe_params_name_what_is_wrong() {
        assert!(err(ppe_settings(&table_of("role = \"master\""))).contains("`listen` is missing"));
        assert!(
            err(ppe_settings(&table_of("listen = \"localhost\"")))
                .contains("`listen` = \"localhost\"")
        );
        assert!(
            err(ppe_settings(&table_of(
                "role = \"helper\"\nlisten = \"127.0.0.1:1\""
            )))
            .contains("`listen` belongs on the master")
        );
        assert!(err(ppe_settings(&table_of("role = \"boss\""))).contains("boss"));
        assert!(
            err(ppe_settings(&table_of(
                "listen = \"127.0.0.1:1\"\nport = 3"
            )))
            .contains("port")
        );
        let ok = ppe_settings(&table_of(
            "listen = \"127.0.0.1:1\"\nbackend = \"epoll\"\nidle_timeout_ms = 500",
        ));
        assert!(
            ok.as_ref()
                .is_ok_and(|s| s.master && s.backend == Backend::Epoll)
        );
        assert!(ppe_settings(&table_of("role = \"helper\"")).is_ok());
    }

    #[test]
    fn app_params_name_what_is_wrong() {
        assert!(err(http_params(&table_of("root = \"/no/such/dir\""))).contains("`root`"));
        assert!(
            err(http_params(&table_of("root = \"/\"\nmax_head_bytes = 10")))
                .contains("`max_head_bytes` = 10")
        );
        assert!(err(stream_params(&table_of("bytes = 0"))).contains("`bytes` = 0"));
        assert!(
            err(stream_params(&table_of("bytes = 100\nblock = 200"))).contains("`block` = 200")
        );
        assert!(err(autoscale_params(&table_of("high = 0.5\nlow = 0.6"))).contains("`low` = 0.6"));
        assert!(err(autoscale_params(&table_of("interval_ms = 1"))).contains("`interval_ms` = 1"));
        assert!(autoscale_params(&table_of("")).is_ok());
    }

    #[test]
    fn every_implementation_is_registered_with_its_kinds() {
        let mut r = Registry::new();
        register(&mut r);
        for name in [PPE, HTTP, STREAM, AUTOSCALE] {
            assert!(r.get(name).is_some(), "{name} registered");
        }
        assert_eq!(
            r.get(PPE).map(|i| i.kinds.clone()),
            Some(vec![PeKind::Core])
        );
    }
}
