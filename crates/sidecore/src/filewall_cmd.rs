//! `sidecore filewall check|run|stats`: FileWall (sidecore-filewall) from the command
//! line — validate a policy chain file (errors as `file:line: what`, exit 2), run the
//! NFS and MOUNT proxies with that chain in front of a server, and read the running
//! proxies' counters (statistics template included) over a Unix control socket.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use sidecore_filewall::handles::HandleKey;
use sidecore_filewall::policy::{ChainSpec, PolicyKind, load_chain};
use sidecore_filewall::proxy::{Proxy, ProxyConfig, ProxyStats};

/// Where `run` listens for `stats` when no `--control` is given.
pub const DEFAULT_CONTROL: &str = "/run/sidecore/filewall.sock";

// One value per process, parsed once from the command line: its size is irrelevant.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum FilewallCommand {
    /// Validate a policy chain file; errors say file:line (exit 2).
    Check { policy: PathBuf },
    /// Run the NFS and MOUNT proxies in the foreground.
    Run {
        #[arg(long)]
        nfs_listen: SocketAddr,
        #[arg(long)]
        mount_listen: SocketAddr,
        #[arg(long)]
        server_nfs: SocketAddr,
        #[arg(long)]
        server_mount: SocketAddr,
        /// The chain file (none: pass-through).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// The handle policy's key file (at least 16 bytes).
        #[arg(long)]
        key: Option<PathBuf>,
        #[arg(long, default_value = DEFAULT_CONTROL)]
        control: PathBuf,
        #[command(flatten)]
        metrics: crate::args::MetricsArgs,
    },
    /// Print a running proxy pair's counters.
    Stats {
        #[arg(long, default_value = DEFAULT_CONTROL)]
        control: PathBuf,
    },
}

pub fn run(cmd: FilewallCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        FilewallCommand::Check { policy } => Ok(check(&policy)),
        FilewallCommand::Run {
            nfs_listen,
            mount_listen,
            server_nfs,
            server_mount,
            policy,
            key,
            control,
            metrics,
        } => {
            let chain = match policy.as_deref().map(load_chain).transpose() {
                Ok(c) => c.unwrap_or_default(),
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(ExitCode::from(2));
                }
            };
            let key = key
                .as_deref()
                .map(HandleKey::load)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            serve(
                [(nfs_listen, server_nfs), (mount_listen, server_mount)],
                &chain,
                key,
                &control,
                &metrics,
            )
        }
        FilewallCommand::Stats { control } => {
            let mut s = UnixStream::connect(&control).with_context(|| {
                format!("connecting to a running filewall at {}", control.display())
            })?;
            let mut text = String::new();
            s.read_to_string(&mut text)
                .with_context(|| format!("reading from {}", control.display()))?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check(policy: &Path) -> ExitCode {
    match load_chain(policy) {
        Ok(spec) => {
            let names: Vec<&str> = spec
                .policies
                .iter()
                .map(|p| match p.kind {
                    PolicyKind::Stats => "stats",
                    PolicyKind::Handles => "handles",
                    PolicyKind::Temporal => "temporal",
                })
                .collect();
            println!(
                "{}: ok, chain (client side first): {}",
                policy.display(),
                if names.is_empty() {
                    "empty (pass-through)".to_string()
                } else {
                    names.join(" -> ")
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn serve(
    pairs: [(SocketAddr, SocketAddr); 2],
    chain: &ChainSpec,
    key: Option<HandleKey>,
    control: &Path,
    metrics: &crate::args::MetricsArgs,
) -> anyhow::Result<ExitCode> {
    let mut proxies = Vec::new();
    for (label, (listen, server)) in ["NFS", "MOUNT"].into_iter().zip(pairs) {
        let mut c = ProxyConfig::new(listen, server);
        c.chain = chain.clone();
        c.key = key.clone();
        let p = Proxy::start(c).with_context(|| format!("starting the {label} proxy"))?;
        println!("filewall {label}: {} -> {server}", p.local_addr());
        proxies.push((label, p));
    }
    let proxies = std::sync::Arc::new(proxies);
    let watched = std::sync::Arc::clone(&proxies);
    let _metrics = metrics.start(std::sync::Arc::new(move || {
        let stats: Vec<(&str, _)> = watched.iter().map(|(l, p)| (*l, p.stats())).collect();
        sidecore_observe::exporters::filewall(&stats)
    }))?;
    if let Some(dir) = control.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(control);
    let listener = UnixListener::bind(control)
        .with_context(|| format!("binding the control socket {}", control.display()))?;
    println!("filewall control: {}", control.display());
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut text = String::new();
        for (label, p) in proxies.iter() {
            text.push_str(&render(label, &p.stats()));
        }
        let _ = conn.write_all(text.as_bytes());
    }
    Ok(ExitCode::SUCCESS)
}

/// The counters of one proxy as text.
fn render(label: &str, s: &ProxyStats) -> String {
    let mut t = format!(
        "[{label}] refused {} dropped {} closed {} retransmissions {} overflows {} timeouts {} \
         unmatched {} server_errors {} buffer_drops {} bad_handles {} oversize_handles {} \
         temporal_denied {}\n",
        s.refused_calls,
        s.dropped_records,
        s.closed_connections,
        s.retransmissions,
        s.overflows,
        s.timeouts,
        s.unmatched_replies,
        s.server_errors,
        s.policy_buffer_drops,
        s.policies.bad_handles,
        s.policies.oversize_handles,
        s.policies.temporal_denied
    );
    for (name, c) in &s.ops {
        t.push_str(&format!(
            "[{label}] op {name:<22} calls {} replies {}\n",
            c.calls, c.replies
        ));
    }
    for ((flow, name), f) in &s.policies.flows {
        t.push_str(&format!(
            "[{label}] flow {flow} {name:<22} calls {} replies {} bytes {}/{} latency mean {} us max {} us\n",
            f.calls,
            f.replies,
            f.call_bytes,
            f.reply_bytes,
            f.mean_latency_us(),
            f.latency_max_us
        ));
    }
    if let Some(e) = &s.last_error {
        t.push_str(&format!("[{label}] last error: {e}\n"));
    }
    t
}
