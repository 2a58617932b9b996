//! `sidecore demo total-order`: HYDRA's offloaded total order (§8.2, Table
//! 8.5) on a full mesh of network namespaces with injected loss. For each
//! group size it builds the mesh, runs the Lamport order with the orderer
//! (α) on the application's thread and beside reliable broadcast (β) on the
//! NIC thread, then the two baselines — a fixed sequencer in plain user space
//! and etcd's Raft log — and the same offcodes deployed by the product (one
//! `sidecore up` of `examples/total-order.toml` per node, α on β's core as
//! its layout says) — checks that every node delivered the same sequence
//! with no gap and no duplicate, prints throughput and broadcast-to-deliver
//! latency side by side, and removes the namespaces.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use sidecore_total_order::RbConfig;
use sidecore_total_order_net::{Bed, Deploy, Measured, RunOptions, Variant, run as run_variant};

/// `examples/total-order.toml`, the deployed variant's default manifest.
const EXAMPLE: &str = include_str!("../../../examples/total-order.toml");

/// The seed's Table 8.5 (offload-aware TO): nodes, Mb/s, latency ms.
const SEED: [(usize, f64, f64); 2] = [(3, 301.8, 8.7), (5, 324.6, 9.5)];

#[derive(Debug, Args)]
pub struct TotalOrderArgs {
    /// Group sizes to run (2..=8).
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    nodes: Vec<usize>,
    /// Loss injected on every interface's egress, percent.
    #[arg(long, default_value_t = 5.0)]
    loss_percent: f64,
    /// Messages each node broadcasts.
    #[arg(long, default_value_t = 2000)]
    messages: usize,
    /// Payload bytes per message (at least 8: the send time).
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Flow control: a node's own messages in flight at once.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// What to run: host, offloaded, sequencer, etcd, deployed.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "host,offloaded,sequencer,etcd,deployed"
    )]
    variants: Vec<String>,
    /// The manifest the deployed variant runs on every node (its layout
    /// decides where α runs) [default: the built-in
    /// `examples/total-order.toml`].
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Longest a run may take, seconds.
    #[arg(long, default_value_t = 60.0)]
    deadline_s: f64,
    /// Where etcd keeps its data [default: the temporary directory].
    #[arg(long)]
    etcd_dir: Option<PathBuf>,
    /// Namespace prefix of the demo's meshes.
    #[arg(long, default_value = "sc-to")]
    prefix: String,
    /// Print the results as JSON lines instead of the table.
    #[arg(long)]
    json: bool,
}

/// Removes a mesh's namespaces however the run ends.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = sidecore_testbed::topology::down(&self.0);
    }
}

pub fn run(a: &TotalOrderArgs) -> anyhow::Result<ExitCode> {
    let variants: Vec<Variant> = a
        .variants
        .iter()
        .map(|v| {
            Variant::parse(v).with_context(|| {
                format!("unknown variant `{v}` (host, offloaded, sequencer, etcd, deployed)")
            })
        })
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(
        a.deadline_s > 0.0 && a.deadline_s.is_finite(),
        "--deadline-s must be positive"
    );
    let mut opts = RunOptions {
        per_node: a.messages,
        payload_bytes: a.payload_bytes,
        window: a.window,
        deadline: Duration::from_secs_f64(a.deadline_s),
        rb: RbConfig::default(),
        etcd_dir: a.etcd_dir.clone().unwrap_or_else(std::env::temp_dir),
        deploy: None,
    };
    // The built-in example, written out for the `sidecore up`s to read.
    let builtin = tempfile::Builder::new()
        .prefix("sc-total-order")
        .suffix(".toml")
        .tempfile()
        .context("a temporary file for the built-in manifest")?;
    if variants.contains(&Variant::Deployed) {
        opts.deploy = Some(deploy(a.manifest.as_deref(), builtin.path())?);
    }
    let mut all = Vec::new();
    let mut loss_by = String::new();
    let runs = (a.nodes.len() * variants.len()) as u64;
    let bar = crate::progress::Progress::bar(runs, "total order");
    for &n in &a.nodes {
        bar.say(format!("total order: building the {n}-node mesh"));
        let prefix = format!("{}{n}", a.prefix);
        let _ = sidecore_testbed::topology::down(&prefix);
        let bed = Bed::up(n, &prefix, a.loss_percent)
            .with_context(|| format!("building the {n}-node mesh (needs root)"))?;
        let _down = Down(prefix);
        loss_by = bed.loss.to_string();
        for &v in &variants {
            bar.say(format!("total order: {} on {n} nodes", v.name()));
            let m = run_variant(&bed, v, &opts)
                .with_context(|| format!("{} on {n} nodes", v.name()))?;
            let line = if a.json {
                serde_json::to_string(&m)?
            } else {
                format!("  {n} nodes, {}: {:.0} msg/s", v.name(), m.msgs_per_s)
            };
            bar.suspend(|| {
                if a.json {
                    println!("{line}");
                } else {
                    eprintln!("{line}");
                }
            });
            bar.step("total order");
            all.push(m);
        }
    }
    drop(bar);
    if !a.json {
        print!("{}", table(a, &loss_by, &all));
    }
    let bad: Vec<&Measured> = all.iter().filter(|m| !m.problems.is_empty()).collect();
    for m in &bad {
        eprintln!(
            "{} on {} nodes: {}",
            m.variant.name(),
            m.nodes,
            m.problems.join("; ")
        );
    }
    Ok(if bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What the deployed variant runs: this binary, and `manifest` or the
/// built-in example written to `builtin`.
fn deploy(manifest: Option<&std::path::Path>, builtin: &std::path::Path) -> anyhow::Result<Deploy> {
    let manifest = match manifest {
        Some(m) => {
            anyhow::ensure!(
                m.is_file(),
                "--manifest {}: no such file (the deployed variant runs it on every node)",
                m.display()
            );
            m.to_path_buf()
        }
        None => {
            std::fs::write(builtin, EXAMPLE).context("the built-in manifest")?;
            builtin.to_path_buf()
        }
    };
    Ok(Deploy {
        exe: std::env::current_exe().context("this binary's path")?,
        manifest,
    })
}

/// Table 8.5's shape, the checks, the ratios and the seed's figures.
fn table(a: &TotalOrderArgs, loss_by: &str, all: &[Measured]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Total order, all-to-all: {} messages of {} bytes per node, window {} (etcd: as many puts in flight per node), {}% loss ({loss_by})",
        a.messages, a.payload_bytes, a.window, a.loss_percent
    );
    let _ = writeln!(
        s,
        "{:<6} {:<18} {:>10} {:>8} {:>8} {:>8} {:>6} {:>7}",
        "nodes", "orderer", "msg/s", "Mb/s", "p50 ms", "p99 ms", "order", "resent"
    );
    for m in all {
        let ok = if m.problems.is_empty() {
            "same"
        } else {
            "WRONG"
        };
        let _ = writeln!(
            s,
            "{:<6} {:<18} {:>10.0} {:>8.1} {:>8.2} {:>8.2} {:>6} {:>7}",
            m.nodes,
            m.variant.name(),
            m.msgs_per_s,
            m.mbps,
            m.p50_ms,
            m.p99_ms,
            ok,
            m.retransmitted
        );
    }
    let find = |n, v| all.iter().find(|m| m.nodes == n && m.variant == v);
    for &n in &a.nodes {
        let Some(off) = find(n, Variant::OffloadedOrderer) else {
            continue;
        };
        for base in [
            Variant::Etcd,
            Variant::FixedSequencer,
            Variant::HostOrderer,
            Variant::Deployed,
        ] {
            if let Some(b) = find(n, base) {
                let _ = writeln!(
                    s,
                    "{n} nodes: offloaded orderer / {}: {:.1}x msg/s, p50 {:.2} against {:.2} ms",
                    base.name(),
                    off.msgs_per_s / b.msgs_per_s.max(1e-9),
                    off.p50_ms,
                    b.p50_ms
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "seed (Table 8.5, offload-aware TO on Tigon2 NICs): {}",
        SEED.iter()
            .map(|(n, mbps, ms)| format!("{n} nodes {mbps} Mb/s at {ms} ms"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    s.push_str(
        "order: `same` = every node delivered the same sequence, no gap, no duplicate; \
         resent = β's retransmissions on NACKs\n",
    );
    s
}
