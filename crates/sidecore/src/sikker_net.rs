//! `sidecore sikker` across hosts: the agent's link options (where it
//! listens, its peers, its certificates), `certs` to make a cluster's
//! certificates, and two load tools — `load` sends as fast as the agent
//! admits, `meter` receives and reports bytes per time window — with which
//! rate limits are measured end to end.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;
use sidecore_sikker_agent::links::Links;
use sidecore_sikker_agent::tls::{self, TlsFiles};
use sidecore_sikker_agent::{AgentCore, Client, ClientError, Dest};

/// How an agent reaches the other hosts' agents (the placement's `agent`
/// addresses, else `--peer`).
#[derive(Args, Debug, Default)]
pub struct AgentNetArgs {
    /// Listen for other agents on this address (`ip:port`).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Another host's agent: `HOST=ip:port` (repeat for each); for hosts
    /// whose `agent` address the placement does not give.
    #[arg(long = "peer", value_parser = parse_peer)]
    pub peers: Vec<(String, SocketAddr)>,
    /// Directory with `ca.pem`, `HOST.pem` and `HOST.key` (`sidecore sikker certs`).
    #[arg(long)]
    pub tls: Option<PathBuf>,
    /// Also run L4 mode for plain TCP (as `sidecore sikker l4`), its maps fed
    /// from this agent's policy as it changes.
    #[arg(long)]
    pub l4: bool,
    /// With `--l4`: the cgroup v2 directory to attach to (default: the root).
    #[arg(long, requires = "l4")]
    pub l4_cgroup: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: crate::args::MetricsArgs,
}

fn parse_peer(s: &str) -> Result<(String, SocketAddr), String> {
    let (h, a) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not HOST=IP:PORT"))?;
    let addr = a
        .parse()
        .map_err(|e| format!("`{a}` in `{s}` is not an ip:port: {e}"))?;
    Ok((h.to_string(), addr))
}

/// The links `net` asks for, or none; refuses peers without certificates.
pub fn links(net: &AgentNetArgs, core: &AgentCore) -> anyhow::Result<Option<Links>> {
    let Some(listen) = net.listen else {
        anyhow::ensure!(
            net.peers.is_empty(),
            "--peer needs --listen (and --tls): agents link both ways"
        );
        return Ok(None);
    };
    let dir = net.tls.as_ref().context(
        "--listen needs --tls DIR: agents prove their host to each other with certificates (sidecore sikker certs)",
    )?;
    let known: std::collections::BTreeSet<String> = core.peer_hosts().into_iter().collect();
    for (h, _) in &net.peers {
        anyhow::ensure!(
            known.contains(h),
            "--peer {h}: not another host of the placement (hosts: {})",
            known.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let cfg = tls::load(&TlsFiles::in_dir(dir, core.host()))?;
    let mut l = Links::bind(core.host(), known.clone(), cfg, listen, &net.peers)
        .with_context(|| format!("listen for agents on {listen}"))?;
    // The placement's agent addresses, where it gives them, before --peer's.
    l.set_peers(known, core.agents(), Instant::now());
    Ok(Some(l))
}

/// `sidecore sikker certs`.
#[derive(Args, Debug)]
pub struct CertsArgs {
    /// Where to write `ca.pem`, `ca.key` and `HOST.pem`/`HOST.key` for each host.
    #[arg(long)]
    out: PathBuf,
    /// The hosts, as the placement names them.
    #[arg(required = true)]
    hosts: Vec<String>,
}

/// Makes a cluster authority and a certificate for each host.
pub fn certs(a: &CertsArgs) -> anyhow::Result<ExitCode> {
    let files = tls::generate(&a.out, &a.hosts)?;
    for f in files {
        println!("{}", f.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `sidecore sikker load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    #[arg(long)]
    socket: PathBuf,
    /// `SERVICE:PROCESS:DOMAIN`.
    #[arg(long)]
    to: Dest,
    /// Bytes per message.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Send for this long, one message after another (each waits for the
    /// agent's answer, so a rate limit paces it).
    #[arg(long, default_value_t = 1000)]
    duration_ms: u64,
}

/// Sends for a while; prints what went through as JSON.
pub fn load(a: &LoadArgs) -> anyhow::Result<ExitCode> {
    let mut c = Client::connect(&a.socket).map_err(|e| anyhow::anyhow!("{e}"))?;
    let payload = vec![0x5a; a.size];
    let start = Instant::now();
    let until = start + Duration::from_millis(a.duration_ms);
    let (mut sent, mut denied) = (0u64, BTreeMap::<String, u64>::new());
    while Instant::now() < until {
        match c.send(&a.to, &payload) {
            Ok(()) => sent += 1,
            Err(ClientError::Denied(d)) => *denied.entry(d.to_string()).or_default() += 1,
            // The agent went away: report what was sent until then.
            Err(e) => {
                eprintln!("load: {e}");
                break;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let v = serde_json::json!({
        "messages": sent,
        "bytes": sent * a.size as u64,
        "seconds": secs,
        "bytes_per_second": (sent * a.size as u64) as f64 / secs,
        "denied": denied,
    });
    println!("{v}");
    Ok(ExitCode::SUCCESS)
}

/// `sidecore sikker meter`.
#[derive(Args, Debug)]
pub struct MeterArgs {
    #[arg(long)]
    socket: PathBuf,
    /// Window length.
    #[arg(long, default_value_t = 100)]
    window_ms: u64,
    /// Stop after this long.
    #[arg(long, default_value_t = 10_000)]
    duration_ms: u64,
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Receives for a while and prints one JSON line per window: its start (ms
/// since the Unix epoch, so windows of several meters line up) and the bytes
/// from each sender.
pub fn meter(a: &MeterArgs) -> anyhow::Result<ExitCode> {
    let mut c = Client::connect(&a.socket).map_err(|e| anyhow::anyhow!("{e}"))?;
    c.listen().map_err(|e| anyhow::anyhow!("{e}"))?;
    let w = u128::from(a.window_ms.max(1));
    let until = Instant::now() + Duration::from_millis(a.duration_ms);
    let mut window = unix_ms() / w;
    let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
    let flush = |window: u128, bytes: &mut BTreeMap<String, u64>| {
        let v = serde_json::json!({
            "t_ms": window * w,
            "bytes": bytes.values().sum::<u64>(),
            "from": bytes,
        });
        println!("{v}");
        bytes.clear();
    };
    while Instant::now() < until {
        let d = c.recv(Duration::from_millis(10))?;
        let now = unix_ms() / w;
        while window < now {
            flush(window, &mut bytes);
            window += 1;
        }
        if let Some(d) = d {
            *bytes.entry(d.from.to_string()).or_default() += d.payload.len() as u64;
        }
    }
    flush(window, &mut bytes);
    Ok(ExitCode::SUCCESS)
}
