//! The node listener: peers (and `sidecore devices` on other machines)
//! connect here and exchange hellos (`sidecore_pe::node`). It answers with this
//! node's name, version and resources.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sidecore_pe::node::{Hello, NODE_PROTOCOL, NodeInfo};

/// A running node listener.
pub struct NodeListener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NodeListener {
    /// Listens on `addr` and answers hellos as node `name`.
    pub fn start(addr: &str, name: &str) -> Result<NodeListener, String> {
        let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = l.local_addr().map_err(|e| e.to_string())?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let info = NodeInfo {
            name: name.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            protocol: NODE_PROTOCOL,
            cpus: sidecore_pe::cores::allowed_cpus().len() as u32,
            memory: sidecore_pe::cores::mem_available(),
        };
        let thread = std::thread::Builder::new()
            .name("sc-node".into())
            .spawn(move || {
                while !st.load(Ordering::Acquire) {
                    match l.accept() {
                        Ok((s, _)) => {
                            let _ = answer(s, &info);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(100)),
                    }
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

fn answer(s: TcpStream, info: &NodeInfo) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut w = s.try_clone()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
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
