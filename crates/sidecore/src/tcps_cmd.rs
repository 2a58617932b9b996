//! `sidecore tcps serve|ppe add|ppe remove|stats`: TCPServers (sidecore-tcps)
//! from the command line — a static HTTP/1.1 file server or the seed's block
//! streamer with its PPEs on dedicated CPUs, and the control of a running one
//! through its control socket.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use sidecore_tcps::apps::{self, HttpLimits, Site};
use sidecore_tcps::{Backend, Config, CoreSet, TcpServers, ctl, ppe::pin_to};

/// The control socket when none is given.
pub const DEFAULT_CONTROL: &str = "/run/sidecore/tcps.sock";

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BackendArg {
    IoUring,
    Epoll,
}

#[derive(Debug, Subcommand)]
pub enum TcpsCommand {
    /// Serve files (--root) or 8 KB blocks (--stream-bytes) with PPEs on dedicated CPUs.
    Serve {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Serve the regular files of this directory, read into memory at start.
        #[arg(long, conflicts_with = "stream_bytes")]
        root: Option<PathBuf>,
        /// Stream blocks from an in-memory file of this many bytes (the seed's benchmark).
        #[arg(long)]
        stream_bytes: Option<u64>,
        /// Block size for --stream-bytes.
        #[arg(long, default_value_t = 8192)]
        block: u64,
        /// AllowedPPE, e.g. `1` or `2-3` (default: the last CPU).
        #[arg(long)]
        allowed: Option<String>,
        /// The master PPE's CPU (default: the last allowed).
        #[arg(long)]
        master: Option<usize>,
        /// CPU for the application thread (default: the first CPU not in AllowedPPE).
        #[arg(long)]
        app_cpu: Option<usize>,
        #[arg(long, value_enum, default_value = "io-uring")]
        backend: BackendArg,
        /// Poll even when idle (never park).
        #[arg(long)]
        spin: bool,
        #[arg(long, env = "SIDECORE_TCPS_SOCKET", default_value = DEFAULT_CONTROL)]
        control: PathBuf,
        /// Stop after this long (e.g. 30s).
        #[arg(long, value_parser = humantime::parse_duration)]
        r#for: Option<Duration>,
        #[command(flatten)]
        metrics: crate::args::MetricsArgs,
    },
    /// Add or remove a PPE of a running server.
    Ppe {
        #[arg(value_parser = ["add", "remove"])]
        op: String,
        cpu: usize,
        #[arg(long, env = "SIDECORE_TCPS_SOCKET", default_value = DEFAULT_CONTROL)]
        control: PathBuf,
    },
    /// A running server's counters.
    Stats {
        #[arg(long, env = "SIDECORE_TCPS_SOCKET", default_value = DEFAULT_CONTROL)]
        control: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: TcpsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TcpsCommand::Ppe { op, cpu, control } => {
            let a = ctl::request(&control, &format!("ppe {op} {cpu}"))?;
            println!("{a}");
            Ok(if a.starts_with("ok") {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        TcpsCommand::Stats { control, json } => {
            let a = ctl::request(&control, "stats")?;
            if json || a.starts_with("error") {
                println!("{a}");
                return Ok(ExitCode::SUCCESS);
            }
            let s: sidecore_tcps::Snapshot = serde_json::from_str(&a).context("decoding stats")?;
            print_stats(&s);
            Ok(ExitCode::SUCCESS)
        }
        serve @ TcpsCommand::Serve { .. } => run_serve(serve),
    }
}

fn print_stats(s: &sidecore_tcps::Snapshot) {
    println!(
        "listen {}  backend {}  AllowedPPE {:?}  ActivePPE {:?}  master {}",
        s.listen, s.backend, s.allowed_ppe, s.active_ppe, s.master
    );
    println!(
        "CPU  ROLE    ACTIVE  CONNS  ACCEPTED   BYTES_IN  BYTES_OUT  RQ_FULL  RESETS  IDLE  HALFOPEN  MOVED_IN  MOVED_OUT"
    );
    for p in &s.ppes {
        println!(
            "{:<4} {:<7} {:<7} {:>5} {:>9} {:>10} {:>10} {:>8} {:>7} {:>5} {:>9} {:>9} {:>10}",
            p.cpu,
            if p.master { "master" } else { "helper" },
            p.active,
            p.conns,
            p.accepted,
            p.bytes_in,
            p.bytes_out,
            p.rq_full_stalls,
            p.closed_reset,
            p.closed_idle,
            p.closed_half_open,
            p.adopted,
            p.handed_off
        );
    }
    for (k, v) in &s.app {
        println!("{k} {v}");
    }
}

fn run_serve(cmd: TcpsCommand) -> anyhow::Result<ExitCode> {
    let TcpsCommand::Serve {
        listen,
        root,
        stream_bytes,
        block,
        allowed,
        master,
        app_cpu,
        backend,
        spin,
        control,
        r#for,
        metrics,
    } = cmd
    else {
        bail!("internal: run_serve called without serve");
    };
    let usable = sidecore_tcps::usable_cpus();
    let allowed = match allowed {
        Some(a) => CoreSet::parse(&a).map_err(|e| anyhow::anyhow!("--allowed: {e}"))?,
        None => CoreSet::of(&usable[usable.len().saturating_sub(1)..])?,
    };
    let mut cfg = Config::new(listen, allowed);
    if let Some(m) = master {
        cfg.master = m;
    }
    cfg.backend = match backend {
        BackendArg::IoUring => Backend::IoUring { sqpoll: false },
        BackendArg::Epoll => Backend::Epoll,
    };
    cfg.spin = spin;
    let server = Arc::new(TcpServers::start(cfg).context("starting sidecore-tcps")?);
    let stop = Arc::new(AtomicBool::new(false));
    let ctl_thread = ctl::serve(Arc::clone(&server), &control, Arc::clone(&stop))?;
    let watched = Arc::clone(&server);
    let _metrics = metrics.start(Arc::new(move || {
        sidecore_observe::exporters::tcps(&watched.stats())
    }))?;
    let app_cpu = app_cpu.or_else(|| usable.iter().copied().find(|c| !allowed.contains(*c)));
    let app = server.app();
    let stop_app = Arc::clone(&stop);
    let handle = if let Some(bytes) = stream_bytes {
        let file: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        let blob = server.register_blob(file.into());
        std::thread::spawn(move || {
            if let Some(c) = app_cpu {
                let _ = pin_to(c);
            }
            apps::serve_stream(&app, blob, bytes, block, &stop_app);
        })
    } else {
        let Some(root) = root else {
            bail!("give --root DIR (file server) or --stream-bytes N (block streamer)");
        };
        let site = Site::load(&server, &root)?;
        let counters = server.counters();
        std::thread::spawn(move || {
            if let Some(c) = app_cpu {
                let _ = pin_to(c);
            }
            apps::serve_http(&app, &site, HttpLimits::default(), &counters, &stop_app);
        })
    };
    println!(
        "sidecore-tcps listening on {} (master PPE on CPU {}, AllowedPPE {}, application on CPU {}); control {}",
        server.local_addr(),
        server.master(),
        server.allowed(),
        app_cpu.map_or("any".to_string(), |c| c.to_string()),
        control.display()
    );
    let term = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&term))?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&term))?;
    let t0 = Instant::now();
    while !term.load(Ordering::Acquire) && r#for.is_none_or(|d| t0.elapsed() < d) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Release);
    let _ = handle.join();
    let _ = ctl_thread.join();
    server.shutdown();
    print_stats(&server.stats());
    Ok(ExitCode::SUCCESS)
}
