//! The node listener: peers (and `sidecore devices` on other machines)
//! connect here and exchange hellos (`sidecore_pe::node`). It answers with this
//! node's name, version and resources. A `deploy` request instead hands the
//! connection to the runtime, which deploys a part of an origin's app here.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sidecore_pe::node::{Hello, NODE_PROTOCOL, NodeInfo};

/// Serves a `deploy` request: the connection (buffered, with whatever followed
/// its first line still in the buffer), that first line, and a flag set when the
/// listener stops. It runs for as long as the part it deploys (the connection is
/// the part's lease; see `sidecore_runtime::remote`).
pub type DeployHandler = Arc<dyn Fn(BufReader<TcpStream>, &str, &AtomicBool) + Send + Sync>;

/// A running node listener.
pub struct NodeListener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl NodeListener {
    /// Listens on `addr` and answers hellos as node `name`; with `deploy`, also
    /// accepts parts of apps from origins.
    pub fn start(
        addr: &str,
        name: &str,
        deploy: Option<DeployHandler>,
    ) -> Result<NodeListener, String> {
        let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = l.local_addr().map_err(|e| e.to_string())?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let info = Arc::new(NodeInfo {
            name: name.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            protocol: NODE_PROTOCOL,
            cpus: sidecore_pe::cores::allowed_cpus().len() as u32,
            memory: sidecore_pe::cores::mem_available(),
        });
        let thread = std::thread::Builder::new()
            .name("sc-node".into())
            .spawn(move || {
                let conns: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());
                while !st.load(Ordering::Acquire) {
                    match l.accept() {
                        Ok((s, _)) => {
                            let (info, deploy, st) =
                                (Arc::clone(&info), deploy.clone(), Arc::clone(&st));
                            // One thread per connection: a deployed part keeps
                            // its connection for as long as it runs.
                            if let Ok(h) = std::thread::Builder::new()
                                .name("sc-node-conn".into())
                                .spawn(move || {
                                    let _ = serve(s, &info, deploy.as_ref(), &st);
                                })
                            {
                                let mut c = conns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                                c.retain(|h| !h.is_finished());
                                c.push(h);
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
                for h in conns.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
                    let _ = h.join();
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(NodeListener {
            addr: local,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for NodeListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    s: TcpStream,
    info: &NodeInfo,
    deploy: Option<&DeployHandler>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut w = s.try_clone()?;
    let mut line = String::new();
    // A deploy request's connection carries more after its first line: the
    // reader, with anything it buffered past the line, goes to the handler.
    let mut r = BufReader::new(s.try_clone()?);
    r.by_ref().take(1 << 20).read_line(&mut line)?;
    let op = serde_json::from_str::<serde_json::Value>(line.trim())
        .ok()
        .and_then(|v| Some(v.get("op")?.as_str()?.to_string()));
    if op.as_deref() == Some("deploy") {
        match deploy {
            Some(d) => d(r, &line, stop),
            None => w.write_all(
                b"{\"reply\":\"error\",\"error\":\"this node does not accept deployments\"}\n",
            )?,
        }
        return Ok(());
    }
    let reply = match serde_json::from_str::<Hello>(line.trim()) {
        Ok(h) if h.op == "hello" => serde_json::to_string(info).unwrap_or_default(),
        Ok(h) => format!(r#"{{"error":"unknown op {:?}"}}"#, h.op),
        Err(e) => format!(
            r#"{{"error":"bad hello: {}"}}"#,
            e.to_string().replace('"', "'")
        ),
    };
    w.write_all(format!("{reply}\n").as_bytes())
}
