//! `sidecore up MANIFEST`: deploys in the foreground and serves the control
//! socket while it runs (so `sidecore ps` and `sidecore down` work from another
//! terminal); stops cleanly on SIGINT/SIGTERM, `--for`, `sidecore down`, or when
//! every offcode has finished. With `-d`, hands the manifest to a background
//! daemon instead, starting one if none is running.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sidecore_control::{ControlServer, Daemon, Request, Response};
use sidecore_runtime::{AppState, AppStatus};

use crate::args::{PeArgs, SocketArgs, daemon_options, registry, stderr_is_tty};

/// How long `up -d` waits for the daemon to deploy.
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the foreground `up` looks at its app.
const WATCH_POLL: Duration = Duration::from_millis(50);
/// How often it prints the rates.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// The application manifest.
    manifest: PathBuf,
    /// Hand it to a background daemon (started if none runs) and return.
    #[arg(short = 'd', long)]
    detach: bool,
    /// Stop after this long (e.g. `5s`, `2m`).
    #[arg(long = "for", value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Busy-poll on idle cores instead of backing off (lowest latency).
    #[arg(long)]
    spin: bool,
    /// Print no events or progress, only the summary.
    #[arg(short, long)]
    quiet: bool,
    /// Print the final summary as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArgs,
    #[command(flatten)]
    pe: PeArgs,
}

pub fn run(args: &UpArgs) -> anyhow::Result<ExitCode> {
    if args.detach {
        return detached(args);
    }
    let manifest = match sidecore_manifest::load(&args.manifest) {
        Ok(m) => m,
        Err(e) => {
            eprint!("{}", e.render(stderr_is_tty()));
            return Ok(ExitCode::from(2));
        }
    };
    let daemon = Daemon::new(registry(), daemon_options(&args.pe, args.spin)?);
    let socket = args.socket.path();
    let mut server = ControlServer::start(Arc::clone(&daemon), &socket)?;
    let deployed = daemon
        .plan(&manifest)
        .map_err(|e| (e.to_string(), 3))
        .and_then(|plan| {
            if !args.quiet {
                eprintln!("layout of `{}`:", plan.app);
                for o in &plan.offcodes {
                    eprintln!("  {:<16} → {:<10} {}", o.name, o.pe, o.reason);
                }
                daemon.runtime().events().subscribe(|e| eprintln!("{e}"));
            }
            daemon
                .deploy(&manifest, &plan)
                .map_err(|e| (e.to_string(), 4))
        });
    let report = match deployed {
        Ok(r) => r,
        Err((e, code)) => {
            eprintln!("error: {e}");
            server.stop();
            daemon.stop_all();
            return Ok(ExitCode::from(code));
        }
    };
    if !args.quiet {
        eprintln!(
            "running `{}` (control socket {}); Ctrl-C or `sidecore down` stops it",
            report.app,
            socket.display()
        );
    }
    let t0 = Instant::now();
    let why = watch(args, &daemon, report.id, t0)?;
    // Stop the app first and report its counters at rest: read while running,
    // one offcode after another, a sink could appear ahead of its source.
    let final_status: Vec<AppStatus> = daemon.stop(report.id).into_iter().collect();
    let elapsed = t0.elapsed();
    daemon.stop_all();
    server.stop();
    if args.json {
        let v = serde_json::json!({
            "app": report.app, "stopped_because": why, "seconds": elapsed.as_secs_f64(), "status": final_status,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "`{}` stopped ({why}) after {:.2} s",
            report.app,
            elapsed.as_secs_f64()
        );
        print_summary(&final_status, elapsed);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs until a signal, `--for`, `sidecore down`, a shutdown request or the
/// end of every offcode; prints the rates each second. Returns why it stopped.
fn watch(args: &UpArgs, daemon: &Daemon, id: u64, t0: Instant) -> anyhow::Result<String> {
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&term))?;
    }
    let mut last = (Instant::now(), rates_base(&daemon.ps(), id));
    loop {
        std::thread::sleep(WATCH_POLL);
        if term.load(Ordering::Acquire) {
            return Ok("signal".to_string());
        }
        if let Some(d) = args.duration
            && t0.elapsed() >= d
        {
            return Ok(format!("ran for {}", humantime::format_duration(d)));
        }
        if daemon.shutting_down() {
            return Ok("shutdown requested".into());
        }
        let ps = daemon.ps();
        match ps.iter().find(|a| a.id == id) {
            None => return Ok("stopped by `sidecore down`".into()),
            Some(a) if a.state != AppState::Running => return Ok("every offcode finished".into()),
            Some(_) => {}
        }
        if !args.quiet && last.0.elapsed() >= PROGRESS_EVERY {
            let now = rates_base(&ps, id);
            eprintln!(
                "{}",
                progress_line(&last.1, &now, last.0.elapsed(), t0.elapsed())
            );
            last = (Instant::now(), now);
        }
    }
}

/// (offcode, records, dropped) for the app.
fn rates_base(ps: &[AppStatus], id: u64) -> Vec<(String, u64, u64)> {
    ps.iter()
        .filter(|a| a.id == id)
        .flat_map(|a| a.offcodes.iter())
        .map(|o| {
            (
                o.name.clone(),
                o.metrics.get("records").copied().unwrap_or(o.handled),
                o.dropped,
            )
        })
        .collect()
}

fn progress_line(
    before: &[(String, u64, u64)],
    now: &[(String, u64, u64)],
    dt: Duration,
    total: Duration,
) -> String {
    let mut s = format!("[{:>6.1} s]", total.as_secs_f64());
    for (n, r, d) in now {
        let prev = before.iter().find(|b| &b.0 == n).map(|b| b.1).unwrap_or(0);
        let rate = (r - prev.min(*r)) as f64 / dt.as_secs_f64().max(1e-9);
        s.push_str(&format!("  {n} {:.2} M rec/s", rate / 1e6));
        if *d > 0 {
            s.push_str(&format!(" ({d} dropped)"));
        }
    }
    s
}

fn print_summary(status: &[AppStatus], elapsed: Duration) {
    for a in status {
        for o in &a.offcodes {
            let records = o.metrics.get("records").copied().unwrap_or(o.handled);
            println!(
                "  {:<16} {:<10} {:<9} {:>14} records  {:>8.2} M rec/s  {}",
                o.name,
                o.pe,
                format!("{:?}", o.state).to_lowercase(),
                records,
                records as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6,
                o.metrics
                    .iter()
                    .filter(|(k, _)| k.as_str() != "records")
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            if o.restarts > 0 {
                println!("  {:<16} restarted {} time(s)", "", o.restarts);
            }
            if let Some(r) = &o.stop_reason {
                println!("  {:<16} stopped: {r}", "");
            }
        }
    }
}

fn detached(args: &UpArgs) -> anyhow::Result<ExitCode> {
    let socket = args.socket.path();
    let manifest = std::fs::canonicalize(&args.manifest)
        .map_err(|e| anyhow::anyhow!("cannot read manifest {}: {e}", args.manifest.display()))?;
    if sidecore_control::request(&socket, &Request::Ping, Duration::from_secs(2)).is_err() {
        crate::daemon::spawn_background(&socket, &args.pe, args.spin)?;
    }
    let r = sidecore_control::request(
        &socket,
        &Request::Up {
            manifest: manifest.display().to_string(),
        },
        DEPLOY_TIMEOUT,
    )?;
    match r {
        Response::Ok { message, lines, .. } => {
            for l in lines {
                println!("  {l}");
            }
            if let Some(m) = message {
                println!("{m}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Response::Error { error } => {
            eprint!("{error}");
            if !error.ends_with('\n') {
                eprintln!();
            }
            Ok(ExitCode::from(2))
        }
    }
}
