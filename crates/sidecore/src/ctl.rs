//! `sidecore ps`, `down` and `events`: the clients of a running daemon's
//! control socket.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use sidecore_control::{Request, Response};
use sidecore_runtime::{AppStatus, OffcodeStatus};

use crate::args::{CONTROL_TIMEOUT, SocketArgs};

/// How long `down --daemon` waits for the daemon to remove its socket.
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

fn call(socket: &SocketArgs, req: &Request) -> anyhow::Result<Response> {
    Ok(sidecore_control::request(
        &socket.path(),
        req,
        CONTROL_TIMEOUT,
    )?)
}

pub fn ps(socket: &SocketArgs, json: bool) -> anyhow::Result<ExitCode> {
    let apps = match call(socket, &Request::Ps)? {
        Response::Ok { apps, .. } => apps,
        Response::Error { error } => anyhow::bail!(error),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&apps)?);
        return Ok(ExitCode::SUCCESS);
    }
    if apps.is_empty() {
        println!("no apps running");
    }
    for a in &apps {
        print_app(a);
    }
    Ok(ExitCode::SUCCESS)
}

/// One app of `ps`: a line for the app, a table of its offcodes.
fn print_app(a: &AppStatus) {
    #[allow(clippy::cast_precision_loss)] // milliseconds, printed
    let up_s = a.uptime_ms as f64 / 1e3;
    println!(
        "{} (id {}) {} — up {up_s:.1} s",
        a.name,
        a.id,
        state_word(a.state)
    );
    println!(
        "  {:<16} {:<12} {:<12} {:>12} {:>12} {:>9} {:>8}  METRICS",
        "OFFCODE", "PE", "STATE", "HANDLED", "SENT", "DROPPED", "RESTARTS"
    );
    for o in &a.offcodes {
        print_offcode(o);
    }
}

fn print_offcode(o: &OffcodeStatus) {
    let metrics: Vec<String> = o.metrics.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "  {:<16} {:<12} {:<12} {:>12} {:>12} {:>9} {:>8}  {}",
        o.name,
        o.pe,
        state_word(o.state),
        o.handled,
        o.sent,
        o.dropped,
        o.restarts,
        metrics.join(" ")
    );
    if let Some(r) = &o.stop_reason {
        println!("  {:<16} stopped: {r}", "");
    }
}

/// A state as its keyword (`running`, `failed`, …).
pub fn state_word(s: impl serde::Serialize) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

pub fn down(
    socket: &SocketArgs,
    app: Option<String>,
    stop_daemon: bool,
) -> anyhow::Result<ExitCode> {
    match call(socket, &Request::Down { app })? {
        Response::Ok { message, .. } => println!("{}", message.unwrap_or_default()),
        Response::Error { error } => {
            eprintln!("error: {error}");
            return Ok(ExitCode::from(1));
        }
    }
    if stop_daemon {
        let path = socket.path();
        call(socket, &Request::Shutdown)?;
        let deadline = Instant::now() + DAEMON_EXIT_TIMEOUT;
        while path.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("daemon stopped");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn events(socket: &SocketArgs, app: Option<String>, json: bool) -> anyhow::Result<ExitCode> {
    match call(socket, &Request::Events { app, json })? {
        Response::Ok { lines, .. } => {
            for l in lines {
                println!("{l}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Response::Error { error } => anyhow::bail!(error),
    }
}
