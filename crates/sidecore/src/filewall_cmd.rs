//! `sidecore filewall check|run|stats`: FileWall (sidecore-filewall) from the command
//! line — validate a policy chain file (errors as `file:line: what`, exit 2), run the
//! NFS and MOUNT proxies with that chain in front of a server, and read the running
//! proxies' counters (statistics template included) over a Unix control socket.

use std::fmt::Write as _;
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
        /// Print the counters as JSON.
        #[arg(long)]
        json: bool,
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
        let all: Vec<serde_json::Value> = proxies
            .iter()
            .map(|(label, p)| to_json(label, &p.stats()))
            .collect();
        let _ = conn.write_all(serde_json::Value::Array(all).to_string().as_bytes());
    }
    Ok(ExitCode::SUCCESS)
}

/// The counters of one proxy as JSON: what the control socket sends.
fn to_json(label: &str, s: &ProxyStats) -> serde_json::Value {
    let ops: serde_json::Map<String, serde_json::Value> = s
        .ops
        .iter()
        .map(|(n, c)| {
            (
                n.clone(),
                serde_json::json!({"calls": c.calls, "replies": c.replies}),
            )
        })
        .collect();
    let latency: serde_json::Map<String, serde_json::Value> = s
        .latency
        .iter()
        .map(|(n, h)| {
            let mean_us = (h.sum_ns / 1000).checked_div(h.count).unwrap_or(0);
            (
                n.clone(),
                serde_json::json!({"count": h.count, "mean_us": mean_us}),
            )
        })
        .collect();
    let flows: Vec<serde_json::Value> = s
        .policies
        .flows
        .iter()
        .map(|((flow, op), f)| {
            serde_json::json!({
                "flow": flow, "op": op, "calls": f.calls, "replies": f.replies,
                "call_bytes": f.call_bytes, "reply_bytes": f.reply_bytes,
                "latency_mean_us": f.mean_latency_us(), "latency_max_us": f.latency_max_us,
            })
        })
        .collect();
    serde_json::json!({
        "proxy": label,
        "refused": s.refused_calls, "dropped": s.dropped_records,
        "closed": s.closed_connections, "retransmissions": s.retransmissions,
        "overflows": s.overflows, "timeouts": s.timeouts, "unmatched": s.unmatched_replies,
        "server_errors": s.server_errors, "buffer_drops": s.policy_buffer_drops,
        "bad_handles": s.policies.bad_handles, "oversize_handles": s.policies.oversize_handles,
        "temporal_denied": s.policies.temporal_denied,
        "ops": ops, "latency": latency, "flows": flows, "last_error": s.last_error,
    })
}

/// One proxy's counters as text, from their JSON.
fn render(v: &serde_json::Value) -> String {
    let label = v["proxy"].as_str().unwrap_or("?");
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let mut t = format!(
        "[{label}] refused {} dropped {} closed {} retransmissions {} overflows {} timeouts {} \
         unmatched {} server_errors {} buffer_drops {} bad_handles {} oversize_handles {} \
         temporal_denied {}\n",
        n("refused"),
        n("dropped"),
        n("closed"),
        n("retransmissions"),
        n("overflows"),
        n("timeouts"),
        n("unmatched"),
        n("server_errors"),
        n("buffer_drops"),
        n("bad_handles"),
        n("oversize_handles"),
        n("temporal_denied")
    );
    for (name, c) in v["ops"].as_object().into_iter().flatten() {
        let lat = &v["latency"][name];
        let _ = writeln!(
            t,
            "[{label}] op {name:<22} calls {} replies {}{}",
            c["calls"],
            c["replies"],
            lat["count"]
                .as_u64()
                .map(|_| format!(" latency mean {} us", lat["mean_us"]))
                .unwrap_or_default()
        );
    }
    for f in v["flows"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "[{label}] flow {} {:<22} calls {} replies {} bytes {}/{} latency mean {} us max {} us",
            f["flow"],
            f["op"].as_str().unwrap_or("?"),
            f["calls"],
            f["replies"],
            f["call_bytes"],
            f["reply_bytes"],
            f["latency_mean_us"],
            f["latency_max_us"]
        );
    }
    if let Some(e) = v["last_error"].as_str() {
        let _ = writeln!(t, "[{label}] last error: {e}");
    }
    t
}
