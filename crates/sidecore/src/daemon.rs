//! `sidecore daemon`: the daemon in the foreground (control socket, and with
//! `--listen` the node listener for peers); and starting one in the
//! background for `sidecore up -d`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sidecore_control::node::NodeListener;
use sidecore_control::{ControlServer, Daemon, Request};

use crate::args::{PeArgs, SocketArgs, daemon_options, registry};

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
    #[arg(long, default_value = "local")]
    name: String,
    /// Busy-poll on idle cores.
    #[arg(long)]
    spin: bool,
    #[command(flatten)]
    pe: PeArgs,
}

pub fn run(args: &DaemonArgs) -> anyhow::Result<ExitCode> {
    let d = Daemon::new(registry(), daemon_options(&args.pe, args.spin)?);
    let socket = args.socket.path();
    let mut server = ControlServer::start(Arc::clone(&d), &socket)?;
    let node = match &args.listen {
        Some(addr) => Some(NodeListener::start(
            addr,
            &args.name,
            Some(d.deploy_handler()),
        )?),
        None => None,
    };
    d.runtime().events().subscribe(|e| eprintln!("{e}"));
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&term))?;
    }
    eprintln!(
        "sidecore daemon on {}{}",
        socket.display(),
        node.as_ref()
            .map(|n| format!(", node listener on {}", n.addr()))
            .unwrap_or_default()
    );
    while !term.load(Ordering::Acquire) && !d.wait_shutdown(WAIT_POLL) {}
    d.stop_all();
    server.stop();
    drop(node);
    eprintln!("sidecore daemon stopped");
    Ok(ExitCode::SUCCESS)
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
