//! What the commands share: the options that pick this machine's PEs and the
//! daemon's socket, the daemon's settings built from them, the offcode library
//! this binary ships, and two printing helpers. The ground floor of the binary:
//! every command module uses it, it uses none of them.

use std::path::PathBuf;
use std::time::Duration;

use sidecore_control::DaemonOptions;
use sidecore_offcode::Registry;
use sidecore_runtime::{IdlePolicy, RuntimeConfig};

/// Options shared by the commands that look at this machine's PEs.
#[derive(clap::Args, Debug, Clone)]
pub struct PeArgs {
    /// TOML file listing peer nodes (`[[node]] name, addr`).
    #[arg(long, env = "SIDECORE_NODES")]
    pub nodes: Option<PathBuf>,
    /// CPUs never to dedicate (kept for the host), e.g. `0` or `0,2`.
    #[arg(long, value_delimiter = ',')]
    pub housekeeping: Option<Vec<u32>>,
}

impl PeArgs {
    /// A resolver of node names to `host:port`: a name listed in `--nodes`
    /// (read once, here), else the argument itself when it is `HOST:PORT`.
    /// `flag` names the option in the error (`exec --on`, `migrate --to`).
    pub fn node_resolver(
        &self,
        flag: &'static str,
    ) -> anyhow::Result<impl Fn(&str) -> anyhow::Result<String>> {
        let nodes = match &self.nodes {
            Some(path) => sidecore_pe::node::load_nodes(path)?,
            None => Vec::new(),
        };
        Ok(move |node: &str| {
            if let Some(n) = nodes.iter().find(|n| n.name == node) {
                return Ok(n.addr.clone());
            }
            if node.contains(':') {
                return Ok(node.to_string());
            }
            anyhow::bail!(
                "{flag} {node}: no such node (give HOST:PORT, or a name listed in --nodes)"
            )
        })
    }
}

/// Where the daemon's control socket is.
#[derive(clap::Args, Debug, Clone)]
pub struct SocketArgs {
    /// Control socket path [default: $SIDECORE_SOCKET, /run/sidecore/sidecore.sock as root].
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

impl SocketArgs {
    pub fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(sidecore_control::default_socket)
    }
}

/// How long a client waits for the daemon's answer.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// The offcode library this binary ships.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    sidecore_builtins::register(&mut r);
    sidecore_ext::offcode::register(&mut r);
    sidecore_packet_offcodes::register(&mut r);
    sidecore_total_order_net::offcodes::register(&mut r);
    sidecore_orion::offcode::register(&mut r);
    sidecore_tcps::offcode::register(&mut r);
    sidecore_filewall::offcode::register(&mut r);
    r
}

/// Discovery options from the command line.
pub fn discover_options(pe: &PeArgs) -> anyhow::Result<sidecore_pe::DiscoverOptions> {
    let mut o = sidecore_pe::DiscoverOptions::default();
    if let Some(path) = &pe.nodes {
        o.nodes = sidecore_pe::node::load_nodes(path)?;
    }
    o.housekeeping.clone_from(&pe.housekeeping);
    Ok(o)
}

/// The daemon's settings from the command line.
pub fn daemon_options(pe: &PeArgs, spin: bool) -> anyhow::Result<DaemonOptions> {
    Ok(DaemonOptions {
        discover: discover_options(pe)?,
        solve: sidecore_layout::SolveOptions::default(),
        runtime: RuntimeConfig {
            idle: if spin {
                IdlePolicy::Spin
            } else {
                IdlePolicy::Adaptive
            },
            ..RuntimeConfig::default()
        },
    })
}

/// Whether stderr is a terminal (for coloured diagnostics).
pub fn stderr_is_tty() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

/// Human-readable bytes (IEC units, e.g. `1.5 GiB`).
pub fn bytes(b: u64) -> String {
    bytesize::ByteSize(b).to_string()
}

/// `--metrics ADDR` for commands that run a service outside the daemon: a
/// Prometheus `/metrics` endpoint of their own (loopback unless
/// `--metrics-expose`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9465).
    #[arg(long)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Allow --metrics on an address beyond loopback.
    #[arg(long, requires = "metrics")]
    pub metrics_expose: bool,
}

impl MetricsArgs {
    /// Starts the endpoint when asked for; it stops when the value is dropped.
    pub fn start(
        &self,
        render: sidecore_observe::http::Render,
    ) -> anyhow::Result<Option<sidecore_observe::http::HttpServer>> {
        let Some(addr) = self.metrics else {
            return Ok(None);
        };
        let s = sidecore_observe::http::HttpServer::exporter(addr, self.metrics_expose, render)?;
        eprintln!("metrics on http://{}/metrics", s.addr());
        Ok(Some(s))
    }
}
