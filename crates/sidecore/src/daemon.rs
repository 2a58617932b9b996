//! `sidecore daemon`: the daemon in the foreground (control socket, the
//! metrics and dashboard listener, and with `--listen` the node listener for
//! peers), its configuration file and SIGHUP reload; and starting one in the
//! background for `sidecore up -d`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sidecore_control::node::{Handlers, NodeListener};
use sidecore_control::{ControlServer, Daemon, Request};
use sidecore_observe::http::HttpServer;
use sidecore_observe::hub::Hub;

use crate::args::{PeArgs, SocketArgs, daemon_options, registry};
use crate::daemon_config::{DEFAULT_HTTP, DaemonConfig};

/// How long a background daemon may take to answer its first ping.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How often to look for a shutdown request or a signal.
const WAIT_POLL: Duration = Duration::from_millis(100);

#[derive(clap::Args, Debug)]
pub struct DaemonArgs {
    #[command(flatten)]
    socket: SocketArgs,
    /// Also listen for peer nodes on this address (e.g. `0.0.0.0:7400`).
    #[arg(long)]
    listen: Option<String>,
    /// This node's name, as peers see it.
    #[arg(long)]
    name: Option<String>,
    /// Busy-poll on idle cores.
    #[arg(long)]
    spin: bool,
    /// Orion's watch of the dedicated cores: refresh period in ms, 0 turns it
    /// off [default: 25].
    #[arg(long)]
    core_refresh_ms: Option<u64>,
    /// Refreshes without progress before a core is declared dead [default: 8].
    #[arg(long)]
    core_k: Option<u32>,
    /// Serve /metrics and the dashboard here [default: 127.0.0.1:9464]; `off` disables.
    #[arg(long)]
    http: Option<String>,
    /// Allow --http on an address beyond loopback.
    #[arg(long)]
    http_expose: bool,
    /// A service's metrics to scrape and show, NAME=ADDR (repeatable), e.g.
    /// `filewall=127.0.0.1:9465` for `filewall run --metrics 127.0.0.1:9465`.
    #[arg(long = "service")]
    services: Vec<sidecore_observe::services::ServiceSpec>,
    /// Configuration file (see dist/sidecore.toml); flags override it.
    #[arg(long, env = "SIDECORE_CONFIG")]
    config: Option<PathBuf>,
    /// Validate the configuration file and exit (status 2 when it is bad).
    #[arg(long, requires = "config")]
    check_config: bool,
    #[command(flatten)]
    pe: PeArgs,
}

/// The settings in force: the file's, with the flags on top.
fn settings(args: &DaemonArgs) -> anyhow::Result<(DaemonConfig, PeArgs)> {
    let mut c = match &args.config {
        Some(p) => DaemonConfig::load(p)?,
        None => DaemonConfig::default(),
    };
    if args.socket.socket.is_some() {
        c.socket.clone_from(&args.socket.socket);
    }
    if args.listen.is_some() {
        c.listen.clone_from(&args.listen);
    }
    if args.name.is_some() {
        c.name.clone_from(&args.name);
    }
    if args.http.is_some() {
        c.http.clone_from(&args.http);
    }
    c.http_expose |= args.http_expose;
    c.services.extend(args.services.iter().cloned());
    c.spin |= args.spin;
    if args.core_refresh_ms.is_some() {
        c.core_refresh_ms = args.core_refresh_ms;
    }
    if args.core_k.is_some() {
        c.core_k = args.core_k;
    }
    let pe = PeArgs {
        nodes: args.pe.nodes.clone().or_else(|| c.nodes.clone()),
        housekeeping: args
            .pe
            .housekeeping
            .clone()
            .or_else(|| c.housekeeping.clone()),
    };
    Ok((c, pe))
}

pub fn run(args: &DaemonArgs) -> anyhow::Result<ExitCode> {
    if args.check_config {
        return Ok(check_config(args));
    }
    let (cfg, pe) = settings(args)?;
    let d = Daemon::new(registry(), daemon_options(&pe, cfg.spin)?);
    let socket = cfg
        .socket
        .clone()
        .unwrap_or_else(sidecore_control::default_socket);
    let mut server = ControlServer::start(Arc::clone(&d), &socket)?;
    let name = cfg.name.as_deref().unwrap_or("local");
    // Orion: this node's heartbeat and counters for monitors elsewhere, and the
    // declarations of monitors here re-place the dead PE's apps.
    let sensors = Arc::new(sidecore_orion::node_sensors::NodeSensors::start(name)?);
    d.follow_health();
    let _cores = watch_cores(&cfg, name, &d)?;
    let node = match &cfg.listen {
        Some(addr) => Some(NodeListener::start_with(
            addr,
            name,
            Handlers {
                deploy: Some(d.deploy_handler()),
                sense: Some(Arc::new(move |req| sensors.view(req))),
                mx: Some(crate::exec_remote::handler(name)?),
            },
        )?),
        None => None,
    };
    d.runtime().events().subscribe(|e| eprintln!("{e}"));
    let hub = Hub::start(Arc::clone(&d), cfg.services.clone());
    let http = start_http(&hub, &cfg)?;
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&term))?;
    }
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup))?;
    eprintln!(
        "sidecore daemon on {}{}{}",
        socket.display(),
        node.as_ref()
            .map(|n| format!(", node listener on {}", n.addr()))
            .unwrap_or_default(),
        http.as_ref()
            .map(|h| format!(", metrics and dashboard on http://{}/", h.addr()))
            .unwrap_or_default()
    );
    let mut declared = BTreeMap::new();
    apply_apps(&d, &cfg.apps, &mut declared);
    while !term.load(Ordering::Acquire) && !d.wait_shutdown(WAIT_POLL) {
        if hup.swap(false, Ordering::AcqRel) {
            reload(args, &cfg, &d, &mut declared);
        }
    }
    hub.stop();
    drop(http);
    d.stop_all();
    server.stop();
    drop(node);
    eprintln!("sidecore daemon stopped");
    Ok(ExitCode::SUCCESS)
}

/// Orion's watch of this node's dedicated cores (declarations go to the health
/// board, which `follow_health` hears); its other notes go to the event log.
fn watch_cores(
    cfg: &DaemonConfig,
    name: &str,
    d: &Daemon,
) -> anyhow::Result<Option<sidecore_orion::core_monitor::CoreMonitor>> {
    use crate::daemon_config::{DEFAULT_CORE_K, DEFAULT_CORE_REFRESH_MS};
    use sidecore_orion::core_watch::CoreNote;
    let refresh_ms = cfg.core_refresh_ms.unwrap_or(DEFAULT_CORE_REFRESH_MS);
    if refresh_ms == 0 {
        return Ok(None);
    }
    let k = cfg.core_k.unwrap_or(DEFAULT_CORE_K);
    let lc = sidecore_orion::detect::LivenessConfig::new(refresh_ms * 1_000_000, k)?;
    let events = d.runtime().events().clone();
    let sink = Box::new(move |n: &CoreNote| {
        if let CoreNote::Stuck { cpu, tids } = n {
            let message = format!(
                "threads {tids:?} on core {cpu} are inside an offcode with flat ticks while the \
                 core runs them: a stuck offcode (its watchdog's case), not a dead core"
            );
            events.emit(
                sidecore_control::replace::EVENTS_APP,
                &sidecore_orion::core_monitor::core_pe(*cpu),
                sidecore_runtime::EventKind::App { message },
            );
        }
    });
    Ok(Some(sidecore_orion::core_monitor::CoreMonitor::start(
        lc, name, sink,
    )?))
}

fn check_config(args: &DaemonArgs) -> ExitCode {
    match settings(args) {
        Ok((c, _)) => {
            let path = args.config.as_deref().unwrap_or(Path::new("-"));
            println!(
                "{}: ok — {} app(s), metrics and dashboard on {}",
                path.display(),
                c.apps.len(),
                c.http.as_deref().unwrap_or(DEFAULT_HTTP)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn start_http(hub: &Arc<Hub>, cfg: &DaemonConfig) -> anyhow::Result<Option<HttpServer>> {
    let spec = cfg.http.as_deref().unwrap_or(DEFAULT_HTTP);
    if spec == "off" {
        return Ok(None);
    }
    let addr: SocketAddr = spec
        .parse()
        .with_context(|| format!("--http `{spec}` is not an address"))?;
    match HttpServer::start(Arc::clone(hub), addr, cfg.http_expose) {
        Ok(s) => Ok(Some(s)),
        // Only the default address may be taken by another daemon on this
        // machine (tests, `up -d` with another socket); an address the user
        // chose must be served or the start fails.
        Err(sidecore_observe::http::HttpError::Bind { addr, source })
            if cfg.http.is_none() && source.kind() == std::io::ErrorKind::AddrInUse =>
        {
            eprintln!(
                "warning: {addr} is taken (another daemon?): running without metrics and dashboard; pass --http ADDR to choose another"
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// SIGHUP: re-reads the file; a bad file is reported and changes nothing.
fn reload(
    args: &DaemonArgs,
    old: &DaemonConfig,
    d: &Daemon,
    declared: &mut BTreeMap<PathBuf, String>,
) {
    let Some(path) = &args.config else {
        eprintln!("SIGHUP: no --config file to reload");
        return;
    };
    match settings(args) {
        Ok((new, _)) => {
            if (&new.socket, &new.listen, &new.http, new.spin)
                != (&old.socket, &old.listen, &old.http, old.spin)
            {
                eprintln!(
                    "SIGHUP: socket, listen, http and spin changes take effect when the daemon restarts"
                );
            }
            apply_apps(d, &new.apps, declared);
            eprintln!("SIGHUP: reloaded {}", path.display());
        }
        Err(e) => eprintln!("SIGHUP: kept the running configuration: {e:#}"),
    }
}

/// Deploys the declared apps not yet running and stops the ones no longer
/// declared. `declared` maps each manifest to the app it deployed.
fn apply_apps(d: &Daemon, apps: &[PathBuf], declared: &mut BTreeMap<PathBuf, String>) {
    let gone: Vec<PathBuf> = declared
        .keys()
        .filter(|p| !apps.contains(p))
        .cloned()
        .collect();
    for p in gone {
        if let Some(app) = declared.remove(&p) {
            match d.down(Some(&app)) {
                Ok(_) => eprintln!(
                    "config: stopped {app} ({} is no longer listed)",
                    p.display()
                ),
                Err(e) => eprintln!("config: cannot stop {app}: {e}"),
            }
        }
    }
    for p in apps {
        if declared.contains_key(p) {
            continue;
        }
        match d.up(p) {
            Ok(r) => {
                eprintln!("config: deployed {} from {}", r.app, p.display());
                declared.insert(p.clone(), r.app);
            }
            Err(e) => eprintln!("config: cannot deploy {}: {e}", p.display()),
        }
    }
}

/// Starts a background daemon on `socket` and waits until it answers.
pub fn spawn_background(socket: &Path, pe: &PeArgs, spin: bool) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("daemon").arg("--socket").arg(socket);
    if let Some(n) = &pe.nodes {
        cmd.arg("--nodes").arg(n);
    }
    if let Some(h) = &pe.housekeeping {
        let list: Vec<String> = h.iter().map(ToString::to_string).collect();
        cmd.arg("--housekeeping").arg(list.join(","));
    }
    if spin {
        cmd.arg("--spin");
    }
    let log = socket.with_extension("log");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    cmd.stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    cmd.spawn()?;
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if sidecore_control::request(socket, &Request::Ping, Duration::from_secs(1)).is_ok() {
            eprintln!(
                "started a sidecore daemon on {} (log: {})",
                socket.display(),
                log.display()
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!(
        "the daemon did not come up on {} (see {})",
        socket.display(),
        log.display()
    )
}
