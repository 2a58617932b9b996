//! `sidecore filewall check|run|stats`: FileWall (sidecore-filewall) from the command
//! line — validate a policy chain file (errors as `file:line: what`, exit 2), run
//! the proxy (NFS and MOUNT, TCP and UDP, the portmapper) with that chain in front
//! of a server or replicas, or deploy a manifest's `filewall` offcodes where the
//! layout places them, and read the running proxy's counters over a Unix socket.

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use sidecore_filewall::control_socket::ControlServer;
use sidecore_filewall::policy::load_chain;
use sidecore_filewall::portmap;
use sidecore_filewall::proxy::{Backend, Proxy, StatsHandle};
use sidecore_filewall::settings::Settings;
use sidecore_filewall::stats_json::render;

/// Where `run` listens for `stats` when no `--control` is given.
pub const DEFAULT_CONTROL: &str = "/run/sidecore/filewall.sock";

// One value per process, parsed once from the command line: its size is irrelevant.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum FilewallCommand {
    /// Validate a policy chain file; errors say file:line (exit 2).
    Check { policy: PathBuf },
    /// Run the proxy in the foreground: NFS and MOUNT listeners (TCP, and UDP
    /// with --udp), an optional portmapper, in front of one server or replicas.
    Run(RunArgs),
    /// Print a running proxy's counters.
    Stats {
        #[arg(long, default_value = DEFAULT_CONTROL)]
        control: PathBuf,
        /// Print the counters as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Deploy the `filewall` offcodes of this manifest where the layout places
    /// them (a dedicated core, the host, a peer node) instead of a proxy from flags.
    #[arg(long, conflicts_with_all = ["nfs_listen", "mount_listen", "server", "server_nfs", "policy", "key", "udp", "portmap_listen"])]
    manifest: Option<PathBuf>,
    /// With --manifest: stop after this long (e.g. `30s`).
    #[arg(long = "for", value_parser = humantime::parse_duration, requires = "manifest")]
    duration: Option<std::time::Duration>,
    /// Where clients reach NFS.
    #[arg(long, required_unless_present = "manifest")]
    nfs_listen: Option<SocketAddr>,
    /// Where clients reach MOUNT.
    #[arg(long, required_unless_present = "manifest")]
    mount_listen: Option<SocketAddr>,
    /// Also listen for UDP on the NFS and MOUNT (and portmapper) addresses.
    #[arg(long)]
    udp: bool,
    /// Answer portmapper calls here (TCP and UDP; 111 for unmodified clients):
    /// GETPORT names the proxy's own NFS and MOUNT ports.
    #[arg(long)]
    portmap_listen: Option<SocketAddr>,
    /// The server's NFS address (with --server-mount: one server).
    #[arg(long, requires = "server_mount", conflicts_with = "server")]
    server_nfs: Option<SocketAddr>,
    /// The server's MOUNT address.
    #[arg(long, requires = "server_nfs")]
    server_mount: Option<SocketAddr>,
    /// A server as `nfs=ADDR,mount=ADDR[,export=PATH]`; repeat for replicas (the
    /// first is the primary).
    #[arg(long)]
    server: Vec<String>,
    /// The chain file (none: pass-through).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// The handle policy's key file (at least 16 bytes).
    #[arg(long)]
    key: Option<PathBuf>,
    #[arg(long, default_value = DEFAULT_CONTROL)]
    control: PathBuf,
    /// Run the proxy as a dedicated core: pinned to this CPU and polling its
    /// sockets without sleeping (no wake-up per call; the CPU stays busy).
    #[arg(long, value_name = "CPU", conflicts_with = "manifest")]
    core: Option<u32>,
    #[command(flatten)]
    metrics: crate::args::MetricsArgs,
    #[command(flatten)]
    pe: crate::args::PeArgs,
}

pub fn run(cmd: FilewallCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        FilewallCommand::Check { policy } => Ok(check(&policy)),
        FilewallCommand::Run(args) => run_proxy(&args),
        FilewallCommand::Stats { control, json } => {
            let mut s = UnixStream::connect(&control).with_context(|| {
                format!("connecting to a running filewall at {}", control.display())
            })?;
            let mut text = String::new();
            s.read_to_string(&mut text)
                .with_context(|| format!("reading from {}", control.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a filewall's answer", control.display()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for p in v.as_array().into_iter().flatten() {
                    print!("{}", render(p));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check(policy: &Path) -> ExitCode {
    match load_chain(policy) {
        Ok(spec) => {
            println!(
                "{}: ok, chain (client side first): {} (scheduler {})",
                policy.display(),
                spec.describe(),
                spec.scheduler
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The deployment the flags describe.
fn settings(args: &RunArgs) -> Settings {
    let mut servers = Vec::new();
    if let (Some(n), Some(m)) = (args.server_nfs, args.server_mount) {
        servers.push(Backend::nfs_mount(n, m).to_string());
    }
    servers.extend(args.server.iter().cloned());
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    Settings {
        nfs_listen: args.nfs_listen.unwrap_or(any),
        mount_listen: args.mount_listen.unwrap_or(any),
        portmap_listen: args.portmap_listen,
        udp: args.udp,
        servers,
        policy: args.policy.clone(),
        key: args.key.clone(),
        netns: None,
        control: None,
    }
}

fn run_proxy(args: &RunArgs) -> anyhow::Result<ExitCode> {
    if let Some(m) = &args.manifest {
        return run_manifest(m, args);
    }
    let mut c = match settings(args).config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    c.core = args.core;
    let servers: Vec<String> = c.servers.iter().map(ToString::to_string).collect();
    let chain = c.chain.describe();
    let p = Proxy::start(c).context("starting the filewall proxy")?;
    for m in p.port_mappings() {
        let prot = if m.prot == portmap::IPPROTO_UDP {
            "udp"
        } else {
            "tcp"
        };
        println!(
            "filewall: program {} v{} {prot} on port {}",
            m.prog, m.vers, m.port
        );
    }
    println!("filewall: chain {chain}; servers {}", servers.join(" | "));
    if let Some(cpu) = args.core {
        println!("filewall: busy-polling on CPU {cpu} (a dedicated core)");
    }
    serve(
        vec![(LABEL, p.stats_handle())],
        &args.control,
        &args.metrics,
    )
}

/// Deploys a manifest's `filewall` offcodes and runs until a signal or `--for`.
fn run_manifest(path: &Path, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let manifest = match sidecore_manifest::load(path) {
        Ok(m) => m,
        Err(e) => {
            eprint!("{}", e.render(crate::args::stderr_is_tty()));
            return Ok(ExitCode::from(2));
        }
    };
    let fw: Vec<&str> = manifest
        .offcodes
        .iter()
        .filter(|o| o.implementation == "filewall")
        .map(|o| o.name.as_str())
        .collect();
    if fw.is_empty() {
        eprintln!(
            "error: {}: no offcode with impl = \"filewall\"",
            path.display()
        );
        return Ok(ExitCode::from(2));
    }
    let daemon = sidecore_control::Daemon::new(
        crate::args::registry(),
        crate::args::daemon_options(&args.pe, false)?,
    );
    let plan = match daemon.plan(&manifest) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(3));
        }
    };
    for o in &plan.offcodes {
        let what = if fw.contains(&o.name.as_str()) {
            "filewall"
        } else {
            "offcode"
        };
        println!("{what} {} -> {} ({})", o.name, o.pe, o.reason);
    }
    let report = match daemon.deploy(&manifest, &plan) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            daemon.stop_all();
            return Ok(ExitCode::from(4));
        }
    };
    println!("filewall: `{}` running; Ctrl-C stops it", report.app);
    let term = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, std::sync::Arc::clone(&term))?;
    }
    let t0 = std::time::Instant::now();
    while !term.load(std::sync::atomic::Ordering::Acquire)
        && args.duration.is_none_or(|d| t0.elapsed() < d)
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if let Some(a) = daemon.stop(report.id) {
        for o in &a.offcodes {
            let m: Vec<String> = o.metrics.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("{} on {}: {}", o.name, o.pe, m.join(", "));
        }
    }
    daemon.stop_all();
    Ok(ExitCode::SUCCESS)
}

/// The label of the proxy's counters.
pub const LABEL: &str = "filewall";

/// Serves the counters on the control socket (and /metrics) until killed.
pub fn serve(
    proxies: Vec<(&'static str, StatsHandle)>,
    control: &Path,
    metrics: &crate::args::MetricsArgs,
) -> anyhow::Result<ExitCode> {
    let watched = proxies.clone();
    let _metrics = metrics.start(std::sync::Arc::new(move || {
        let stats: Vec<(&str, _)> = watched.iter().map(|(l, p)| (*l, p.stats())).collect();
        sidecore_observe::exporters::filewall(&stats)
    }))?;
    let labelled = proxies
        .into_iter()
        .map(|(l, p)| (l.to_string(), p))
        .collect();
    let server = ControlServer::start(control, labelled)?;
    println!("filewall control: {}", server.path().display());
    loop {
        std::thread::park();
    }
}
