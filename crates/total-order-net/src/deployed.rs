//! The total order through the product itself: one `sidecore up` of the
//! example manifest (`examples/total-order.toml`, the offcodes of
//! [`crate::offcodes`]) per node of the mesh, with `me`, `nodes`, the load
//! and β's peers and namespace filled in. Every node's `to-service` writes a
//! [`Record`] once it has delivered the whole group's messages; the records
//! become the same [`NodeLog`]s the threaded variants produce, so the same
//! check (same order, no gap, no duplicate) and the same figures apply.
//! Throughput runs from the first node's first broadcast, not from the
//! processes' start, so deployment time is not counted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sidecore_total_order::MsgId;

use crate::bed::{Bed, PORT};
use crate::drive::{Load, NodeLog};
use crate::offcodes::Record;

/// Why a deployed run failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("bad parameters: {0}")]
    Params(String),
    #[error("node {node}: {why}")]
    Node { node: usize, why: String },
}

/// What a deployed run needs: the `sidecore` binary and the manifest to
/// deploy on every node (its layout decides where α runs).
#[derive(Debug, Clone)]
pub struct Deploy {
    pub exe: PathBuf,
    pub manifest: PathBuf,
}

fn node_err(node: usize, why: impl Into<String>) -> DeployError {
    DeployError::Node {
        node,
        why: why.into(),
    }
}

/// Node `i`'s copy of the manifest `text`: every offcode of the three
/// implementations gets its place in the group, the load and (β) its
/// namespace and every node's address; `record` goes to `to-service`.
pub fn node_manifest(
    text: &str,
    bed: &Bed,
    i: usize,
    load: Load,
    record: Option<&Path>,
) -> Result<String, DeployError> {
    let mut doc: toml::Table = text
        .parse()
        .map_err(|e| DeployError::Params(format!("the manifest: {e}")))?;
    let offcodes = doc
        .get_mut("offcode")
        .and_then(toml::Value::as_array_mut)
        .ok_or_else(|| DeployError::Params("the manifest has no [[offcode]]".into()))?;
    let n = bed.nodes();
    let int = |v: usize| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX));
    for o in offcodes.iter_mut().filter_map(toml::Value::as_table_mut) {
        let imp = o.get("impl").and_then(toml::Value::as_str).unwrap_or("");
        let mut p = toml::Table::new();
        p.insert("me".into(), int(i));
        p.insert("nodes".into(), int(n));
        match imp {
            "to-service" => {
                p.insert("messages".into(), int(load.per_node));
                p.insert("window".into(), int(load.window));
                p.insert("payload_bytes".into(), int(load.payload_bytes));
                if let Some(r) = record {
                    p.insert("record".into(), r.display().to_string().into());
                }
            }
            "lamport-orderer" => {}
            "reliable-broadcast" => {
                p.insert("port".into(), int(usize::from(PORT)));
                p.insert("netns".into(), bed.netns(i).to_string().into());
                let peers = bed.peers_of(i).into_iter().map(|a| a.to_string().into());
                p.insert("peers".into(), toml::Value::Array(peers.collect()));
            }
            _ => continue,
        }
        o.insert("params".into(), toml::Value::Table(p));
    }
    toml::to_string(&doc).map_err(|e| DeployError::Params(format!("the manifest: {e}")))
}

/// The `up` processes of a run; any still running are stopped on drop.
struct Ups(Vec<Child>);

impl Drop for Ups {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs the deployed total order on `bed`: the nodes' logs (β's
/// retransmissions and NACKs in their stats) with times from the first
/// broadcast.
pub fn run(
    bed: &Bed,
    load: Load,
    deadline: Duration,
    d: &Deploy,
) -> Result<Vec<NodeLog>, DeployError> {
    let n = bed.nodes();
    let text = std::fs::read_to_string(&d.manifest)
        .map_err(|e| DeployError::Params(format!("{}: {e}", d.manifest.display())))?;
    let dir = tempfile::Builder::new()
        .prefix("sc-to-up")
        .tempdir()
        .map_err(|e| DeployError::Params(format!("a temporary directory: {e}")))?;
    let records: Vec<PathBuf> = (0..n)
        .map(|i| dir.path().join(format!("record{i}.json")))
        .collect();
    let mut ups = Ups(Vec::new());
    for (i, record) in records.iter().enumerate() {
        let m = dir.path().join(format!("node{i}.toml"));
        std::fs::write(&m, node_manifest(&text, bed, i, load, Some(record))?)
            .map_err(|e| node_err(i, format!("{}: {e}", m.display())))?;
        let child = Command::new(&d.exe)
            .arg("up")
            .arg(&m)
            .args(["--json", "--quiet", "--for"])
            .arg(format!("{}s", deadline.as_secs() + 10))
            .arg("--socket")
            .arg(dir.path().join(format!("s{i}.sock")))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| node_err(i, format!("cannot start {}: {e}", d.exe.display())))?;
        ups.0.push(child);
    }
    let give_up = Instant::now() + deadline;
    while !records.iter().all(|r| r.exists()) {
        for (i, c) in ups.0.iter_mut().enumerate() {
            if let Ok(Some(status)) = c.try_wait() {
                let mut err = String::new();
                if let Some(e) = c.stderr.as_mut() {
                    let _ = std::io::Read::read_to_string(e, &mut err);
                }
                return Err(node_err(
                    i,
                    format!(
                        "`sidecore up` ended ({status}) before its node had every message: {}",
                        err.trim()
                    ),
                ));
            }
        }
        if Instant::now() > give_up {
            let missing: Vec<usize> = (0..n).filter(|&i| !records[i].exists()).collect();
            return Err(DeployError::Params(format!(
                "nodes {missing:?} had not delivered every message after {deadline:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = stop_all(&mut ups)?;
    let recs: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let bytes =
                std::fs::read(r).map_err(|e| node_err(i, format!("{}: {e}", r.display())))?;
            serde_json::from_slice(&bytes).map_err(|e| node_err(i, format!("{}: {e}", r.display())))
        })
        .collect::<Result<_, _>>()?;
    let t0 = recs.iter().map(|r| r.first_broadcast_ns).min().unwrap_or(0);
    Ok(recs
        .into_iter()
        .zip(stats)
        .map(|(r, (retransmitted, nacks_sent))| {
            let mut log = NodeLog {
                order: r
                    .order
                    .iter()
                    .map(|&(sender, seq)| MsgId { sender, seq })
                    .collect(),
                latencies_ns: r.latencies_ns,
                done_ns: Some(r.done_ns.saturating_sub(t0)),
                ..NodeLog::default()
            };
            log.stats.retransmitted = retransmitted;
            log.stats.nacks_sent = nacks_sent;
            log
        })
        .collect())
}

/// Stops every `up` (SIGTERM: each prints its final status as JSON) and
/// reads β's (retransmitted, nacks_sent) from it.
fn stop_all(ups: &mut Ups) -> Result<Vec<(u64, u64)>, DeployError> {
    for c in &ups.0 {
        // SAFETY: kill(2) on our own child's pid, which it still is (not waited for).
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
    }
    ups.0
        .drain(..)
        .enumerate()
        .map(|(i, c)| {
            let o = c
                .wait_with_output()
                .map_err(|e| node_err(i, format!("`sidecore up`: {e}")))?;
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| {
                node_err(
                    i,
                    format!(
                        "`sidecore up --json` printed no status ({e}): {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    ),
                )
            })?;
            let beta = v["status"][0]["offcodes"]
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .find(|o| o["impl"] == "reliable-broadcast" || o["name"] == "broadcast")
                })
                .map(|o| &o["metrics"]);
            let metric = |k: &str| beta.and_then(|m| m[k].as_u64()).unwrap_or(0);
            Ok((metric("retransmitted"), metric("nacks_sent")))
        })
        .collect()
}
