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
use sidecore_filewall::policy::load_chain;
use sidecore_filewall::proxy::{Backend, Listen, Proxy, ProxyConfig, ProxyStats, StatsHandle};
use sidecore_filewall::{mount, nfs3, portmap};

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
    /// Where clients reach NFS.
    #[arg(long)]
    nfs_listen: SocketAddr,
    /// Where clients reach MOUNT.
    #[arg(long)]
    mount_listen: SocketAddr,
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
    #[command(flatten)]
    metrics: crate::args::MetricsArgs,
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

/// The proxy's configuration from the command line (`Err`: exit 2 with the message).
fn config(args: &RunArgs) -> anyhow::Result<Result<ProxyConfig, String>> {
    let chain = match args.policy.as_deref().map(load_chain).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => return Ok(Err(e.to_string())),
    };
    let mut servers = Vec::new();
    if let (Some(n), Some(m)) = (args.server_nfs, args.server_mount) {
        servers.push(Backend::nfs_mount(n, m));
    }
    for spec in &args.server {
        match Backend::parse(spec) {
            Ok(b) => servers.push(b),
            Err(e) => return Ok(Err(e.to_string())),
        }
    }
    if servers.is_empty() {
        return Ok(Err(
            "no server: give --server-nfs and --server-mount, or --server".into(),
        ));
    }
    let mut listen = vec![
        Listen::tcp(args.nfs_listen).serving(&[nfs3::PROGRAM]),
        Listen::tcp(args.mount_listen).serving(&[mount::PROGRAM]),
    ];
    if let Some(p) = args.portmap_listen {
        listen.push(Listen::tcp(p).serving(&[portmap::PROGRAM]));
    }
    if args.udp {
        listen.push(Listen::udp(args.nfs_listen).serving(&[nfs3::PROGRAM]));
        listen.push(Listen::udp(args.mount_listen).serving(&[mount::PROGRAM]));
        if let Some(p) = args.portmap_listen {
            listen.push(Listen::udp(p).serving(&[portmap::PROGRAM]));
        }
    }
    let mut c = ProxyConfig::with(listen, servers);
    c.chain = chain;
    c.key = args
        .key
        .as_deref()
        .map(HandleKey::load)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    Ok(Ok(c))
}

fn run_proxy(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let c = match config(args)? {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let servers: Vec<String> = c.servers.iter().map(ToString::to_string).collect();
    let chain = c.chain.describe();
    let p = Proxy::start(c).context("starting the filewall proxy")?;
    for m in p.port_mappings() {
        println!(
            "filewall: program {} v{} {} on port {}",
            m.prog,
            m.vers,
            if m.prot == portmap::IPPROTO_UDP {
                "udp"
            } else {
                "tcp"
            },
            m.port
        );
    }
    println!("filewall: chain {chain}; servers {}", servers.join(" | "));
    serve(
        vec![(LABEL, p.stats_handle())],
        &args.control,
        &args.metrics,
    )
}

/// The label of the proxy's counters.
pub const LABEL: &str = "filewall";

/// Serves the counters on the control socket (and /metrics) until killed.
pub fn serve(
    proxies: Vec<(&'static str, StatsHandle)>,
    control: &Path,
    metrics: &crate::args::MetricsArgs,
) -> anyhow::Result<ExitCode> {
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
        "udp_datagrams": s.udp_datagrams,
        "replicas": s.policies.replicas.iter().enumerate().map(|(i, r)| serde_json::json!({
            "replica": i, "alive": r.alive, "sent": r.sent, "replied": r.replied,
            "timed_out": r.timed_out, "unmapped": r.unmapped,
        })).collect::<Vec<_>>(),
        "replica_divergences": s.policies.replica_divergences,
        "rbac": {
            "allowed": s.policies.rbac.allowed, "denied": s.policies.rbac.denied,
            "logged": s.policies.rbac.logged, "alarms": s.policies.rbac.alarms,
            "threats": s.policies.rbac.threats, "injected": s.policies.rbac.injected,
            "vcn_calls": s.policies.rbac.vcn_calls, "vcn_writes": s.policies.rbac.vcn_writes,
            "vcn_refused": s.policies.rbac.vcn_refused, "store_errors": s.policies.rbac.store_errors,
            "last_vcn_error": s.policies.rbac.last_vcn_error,
            "last_store_error": s.policies.rbac.last_store_error,
        },
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
    for r in v["replicas"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "[{label}] replica {} {} sent {} replied {} timed_out {} unmapped {}",
            r["replica"],
            if r["alive"].as_bool() == Some(true) {
                "alive"
            } else {
                "DEAD"
            },
            r["sent"],
            r["replied"],
            r["timed_out"],
            r["unmapped"]
        );
    }
    let r = &v["rbac"];
    if r["allowed"].as_u64().unwrap_or(0)
        + r["denied"].as_u64().unwrap_or(0)
        + r["vcn_calls"].as_u64().unwrap_or(0)
        > 0
    {
        let _ = writeln!(
            t,
            "[{label}] rbac allowed {} denied {} logged {} alarms {} threats {} injected {} vcn calls {} writes {} refused {} store_errors {}",
            r["allowed"],
            r["denied"],
            r["logged"],
            r["alarms"],
            r["threats"],
            r["injected"],
            r["vcn_calls"],
            r["vcn_writes"],
            r["vcn_refused"],
            r["store_errors"]
        );
    }
    if let Some(e) = v["last_error"].as_str() {
        let _ = writeln!(t, "[{label}] last error: {e}");
    }
    t
}
