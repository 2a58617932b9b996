//! One measured run of one variant on a mesh: every node broadcasts
//! `per_node` messages as fast as flow control allows; the run ends when
//! every node has delivered all of them (or at the deadline). Then every
//! node's sequence is checked against node 0's — same order, no gap, no
//! duplicate, and for the protocols here each sender's messages in its own
//! order — and throughput and broadcast-to-deliver latency are computed.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sidecore_total_order::{MsgId, RbConfig};

use crate::bed::{Bed, PORT};
use crate::drive::{self, Clock, Load, Net, NodeLog, Placement};
use crate::etcd;

/// What is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// α on the application's thread, β on the NIC thread.
    HostOrderer,
    /// α beside β on the NIC thread.
    OffloadedOrderer,
    /// A fixed sequencer in plain user space.
    FixedSequencer,
    /// etcd's Raft log as the sequencer.
    Etcd,
    /// The offcodes of the example manifest, one `sidecore up` per node
    /// ([`crate::deployed`]): α where the manifest's layout puts it.
    Deployed,
}

impl Variant {
    pub const ALL: [Variant; 4] = [
        Variant::HostOrderer,
        Variant::OffloadedOrderer,
        Variant::FixedSequencer,
        Variant::Etcd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::HostOrderer => "host orderer",
            Variant::OffloadedOrderer => "offloaded orderer",
            Variant::FixedSequencer => "fixed sequencer",
            Variant::Etcd => "etcd",
            Variant::Deployed => "deployed offcodes",
        }
    }

    /// The variant named `s` (`host`, `offloaded`, `sequencer`, `etcd`,
    /// `deployed`).
    pub fn parse(s: &str) -> Option<Variant> {
        Some(match s {
            "host" | "host-orderer" => Variant::HostOrderer,
            "offloaded" | "offloaded-orderer" => Variant::OffloadedOrderer,
            "sequencer" | "fixed-sequencer" => Variant::FixedSequencer,
            "etcd" => Variant::Etcd,
            "deployed" | "offcodes" => Variant::Deployed,
            _ => return None,
        })
    }
}

/// How a run is made.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub per_node: usize,
    pub payload_bytes: usize,
    pub window: usize,
    pub deadline: Duration,
    pub rb: RbConfig,
    /// Where etcd keeps its data.
    pub etcd_dir: PathBuf,
    /// The binary and manifest of [`Variant::Deployed`].
    pub deploy: Option<crate::deployed::Deploy>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            per_node: 500,
            payload_bytes: 256,
            window: 32,
            deadline: Duration::from_secs(30),
            rb: RbConfig::default(),
            etcd_dir: std::env::temp_dir(),
            deploy: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("bad parameters: {0}")]
    Params(String),
    #[error("node {node}: {why}")]
    Node { node: usize, why: String },
    /// Not chained as a source: the message already ends with the cause.
    #[error("etcd: {0}")]
    Etcd(etcd::EtcdError),
    #[error(transparent)]
    Deployed(#[from] crate::deployed::DeployError),
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub variant: Variant,
    pub nodes: usize,
    /// Messages broadcast in all.
    pub messages: usize,
    pub seconds: f64,
    /// Messages in the total order per second (every node delivers each).
    pub msgs_per_s: f64,
    /// The same in payload megabits per second.
    pub mbps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Every node delivered every message.
    pub complete: bool,
    /// What the check found wrong (empty: same sequence, no gap, no duplicate).
    pub problems: Vec<String>,
    pub retransmitted: u64,
    pub nacks: u64,
    pub malformed: u64,
    pub send_errors: u64,
}

impl RunOptions {
    fn check(&self) -> Result<(), RunError> {
        if self.per_node == 0 || self.window == 0 {
            return Err(RunError::Params(
                "`per_node` and `window` must be at least 1".into(),
            ));
        }
        if !(drive::STAMP_BYTES..=sidecore_total_order::sequencer::MAX_SEQ_PAYLOAD_BYTES)
            .contains(&self.payload_bytes)
        {
            return Err(RunError::Params(format!(
                "`payload_bytes` {} (between {} and {})",
                self.payload_bytes,
                drive::STAMP_BYTES,
                sidecore_total_order::sequencer::MAX_SEQ_PAYLOAD_BYTES
            )));
        }
        Ok(())
    }
}

/// Runs `variant` on `bed`.
pub fn run(bed: &Bed, variant: Variant, opts: &RunOptions) -> Result<Measured, RunError> {
    opts.check()?;
    let n = bed.nodes();
    let clock = Clock(Instant::now());
    let load = Load {
        per_node: opts.per_node,
        payload_bytes: opts.payload_bytes,
        window: opts.window,
        deadline_ns: u64::try_from(opts.deadline.as_nanos()).unwrap_or(u64::MAX),
    };
    let (logs, nics) = match variant {
        Variant::HostOrderer => lamport(bed, Placement::Host, load, opts.rb, clock)?,
        Variant::OffloadedOrderer => lamport(bed, Placement::Beside, load, opts.rb, clock)?,
        Variant::FixedSequencer => (sequencer(bed, load, opts.rb, clock)?, Vec::new()),
        Variant::Etcd => (via_etcd(bed, load, &opts.etcd_dir, clock)?, Vec::new()),
        Variant::Deployed => {
            let d = opts.deploy.as_ref().ok_or_else(|| {
                RunError::Params(
                    "the deployed variant needs the `sidecore` binary and a manifest".into(),
                )
            })?;
            (
                crate::deployed::run(bed, load, opts.deadline, d)?,
                Vec::new(),
            )
        }
    };
    Ok(measure(variant, n, opts, &logs, &nics))
}

/// Joins a node's thread, naming it on failure.
fn joined<T>(
    node: usize,
    h: std::thread::ScopedJoinHandle<'_, Result<T, impl std::fmt::Display>>,
) -> Result<T, RunError> {
    match h.join() {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(RunError::Node {
            node,
            why: e.to_string(),
        }),
        Err(_) => Err(RunError::Node {
            node,
            why: "its thread panicked".into(),
        }),
    }
}

/// Waits until `done` reaches `n` or the deadline passes, then raises `stop`.
fn until_done(done: &AtomicUsize, n: usize, load: Load, clock: Clock, stop: &AtomicBool) {
    while done.load(Ordering::SeqCst) < n && clock.now_ns() < load.deadline_ns + 1_000_000_000 {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::SeqCst);
}

fn bind_all(bed: &Bed) -> Result<Vec<Net>, RunError> {
    (0..bed.nodes())
        .map(|i| {
            Net::bind(bed.netns(i), PORT, i, bed.peers_of(i)).map_err(|e| RunError::Node {
                node: i,
                why: format!("cannot bind UDP port {PORT}: {e}"),
            })
        })
        .collect()
}

type Logs = (Vec<NodeLog>, Vec<NodeLog>);

fn lamport(
    bed: &Bed,
    place: Placement,
    load: Load,
    cfg: RbConfig,
    clock: Clock,
) -> Result<Logs, RunError> {
    let n = bed.nodes();
    let nets = bind_all(bed)?;
    let (done, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
    std::thread::scope(|s| {
        let mut apps = Vec::new();
        let mut nics = Vec::new();
        for (i, net) in nets.into_iter().enumerate() {
            let (dtx, drx) = mpsc::channel();
            let (utx, urx) = mpsc::channel();
            let (done, stop) = (&done, &stop);
            nics.push(s.spawn(move || drive::nic(net, i, n, place, cfg, clock, &drx, &utx, stop)));
            apps.push(s.spawn(move || drive::app(i, n, place, load, clock, &dtx, &urx, done)));
        }
        until_done(&done, n, load, clock, &stop);
        let apps: Result<Vec<_>, _> = apps
            .into_iter()
            .enumerate()
            .map(|(i, h)| joined(i, h))
            .collect();
        let nics: Result<Vec<_>, _> = nics
            .into_iter()
            .enumerate()
            .map(|(i, h)| joined(i, h))
            .collect();
        Ok((apps?, nics?))
    })
}

fn sequencer(bed: &Bed, load: Load, cfg: RbConfig, clock: Clock) -> Result<Vec<NodeLog>, RunError> {
    let n = bed.nodes();
    let nets = bind_all(bed)?;
    let (done, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
    std::thread::scope(|s| {
        let hs: Vec<_> = nets
            .into_iter()
            .enumerate()
            .map(|(i, net)| {
                let (done, stop) = (&done, &stop);
                s.spawn(move || drive::sequencer(net, i, n, load, cfg, clock, done, stop))
            })
            .collect();
        until_done(&done, n, load, clock, &stop);
        hs.into_iter()
            .enumerate()
            .map(|(i, h)| joined(i, h))
            .collect()
    })
}

fn via_etcd(
    bed: &Bed,
    load: Load,
    dir: &std::path::Path,
    clock: Clock,
) -> Result<Vec<NodeLog>, RunError> {
    let n = bed.nodes();
    let mut server = etcd::EtcdServer::start(bed, dir).map_err(RunError::Etcd)?;
    let from = etcd::revision(bed, 0).map_err(RunError::Etcd)? + 1;
    // The clock starts when the watches are about to open, not at etcd's start.
    let clock = Clock(clock.0 + Duration::from_nanos(clock.now_ns()));
    let done = AtomicUsize::new(0);
    let logs = std::thread::scope(|s| {
        let watchers: Vec<_> = (0..n)
            .map(|i| {
                let done = &done;
                s.spawn(move || etcd::watcher(bed, i, from, load, clock, done))
            })
            .collect();
        // Let the watches open before the first put (they start at `from` anyway).
        std::thread::sleep(Duration::from_millis(100));
        let putters: Vec<_> = (0..n)
            .flat_map(|i| (0..etcd::put_threads(load.window)).map(move |t| (i, t)))
            .map(|(i, t)| s.spawn(move || etcd::putter(bed, i, t, load, clock)))
            .collect();
        for h in putters {
            let _ = h.join();
        }
        watchers
            .into_iter()
            .enumerate()
            .map(|(i, h)| joined(i, h))
            .collect::<Result<Vec<_>, _>>()
    });
    server.stop();
    logs
}

/// Every node's sequence against node 0's: same order, complete, no
/// duplicate; with `fifo`, each sender's messages in its own order.
pub fn check(logs: &[NodeLog], n: usize, per_node: usize, fifo: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let total = n * per_node;
    for (i, log) in logs.iter().enumerate() {
        let unique: HashSet<&MsgId> = log.order.iter().collect();
        if unique.len() != log.order.len() {
            problems.push(format!(
                "node {i} delivered {} duplicates",
                log.order.len() - unique.len()
            ));
        }
        if log.order.len() != total {
            problems.push(format!(
                "node {i} delivered {} of {total} messages",
                log.order.len()
            ));
        }
        let common = log.order.len().min(logs[0].order.len());
        if let Some(k) = (0..common).find(|&k| log.order[k] != logs[0].order[k]) {
            problems.push(format!(
                "node {i} and node 0 disagree at position {k}: {:?} against {:?}",
                log.order[k], logs[0].order[k]
            ));
        }
        if fifo {
            let mut next = vec![0u64; n];
            for m in &log.order {
                let Some(x) = next.get_mut(usize::from(m.sender)) else {
                    problems.push(format!(
                        "node {i} delivered a message of unknown sender {}",
                        m.sender
                    ));
                    break;
                };
                if m.seq != *x {
                    problems.push(format!(
                        "node {i}: a gap in sender {}'s messages at {}",
                        m.sender, *x
                    ));
                    break;
                }
                *x += 1;
            }
        }
    }
    problems
}

/// The `q` quantile of `v` (sorted), ms.
fn quantile_ms(v: &[u64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let k = ((v.len() - 1) as f64 * q).round() as usize;
    v[k] as f64 / 1e6
}

fn measure(
    variant: Variant,
    n: usize,
    opts: &RunOptions,
    logs: &[NodeLog],
    nics: &[NodeLog],
) -> Measured {
    let messages = n * opts.per_node;
    let fifo = variant != Variant::Etcd;
    let problems = check(logs, n, opts.per_node, fifo);
    let complete = logs.iter().all(|l| l.done_ns.is_some());
    let end_ns = logs.iter().filter_map(|l| l.done_ns).max().unwrap_or(0);
    let delivered = logs.iter().map(|l| l.order.len()).min().unwrap_or(0);
    let seconds = if complete {
        end_ns as f64 / 1e9
    } else {
        opts.deadline.as_secs_f64()
    };
    let msgs_per_s = delivered as f64 / seconds.max(1e-9);
    let mut lat: Vec<u64> = logs
        .iter()
        .flat_map(|l| l.latencies_ns.iter().copied())
        .collect();
    lat.sort_unstable();
    let stats = |f: fn(&NodeLog) -> u64| logs.iter().chain(nics).map(f).sum::<u64>();
    Measured {
        variant,
        nodes: n,
        messages,
        seconds,
        msgs_per_s,
        mbps: msgs_per_s * opts.payload_bytes as f64 * 8.0 / 1e6,
        p50_ms: quantile_ms(&lat, 0.5),
        p99_ms: quantile_ms(&lat, 0.99),
        complete,
        problems,
        retransmitted: stats(|l| l.stats.retransmitted),
        nacks: stats(|l| l.stats.nacks_sent),
        malformed: stats(|l| l.stats.malformed),
        send_errors: stats(|l| l.send_errors),
    }
}
