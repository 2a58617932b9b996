//! `sidecore demo firewall` and `sidecore demo generator`: HYDRA's §8.3–8.4
//! experiments on a testbed of network namespaces, every part deployed from a
//! manifest through the runtime like any app.
//!
//! `firewall` builds the testbed, then for each firewall PE (the kernel's XDP,
//! the user-space forwarder on a dedicated core, nftables on the host, and no
//! firewall as the reference) and each discard share deploys the traffic
//! generator (client), the firewall (middlebox) and the analyser (server);
//! it prints a table in the shape of HYDRA's Table 8.8 — throughput offered
//! and delivered, and the CPU the machine spent — and tears everything down.
//!
//! `generator` compares the generator on a dedicated core (whole frames in
//! batches through a qdisc-bypassing packet socket) with a plain UDP socket
//! loop on the host, for several frame sizes (Tables 8.6–8.7's question).
//!
//! Every namespace of this machine shares its two CPUs, so the CPU column is
//! the whole machine's busy time (from /proc/stat) per packet offered:
//! generator, forwarding and firewall together. The generator's share is the
//! same in every row of a frame size, so the differences between rows are the
//! firewalls' costs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde::Serialize;
use sidecore_packet_offcodes::report::{Reading, window};
use sidecore_runtime::{AppStatus, Runtime, RuntimeConfig};
use sidecore_testbed::{Testbed, Topology, topology};

use crate::args::registry;

/// Time for the deployment to settle before the measured window.
const WARM_UP: Duration = Duration::from_millis(500);
/// The port the rules accept and the one they deny.
const ALLOWED_PORT: u16 = 5000;
const DENIED_PORT: u16 = 5001;
/// Ticks per second of /proc/stat: USER_HZ, fixed at 100 by the kernel ABI.
const USER_HZ: f64 = 100.0;

#[derive(Debug, Subcommand)]
pub enum DemoCommand {
    /// XDP vs user space vs nftables at 100% and 50% discard (Table 8.8).
    Firewall(FirewallArgs),
    /// The traffic generator on a dedicated core vs a socket loop (§8.3).
    Generator(GeneratorArgs),
    /// TiVoPC: a paced stream from a socket loop, sendfile, io_uring and a
    /// dedicated core, with and without load (Tables 8.2–8.4).
    Tivo(crate::demo_tivo::TivoArgs),
    /// Offloaded total order: Lamport on the host or beside reliable broadcast,
    /// against a fixed sequencer and etcd (Table 8.5).
    TotalOrder(crate::demo_total_order::TotalOrderArgs),
}

#[derive(Debug, Args)]
pub struct FirewallArgs {
    /// Seconds measured per row.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Ethernet frame size (64..=1514).
    #[arg(long, default_value_t = 64)]
    frame_bytes: usize,
    /// Offered load in packets per second (0: as fast as the generator goes).
    #[arg(long, default_value_t = 0)]
    rate_pps: u64,
    /// Rule-set sizes to run (the extra rules never match the traffic, so a
    /// denied packet is checked against all of them by a linear scan; 0 is an
    /// empty set: default deny without a lookup).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    rules: Vec<usize>,
    /// Discard shares in percent (100: every packet denied; 50: every other).
    #[arg(long, value_delimiter = ',', default_value = "100,50")]
    discard: Vec<u32>,
    /// Firewalls to run: xdp, user-space, nftables, none.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "xdp,user-space,nftables,none"
    )]
    firewalls: Vec<String>,
    /// XDP attach mode: auto, generic or native.
    #[arg(long, default_value = "auto")]
    xdp_mode: String,
    /// Namespace prefix of the demo's testbed.
    #[arg(long, default_value = "scdemo")]
    prefix: String,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct GeneratorArgs {
    /// Seconds measured per row.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Frame sizes to run.
    #[arg(long, value_delimiter = ',', default_value = "64,512,1514")]
    frame_bytes: Vec<usize>,
    /// Where the frames end: `drop` (an XDP program with no rules drops them
    /// as they arrive at the middlebox, as a wire would take them away) or
    /// `analyser` (forwarded to the server and counted there; the receiving
    /// path then runs on the same two CPUs and limits the rate).
    #[arg(long, default_value = "drop")]
    sink: String,
    /// How the dedicated core's frames leave, one row each: `af_xdp` (an
    /// AF_XDP socket's TX ring), `af_packet` (sendmmsg on an AF_PACKET
    /// socket) or `auto` (AF_XDP, AF_PACKET where the kernel refuses it).
    #[arg(long, value_delimiter = ',', default_value = "af_xdp,af_packet")]
    paths: Vec<String>,
    #[arg(long, default_value = "scdemo")]
    prefix: String,
    #[arg(long)]
    json: bool,
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub firewall: String,
    pub pe: String,
    pub rules: usize,
    pub discard_pct: u32,
    pub frame_bytes: usize,
    /// Packets per second the generator sent.
    pub offered_pps: f64,
    /// Packets per second the analyser received.
    pub delivered_pps: f64,
    /// Busy CPUs of the machine (1.0 = one CPU all the time).
    pub cpus_busy: f64,
    /// Machine CPU time per packet offered, in nanoseconds.
    pub cpu_ns_per_packet: f64,
    /// The generator thread's CPU time per packet sent, in nanoseconds.
    pub generator_ns_per_packet: f64,
    /// How the generator's frames left: `af_xdp`, `af_xdp_zerocopy`,
    /// `af_packet` or `socket` (its `io_*` metrics).
    pub generator_path: String,
    /// The generator's report over the window (issue 11 item 4): frame bits
    /// per second / 10^6, its thread's CPU % of one CPU, and the mean and
    /// standard deviation of its departures' inter-arrival times.
    pub offered_mbps: f64,
    pub generator_cpu_pct: f64,
    pub generator_iat_mean_ns: f64,
    pub generator_iat_std_ns: f64,
    /// Inter-arrival mean and deviation at the analyser (kernel stamps),
    /// since it started; 0 when nothing arrived.
    pub arrival_iat_mean_ns: f64,
    pub arrival_iat_std_ns: f64,
}

pub fn run(cmd: DemoCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        DemoCommand::Firewall(a) => firewall(&a),
        DemoCommand::Generator(a) => generator(&a),
        DemoCommand::Tivo(a) => crate::demo_tivo::run(&a),
        DemoCommand::TotalOrder(a) => crate::demo_total_order::run(&a),
    }
}

/// The testbed, removed on drop (even when a row fails).
struct Bed {
    tb: Testbed,
    dir: PathBuf,
}

impl Bed {
    fn up(prefix: &str) -> anyhow::Result<Bed> {
        let tb = Testbed::up(&Topology::default(), prefix).with_context(|| {
            format!("building the demo testbed (if one is left over: `sidecore testbed down --prefix {prefix}`)")
        })?;
        let dir = std::env::temp_dir().join(format!("sidecore-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Bed { tb, dir })
    }

    fn ns(&self, host: &str) -> String {
        format!("{}-{host}", self.tb.prefix)
    }

    fn addr(&self, host: &str, peer: &str) -> anyhow::Result<std::net::Ipv4Addr> {
        Ok(self
            .tb
            .iface(host, peer)
            .with_context(|| format!("the testbed has no link {host}—{peer}"))?
            .addr)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = topology::down(&self.tb.prefix);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A rule file accepting UDP to the allowed port, then `n - 1` rules that
/// never match the traffic (distinct /32 sources, one tuple shape). With
/// `n = 0` it is empty: everything is denied by default without a lookup,
/// the floor a firewall's cost is measured from.
fn rule_file(dir: &Path, server: std::net::Ipv4Addr, n: usize) -> anyhow::Result<PathBuf> {
    let mut text = String::new();
    if n > 0 {
        writeln!(text, "1 udp any any {server} {ALLOWED_PORT} accept")?;
    }
    for i in 1..n {
        let (hi, lo) = ((i >> 8) & 0xff, i & 0xff);
        writeln!(text, "{} udp 172.31.{hi}.{lo} any {server} any deny", i + 1)?;
    }
    let path = dir.join(format!("rules-{n}.txt"));
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The offcode table of one manifest (its id is made from its name).
fn offcode(name: &str, implementation: &str, kind: &str, params: &str) -> String {
    let tag = name
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(u64::from(b)))
        & 0xffff_ffff_ffff;
    format!(
        "[[offcode]]\nname = \"{name}\"\nid = \"5eed0000-0000-4000-8000-{tag:012x}\"\nimpl = \"{implementation}\"\ncpu = 0.5\nmemory = \"16MiB\"\nparams = {{ {params} }}\n\n  [[offcode.target]]\n  kind = \"{kind}\"\n\n"
    )
}

/// Busy and total CPU time of the machine so far, in clock ticks.
fn cpu_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("/proc/stat is empty")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    anyhow::ensure!(v.len() >= 5, "/proc/stat: unexpected first line `{line}`");
    let idle = v[3] + v[4]; // idle + iowait
    let total: u64 = v.iter().take(8).sum();
    Ok((total - idle, total))
}

fn metric(s: &AppStatus, offcode: &str, name: &str) -> u64 {
    s.offcodes
        .iter()
        .find(|o| o.name == offcode)
        .and_then(|o| o.metrics.get(name).copied())
        .unwrap_or(0)
}

/// Counters at one moment of a run.
struct Sample {
    at: Instant,
    generator: Reading,
    received: u64,
    busy: u64,
    total: u64,
}

fn sample(rt: &Runtime, id: sidecore_runtime::AppId) -> anyhow::Result<Sample> {
    let s = rt.status_of(id).context("the demo app vanished")?;
    let (busy, total) = cpu_ticks()?;
    Ok(Sample {
        at: Instant::now(),
        generator: Reading::from_metrics(|m| metric(&s, "generator", m)),
        received: metric(&s, "analyser", "received"),
        busy,
        total,
    })
}

/// How the generator's frames left, from its `io_*` metrics.
fn generator_path(s: &AppStatus) -> String {
    ["af_xdp_zerocopy", "af_xdp", "af_packet", "socket"]
        .into_iter()
        .find(|p| metric(s, "generator", &format!("io_{p}")) == 1)
        .unwrap_or("-")
        .to_string()
}

/// What one deployment is measured as.
struct RunSpec<'a> {
    manifest: String,
    /// The offcode whose PE the row reports.
    placed: &'a str,
    firewall: &'a str,
    rules: usize,
    discard_pct: u32,
    frame_bytes: usize,
    seconds: f64,
}

/// Deploys one manifest, measures a window, stops it.
fn measure(spec: &RunSpec<'_>) -> anyhow::Result<Row> {
    let manifest = sidecore_manifest::parse_str("demo.toml", &spec.manifest)?;
    let inventory = sidecore_pe::discover(&sidecore_pe::DiscoverOptions::default());
    let plan = sidecore_runtime::plan_manifest(
        &manifest,
        &inventory,
        &registry(),
        &sidecore_layout::SolveOptions::default(),
    )?;
    let pe = plan
        .offcodes
        .iter()
        .find(|o| o.name == spec.placed)
        .map_or_else(|| "-".to_string(), |o| o.pe.clone());
    let rt = Runtime::new(RuntimeConfig::default());
    let id = rt.deploy(&plan)?;
    std::thread::sleep(WARM_UP);
    let a = sample(&rt, id)?;
    std::thread::sleep(Duration::from_secs_f64(spec.seconds));
    let b = sample(&rt, id)?;
    let (_, status) = rt
        .stop_app_with_status(id)
        .context("the demo app vanished")?;
    rt.shutdown();
    if let Some(o) = status
        .offcodes
        .iter()
        .find(|o| o.stop_reason.as_deref().is_some_and(|r| r.contains("fail")))
    {
        anyhow::bail!("offcode `{}` failed: {:?}", o.name, o.stop_reason);
    }
    let secs = b.at.duration_since(a.at).as_secs_f64();
    let sent = b.generator.sent.saturating_sub(a.generator.sent);
    let w = window(&a.generator, &b.generator, secs);
    let busy_ns = (b.busy - a.busy) as f64 * 1e9 / USER_HZ;
    let ncpu = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
    let cpus_busy = ncpu * (b.busy - a.busy) as f64 / ((b.total - a.total).max(1)) as f64;
    Ok(Row {
        firewall: spec.firewall.to_string(),
        pe,
        rules: spec.rules,
        discard_pct: spec.discard_pct,
        frame_bytes: spec.frame_bytes,
        offered_pps: sent as f64 / secs,
        delivered_pps: b.received.saturating_sub(a.received) as f64 / secs,
        cpus_busy,
        cpu_ns_per_packet: busy_ns / sent.max(1) as f64,
        generator_ns_per_packet: b.generator.cpu_ns.saturating_sub(a.generator.cpu_ns) as f64
            / sent.max(1) as f64,
        generator_path: generator_path(&status),
        offered_mbps: w.mbps,
        generator_cpu_pct: w.cpu_pct,
        generator_iat_mean_ns: w.iat_mean_ns,
        generator_iat_std_ns: w.iat_std_ns,
        arrival_iat_mean_ns: metric(&status, "analyser", "iat_mean_ns") as f64,
        arrival_iat_std_ns: metric(&status, "analyser", "iat_std_ns") as f64,
    })
}

/// The PE kind and extra parameters of each firewall.
fn firewall_target(name: &str) -> anyhow::Result<Option<(&'static str, &'static str)>> {
    Ok(match name {
        "xdp" => Some(("kernel", "")),
        "user-space" => Some(("core", ", egress = \"to-server\"")),
        "nftables" => Some(("host", "")),
        "none" => None,
        other => {
            anyhow::bail!("--firewalls: `{other}` is not one of xdp, user-space, nftables, none")
        }
    })
}

fn firewall(a: &FirewallArgs) -> anyhow::Result<ExitCode> {
    for f in &a.firewalls {
        firewall_target(f)?;
    }
    let bed = Bed::up(&a.prefix)?;
    let client = bed.addr("client", "middlebox")?;
    let server = bed.addr("server", "middlebox")?;
    let mut rows = Vec::new();
    let total = a.rules.len() * a.discard.len() * a.firewalls.len();
    let bar = crate::progress::Progress::bar(total as u64, "firewall rows");
    for &n in &a.rules {
        let rules = rule_file(&bed.dir, server, n)?;
        for &discard in &a.discard {
            let dports = match discard {
                100 => format!("[{DENIED_PORT}]"),
                50 => format!("[{ALLOWED_PORT}, {DENIED_PORT}]"),
                0 => format!("[{ALLOWED_PORT}]"),
                other => anyhow::bail!("--discard: {other}% (use 0, 50 or 100)"),
            };
            for f in &a.firewalls {
                let mut m = String::from("[app]\nname = \"demo-firewall\"\n\n");
                m.push_str(&offcode(
                    "generator",
                    "traffic-generator",
                    "host",
                    &format!(
                        "netns = \"{}\", mode = \"packet\", iface = \"to-middlebox\", src = \"{client}\", dst = \"{server}\", dports = {dports}, frame_bytes = {}, rate_pps = {}",
                        bed.ns("client"),
                        a.frame_bytes,
                        a.rate_pps
                    ),
                ));
                if let Some((kind, extra)) = firewall_target(f)? {
                    m.push_str(&offcode(
                        "firewall",
                        "firewall",
                        kind,
                        &format!(
                            "rules = \"{}\", netns = \"{}\", ingress = \"to-client\", xdp_mode = \"{}\"{extra}",
                            rules.display(),
                            bed.ns("middlebox"),
                            a.xdp_mode
                        ),
                    ));
                }
                m.push_str(&offcode(
                    "analyser",
                    "traffic-analyser",
                    "host",
                    &format!(
                        "netns = \"{}\", addr = \"{server}\", dports = [{ALLOWED_PORT}, {DENIED_PORT}]",
                        bed.ns("server")
                    ),
                ));
                let row = measure(&RunSpec {
                    manifest: m,
                    placed: "firewall",
                    firewall: f,
                    rules: n,
                    discard_pct: discard,
                    frame_bytes: a.frame_bytes,
                    seconds: a.seconds,
                })
                .with_context(|| format!("firewall {f}, {n} rules, {discard}% discard"))?;
                if !a.json {
                    bar.suspend(|| print_row(&row, rows.is_empty()));
                }
                bar.step(format!("after {f}, {n} rules, {discard}% discard"));
                rows.push(row);
            }
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    drop(bed);
    Ok(ExitCode::SUCCESS)
}

fn generator(a: &GeneratorArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        a.sink == "drop" || a.sink == "analyser",
        "--sink: `{}` is neither `drop` nor `analyser`",
        a.sink
    );
    let bed = Bed::up(&a.prefix)?;
    let client = bed.addr("client", "middlebox")?;
    let server = bed.addr("server", "middlebox")?;
    let nothing = rule_file(&bed.dir, server, 0)?;
    let mut rows = Vec::new();
    for p in &a.paths {
        anyhow::ensure!(
            ["auto", "af_xdp", "af_packet"].contains(&p.as_str()),
            "--paths: `{p}` is not one of auto, af_xdp, af_packet"
        );
    }
    let mut senders: Vec<(&str, &str, &str, &str)> = a
        .paths
        .iter()
        .map(|p| ("dedicated core", "core", "packet", p.as_str()))
        .collect();
    senders.push(("socket loop", "host", "socket", "auto"));
    for &bytes in &a.frame_bytes {
        for &(name, kind, mode, path) in &senders {
            let mut m = String::from("[app]\nname = \"demo-generator\"\n\n");
            m.push_str(&offcode(
                "generator",
                "traffic-generator",
                kind,
                &format!(
                    "netns = \"{}\", mode = \"{mode}\", path = \"{path}\", iface = \"to-middlebox\", src = \"{client}\", dst = \"{server}\", dports = [{ALLOWED_PORT}], frame_bytes = {bytes}",
                    bed.ns("client")
                ),
            ));
            m.push_str(&if a.sink == "drop" {
                offcode(
                    "firewall",
                    "firewall",
                    "kernel",
                    &format!(
                        "rules = \"{}\", netns = \"{}\", ingress = \"to-client\"",
                        nothing.display(),
                        bed.ns("middlebox")
                    ),
                )
            } else {
                offcode(
                    "analyser",
                    "traffic-analyser",
                    "host",
                    &format!(
                        "netns = \"{}\", addr = \"{server}\", dports = [{ALLOWED_PORT}]",
                        bed.ns("server")
                    ),
                )
            });
            let row = measure(&RunSpec {
                manifest: m,
                placed: "generator",
                firewall: name,
                rules: 0,
                discard_pct: if a.sink == "drop" { 100 } else { 0 },
                frame_bytes: bytes,
                seconds: a.seconds,
            })
            .with_context(|| format!("generator {name}, {bytes}-byte frames"))?;
            if !a.json {
                print_row(&row, rows.is_empty());
            }
            rows.push(row);
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    }
    drop(bed);
    Ok(ExitCode::SUCCESS)
}

fn print_row(r: &Row, header: bool) {
    if header {
        println!(
            "{:<15} {:<9} {:>6} {:>8} {:>6} {:>12} {:>12} {:>10} {:>12} {:>12}  {:<10} {:>8} {:>7} {:>17}",
            "what",
            "PE",
            "rules",
            "discard",
            "frame",
            "offered/s",
            "delivered/s",
            "CPUs busy",
            "CPU ns/pkt",
            "gen ns/pkt",
            "gen path",
            "Mb/s",
            "gen CPU",
            "gen IAT mean/sd"
        );
    }
    println!(
        "{:<15} {:<9} {:>6} {:>7}% {:>6} {:>12.0} {:>12.0} {:>10.2} {:>12.0} {:>12.0}  {:<10} {:>8.1} {:>6.1}% {:>17}",
        r.firewall,
        r.pe,
        r.rules,
        r.discard_pct,
        r.frame_bytes,
        r.offered_pps,
        r.delivered_pps,
        r.cpus_busy,
        r.cpu_ns_per_packet,
        r.generator_ns_per_packet,
        r.generator_path,
        r.offered_mbps,
        r.generator_cpu_pct,
        format!(
            "{:.2}/{:.2} us",
            r.generator_iat_mean_ns / 1e3,
            r.generator_iat_std_ns / 1e3
        )
    );
}
