//! The baseline a user would pick today: etcd as the sequencer. etcd runs
//! in node 0's namespace (one member, its data on this machine's disk, fsync
//! on, as deployed); every broadcast is a put of `/to/n{node}/{k}` (a
//! transaction: only if the key is new, so a retried put is ordered once)
//! through its v3 JSON gateway, and every node watches the prefix from one
//! revision on — the revision order of etcd's Raft log is the total order. Each node
//! keeps as many puts in flight as the TO service's window lets a node have
//! broadcasts in flight (a thread per put, at most [`MAX_PUT_THREADS`]), so
//! the two are measured at the same concurrency.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use sidecore_total_order::MsgId;

use crate::bed::Bed;
use crate::drive::{Clock, Load, NodeLog, payload, sent_at};

/// etcd's client port inside node 0's namespace.
pub const CLIENT_PORT: u16 = 2379;
/// Most puts in flight per node.
pub const MAX_PUT_THREADS: usize = 64;

/// Puts in flight per node for a window of `window`.
pub fn put_threads(window: usize) -> usize {
    window.clamp(1, MAX_PUT_THREADS)
}
/// The key prefix of the run's messages.
const PREFIX: &str = "/to/";
/// The end of the prefix's range (`/` + 1).
const PREFIX_END: &str = "/to0";

/// A running etcd in node 0's namespace.
pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
}

fn agent(whole: Duration) -> ureq::Agent {
    let cfg = ureq::Agent::config_builder()
        // A lost SYN is retried after 1 s and again after 3 s: with 2 s, one
        // drop on a loaded machine failed a whole run (seen once in CI's load).
        .timeout_connect(Some(Duration::from_secs(5)))
        .timeout_global(Some(whole))
        .http_status_as_error(false)
        .build();
    ureq::Agent::new_with_config(cfg)
}

/// What went wrong with the etcd baseline; each message names the URL or file.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("{url}: {source}")]
    Http { url: String, source: ureq::Error },
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: ureq::http::StatusCode,
        body: String,
    },
    #[error("{url}: not JSON ({source})")]
    NotJson {
        url: String,
        source: serde_json::Error,
    },
    #[error("{}: {source}", path.display())]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// etcd's log file could not be made.
    #[error("{0}")]
    Log(#[source] std::io::Error),
    #[error("cannot start {bin} ({source}); scripts/setup.sh installs etcd-server")]
    Spawn { bin: String, source: std::io::Error },
    #[error("etcd exited ({status}); see {}", log.display())]
    Exited {
        status: std::process::ExitStatus,
        log: PathBuf,
    },
    #[error("etcd did not answer within 15 s; see {}", log.display())]
    Silent { log: PathBuf },
    #[error("{0}")]
    Netns(#[source] sidecore_testbed::NetnsError),
}

fn post(a: &ureq::Agent, url: &str, body: &Value) -> Result<Value, EtcdError> {
    let http = |source| EtcdError::Http {
        url: url.to_string(),
        source,
    };
    let mut r = a
        .post(url)
        .send(body.to_string().as_bytes())
        .map_err(http)?;
    let text = r.body_mut().read_to_string().map_err(http)?;
    if !r.status().is_success() {
        return Err(EtcdError::Status {
            url: url.to_string(),
            status: r.status(),
            body: text,
        });
    }
    serde_json::from_str(&text).map_err(|source| EtcdError::NotJson {
        url: url.to_string(),
        source,
    })
}

/// The endpoint node `i` reaches etcd at.
fn endpoint(bed: &Bed, i: usize) -> String {
    format!("http://{}:{CLIENT_PORT}", bed.addr(i, 0).ip())
}

impl EtcdServer {
    /// Starts etcd in node 0's namespace with its data under `dir`, and
    /// waits until it answers.
    pub fn start(bed: &Bed, dir: &Path) -> Result<EtcdServer, EtcdError> {
        let dir = dir.join(format!("etcd-{}", bed.testbed.prefix));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| EtcdError::Dir {
            path: dir.clone(),
            source,
        })?;
        let log = std::fs::File::create(dir.join("etcd.log")).map_err(EtcdError::Log)?;
        let log2 = log.try_clone().map_err(EtcdError::Log)?;
        let bin = std::env::var("ETCD").unwrap_or_else(|_| "etcd".into());
        let peer = "http://127.0.0.1:2380";
        let child = Command::new("ip")
            .args(["netns", "exec", bed.netns(0), &bin])
            .arg("--name=default")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls=http://0.0.0.0:{CLIENT_PORT}"))
            .arg(format!("--advertise-client-urls={}", endpoint(bed, 1)))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|source| EtcdError::Spawn {
                bin: bin.clone(),
                source,
            })?;
        let mut s = EtcdServer { child, dir };
        let a = agent(Duration::from_secs(2));
        let url = format!("{}/v3/kv/range", endpoint(bed, 1));
        for _ in 0..300 {
            let ok = sidecore_testbed::within(Some(bed.netns(1)), || {
                post(&a, &url, &json!({"key": B64.encode("/probe")})).is_ok()
            })
            .unwrap_or(false);
            if ok {
                return Ok(s);
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                return Err(EtcdError::Exited {
                    status: st,
                    log: s.dir.join("etcd.log"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        s.stop();
        Err(EtcdError::Silent {
            log: s.dir.join("etcd.log"),
        })
    }

    /// Kills it and removes its data.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The store's revision now, read from node `i`.
pub fn revision(bed: &Bed, i: usize) -> Result<i64, EtcdError> {
    let a = agent(Duration::from_secs(5));
    let url = format!("{}/v3/kv/range", endpoint(bed, i));
    let v = sidecore_testbed::within(Some(bed.netns(i)), || {
        post(&a, &url, &json!({"key": B64.encode(PREFIX), "range_end": B64.encode(PREFIX_END), "count_only": true}))
    })
    .map_err(EtcdError::Netns)??;
    Ok(int(&v["header"]["revision"]))
}

fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        v => v.as_i64().unwrap_or(0),
    }
}

/// Attempts at one put before it counts as failed.
const PUT_ATTEMPTS: usize = 5;

/// One of node `i`'s put threads: messages `t, t + threads, …`. Each is a
/// transaction that creates the key only if it does not exist, so a put
/// retried after a timeout (whose first attempt may have landed) never
/// orders a message twice. Returns the puts that failed every attempt.
pub fn putter(bed: &Bed, i: usize, t: usize, load: Load, clock: Clock) -> Result<u64, EtcdError> {
    let a = agent(Duration::from_secs(10));
    let url = format!("{}/v3/kv/txn", endpoint(bed, i));
    sidecore_testbed::within(Some(bed.netns(i)), || {
        let mut failed = 0;
        for k in (t..load.per_node).step_by(put_threads(load.window)) {
            let key = B64.encode(format!("{PREFIX}n{i}/{k}"));
            let value = B64.encode(payload(clock.now_ns(), load.payload_bytes));
            let txn = json!({
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
                "success": [{"request_put": {"key": key, "value": value}}],
            });
            let ok = (0..PUT_ATTEMPTS)
                .take_while(|_| clock.now_ns() < load.deadline_ns)
                .any(|_| post(&a, &url, &txn).is_ok());
            if !ok {
                failed += 1;
            }
        }
        failed
    })
    .map_err(EtcdError::Netns)
}

/// Node `i`'s watch from revision `from`: the order, until every message is here.
pub fn watcher(
    bed: &Bed,
    i: usize,
    from: i64,
    load: Load,
    clock: Clock,
    done: &AtomicUsize,
) -> Result<NodeLog, EtcdError> {
    let total = bed.nodes() * load.per_node;
    let left = load.deadline_ns.saturating_sub(clock.now_ns());
    let a = agent(Duration::from_nanos(left.max(1)));
    let url = format!("{}/v3/watch", endpoint(bed, i));
    let body = json!({"create_request": {"key": B64.encode(PREFIX), "range_end": B64.encode(PREFIX_END), "start_revision": from}});
    let r = sidecore_testbed::within(Some(bed.netns(i)), || {
        let mut log = NodeLog::default();
        let resp = a.post(&url).send(body.to_string().as_bytes());
        let resp = match resp {
            Ok(r) => r,
            Err(source) => {
                let e = EtcdError::Http {
                    url: url.clone(),
                    source,
                };
                return (log, Some(e));
            }
        };
        let lines = BufReader::new(resp.into_body().into_reader()).lines();
        for line in lines {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let now = clock.now_ns();
            for ev in v["result"]["events"].as_array().into_iter().flatten() {
                let key = B64
                    .decode(ev["kv"]["key"].as_str().unwrap_or(""))
                    .unwrap_or_default();
                let val = B64
                    .decode(ev["kv"]["value"].as_str().unwrap_or(""))
                    .unwrap_or_default();
                log.order.push(parse_key(&key));
                log.latencies_ns.push(now.saturating_sub(sent_at(&val)));
            }
            if log.order.len() >= total {
                log.done_ns = Some(now);
                break;
            }
        }
        (log, None)
    })
    .map_err(EtcdError::Netns);
    done.fetch_add(1, Ordering::SeqCst);
    let (log, err) = r?;
    match err {
        Some(e) => Err(e),
        None => Ok(log),
    }
}

/// `/to/n{node}/{k}` → the message's id (`u16::MAX` for a key not of the run).
fn parse_key(key: &[u8]) -> MsgId {
    let s = String::from_utf8_lossy(key);
    let mut parts = s
        .trim_start_matches(PREFIX)
        .trim_start_matches('n')
        .split('/');
    let sender = parts
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(u16::MAX);
    let seq = parts
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(u64::MAX);
    MsgId { sender, seq }
}
