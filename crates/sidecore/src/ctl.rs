//! `sidecore daemon`, `ps`, `down` and `events`: the daemon in the foreground,
//! and the clients of its control socket.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sidecore_control::{ControlServer, Daemon, Request, Response};

use crate::{PeArgs, SocketArgs};

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

pub fn daemon(args: DaemonArgs) -> anyhow::Result<ExitCode> {
    let d = Daemon::new(
        crate::registry(),
        crate::up::daemon_options(&args.pe, args.spin)?,
    );
    let socket = args.socket.path();
    let mut server = ControlServer::start(Arc::clone(&d), &socket).map_err(anyhow::Error::msg)?;
    let node = match &args.listen {
        Some(addr) => Some(
            sidecore_control::node::NodeListener::start(addr, &args.name, Some(d.deploy_handler()))
                .map_err(anyhow::Error::msg)?,
        ),
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
    while !term.load(Ordering::Acquire) && !d.wait_shutdown(Duration::from_millis(100)) {}
    d.stop_all();
    server.stop();
    drop(node);
    eprintln!("sidecore daemon stopped");
    Ok(ExitCode::SUCCESS)
}

/// Starts a background daemon on `socket` and waits until it answers.
pub fn spawn_daemon(socket: &Path, pe: &PeArgs, spin: bool) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("daemon").arg("--socket").arg(socket);
    if let Some(n) = &pe.nodes {
        cmd.arg("--nodes").arg(n);
    }
    if let Some(h) = &pe.housekeeping {
        cmd.arg("--housekeeping").arg(
            h.iter()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
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
    let deadline = Instant::now() + Duration::from_secs(10);
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

fn call(socket: &SocketArgs, req: Request) -> anyhow::Result<Response> {
    sidecore_control::request(&socket.path(), &req, Duration::from_secs(30))
        .map_err(anyhow::Error::msg)
}

pub fn ps(socket: &SocketArgs, json: bool) -> anyhow::Result<ExitCode> {
    match call(socket, Request::Ps)? {
        Response::Ok { apps, .. } => {
            if json {
                println!("{}", serde_json::to_string_pretty(&apps)?);
                return Ok(ExitCode::SUCCESS);
            }
            if apps.is_empty() {
                println!("no apps running");
            }
            for a in &apps {
                println!(
                    "{} (id {}) {} — up {:.1} s",
                    a["name"].as_str().unwrap_or("?"),
                    a["id"],
                    a["state"].as_str().unwrap_or("?"),
                    a["uptime_ms"].as_u64().unwrap_or(0) as f64 / 1e3
                );
                println!(
                    "  {:<16} {:<12} {:<12} {:>12} {:>12} {:>9}  METRICS",
                    "OFFCODE", "PE", "STATE", "HANDLED", "SENT", "DROPPED"
                );
                for o in a["offcodes"].as_array().into_iter().flatten() {
                    let metrics = o["metrics"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| format!("{k}={v}"))
                                .collect::<Vec<_>>()
                                .join(" ")
                        })
                        .unwrap_or_default();
                    println!(
                        "  {:<16} {:<12} {:<12} {:>12} {:>12} {:>9}  {metrics}",
                        o["name"].as_str().unwrap_or("?"),
                        o["pe"].as_str().unwrap_or("?"),
                        o["state"].as_str().unwrap_or("?"),
                        o["handled"],
                        o["sent"],
                        o["dropped"]
                    );
                    if let Some(r) = o["stop_reason"].as_str() {
                        println!("  {:<16} stopped: {r}", "");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Response::Error { error } => anyhow::bail!(error),
    }
}

pub fn down(
    socket: &SocketArgs,
    app: Option<String>,
    stop_daemon: bool,
) -> anyhow::Result<ExitCode> {
    match call(socket, Request::Down { app })? {
        Response::Ok { message, .. } => println!("{}", message.unwrap_or_default()),
        Response::Error { error } => {
            eprintln!("error: {error}");
            return Ok(ExitCode::from(1));
        }
    }
    if stop_daemon {
        let path = socket.path();
        call(socket, Request::Shutdown)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while path.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("daemon stopped");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn events(socket: &SocketArgs, app: Option<String>) -> anyhow::Result<ExitCode> {
    match call(socket, Request::Events { app })? {
        Response::Ok { lines, .. } => {
            for l in lines {
                println!("{l}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Response::Error { error } => anyhow::bail!(error),
    }
}
