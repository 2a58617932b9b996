//! The `sidecore` command: both the command-line interface and the daemon.
//!
//! | command | what it does |
//! |---|---|
//! | `check MANIFEST` | validates a manifest (and the parameters of built-in offcodes) |
//! | `devices` | lists the processing elements this machine offers |
//! | `layout MANIFEST` | solves the layout and prints each placement with its reason |
//! | `up MANIFEST` | deploys in the foreground (or `-d`: into a background daemon) |
//! | `daemon` | runs the daemon in the foreground |
//! | `ps` / `down` / `events` | inspect and stop what a daemon runs |
//! | `sim sikker` / `sim rate` | the Sikker dissertation's simulators, rebuilt on sidecore's code |
//! | `sikker agent` / `send` / `recv` | Sikker's agent on this node, and a client for it |

mod args;
mod check;
mod ctl;
mod daemon;
mod daemon_config;
mod demo;
mod demo_tivo;
mod demo_total_order;
mod devices;
mod exec_cmd;
mod exec_remote;
mod ext_cmd;
mod filewall_cmd;
mod fw;
mod layout;
mod migrate_cmd;
mod orion_cmd;
mod policy;
mod progress;
mod sikker_cmd;
mod sikker_l4;
mod sikker_net;
mod sim_cmd;
mod tcps_cmd;
mod testbed_cmd;
mod up;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

use crate::args::{PeArgs, SocketArgs};

/// sidecore offloads functionality onto processing elements that would
/// otherwise sit idle: dedicated cores, the kernel's eBPF engine, WebAssembly
/// sandboxes and peer machines.
#[derive(Parser, Debug)]
#[command(name = "sidecore", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate a manifest and everything it imports.
    Check {
        manifest: PathBuf,
        /// Print a JSON summary instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the processing elements this machine offers.
    Devices {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pe: PeArgs,
    },
    /// Solve the layout of a manifest and explain each placement.
    Layout {
        manifest: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pe: PeArgs,
    },
    /// Deploy a manifest: in the foreground, or into a background daemon with -d.
    Up(up::UpArgs),
    /// Run the daemon in the foreground (serves `ps`, `down`, `up -d`).
    Daemon(daemon::DaemonArgs),
    /// List the apps and offcodes a daemon runs.
    Ps {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArgs,
    },
    /// Stop an app (by name or id), every app, or the daemon itself.
    Down {
        /// App name or id; all apps when omitted.
        app: Option<String>,
        /// Also stop the daemon.
        #[arg(long)]
        daemon: bool,
        #[command(flatten)]
        socket: SocketArgs,
    },
    /// Print a daemon's event log.
    Events {
        app: Option<String>,
        /// One JSON object per event instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        socket: SocketArgs,
    },
    /// Check and run untrusted Wasm extensions (hybrid resource control).
    Ext(ext_cmd::ExtCommand),
    /// Measure this machine's cost model for Wasm extensions.
    Calibrate(ext_cmd::CalibrateCommand),
    /// Run the Sikker simulators: SikkerSim (permission checks) and RateSim (rate control).
    Sim(sim_cmd::SimCommand),
    /// Validate Sikker policies and trace what they permit.
    Policy(policy::PolicyCommand),
    /// Sikker's agent on this node, and a client for it (send, recv).
    Sikker(sikker_cmd::SikkerCommand),
    /// The SCIRON firewall console: analyse, check and live-load rule files.
    #[command(subcommand)]
    Fw(fw::FwCommand),
    /// HYDRA's packet experiments on a testbed: `firewall` (Table 8.8) and `generator`.
    #[command(subcommand)]
    Demo(demo::DemoCommand),
    /// Build, inspect and remove a testbed of network namespaces.
    #[command(subcommand)]
    Testbed(testbed_cmd::TestbedCommand),
    /// TCPServers: a file server or block streamer with PPEs on dedicated CPUs, and its control.
    #[command(subcommand)]
    Tcps(tcps_cmd::TcpsCommand),
    /// Orion: sensor boxes, counter-slope liveness, fork-bomb repair from outside a cgroup.
    #[command(subcommand)]
    Orion(orion_cmd::OrionCommand),
    /// FileWall: the NFS policy middlebox (check a chain file, run the proxies, read stats).
    #[command(subcommand)]
    Filewall(filewall_cmd::FilewallCommand),
    /// Metachory: run a program supervised, locally or on a peer node (--on) with this machine's files projected.
    Exec(exec_cmd::ExecArgs),
    /// Metachory: move the guest of a running `exec --on` (the client's PID) to another node, live.
    Migrate(migrate_cmd::MigrateArgs),
    /// Metachory's container for a remote guest (started by the daemon).
    #[command(name = "__mx-init", hide = true)]
    MxInit { spec: String },
    /// Print a shell completion script (`source <(sidecore completions bash)`).
    Completions { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SIDECORE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Check { manifest, json } => check::run(&manifest, json),
        Command::Devices { json, pe } => devices::run(&pe, json),
        Command::Layout { manifest, json, pe } => layout::run(&manifest, &pe, json),
        Command::Up(args) => up::run(&args),
        Command::Daemon(args) => daemon::run(&args),
        Command::Ps { json, socket } => ctl::ps(&socket, json),
        Command::Down {
            app,
            daemon,
            socket,
        } => ctl::down(&socket, app, daemon),
        Command::Events { app, json, socket } => ctl::events(&socket, app, json),
        Command::Ext(c) => c.run().map(|code| ExitCode::from(code as u8)),
        Command::Calibrate(c) => c.run().map(|code| ExitCode::from(code as u8)),
        Command::Sim(cmd) => sim_cmd::run(cmd).map(|()| ExitCode::SUCCESS),
        Command::Policy(cmd) => policy::run(cmd),
        Command::Sikker(cmd) => sikker_cmd::run(cmd),
        Command::Fw(cmd) => fw::run(cmd),
        Command::Demo(cmd) => demo::run(cmd),
        Command::Testbed(cmd) => testbed_cmd::run(cmd),
        Command::Tcps(cmd) => tcps_cmd::run(cmd),
        Command::Orion(cmd) => orion_cmd::run(cmd),
        Command::Filewall(cmd) => filewall_cmd::run(cmd),
        Command::Exec(args) if args.on.is_some() => exec_remote::run(&args),
        Command::Exec(args) => exec_cmd::run_exec(args),
        Command::Migrate(args) => migrate_cmd::run(&args),
        Command::MxInit { spec } => {
            std::process::exit(sidecore_metachory::remote::shim::main(&spec));
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "sidecore",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
