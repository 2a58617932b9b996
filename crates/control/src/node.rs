//! The node listener: peers (and `sidecore devices` on other machines) connect
//! here over the node protocol (`sidecore-wire`). Each connection opens with a
//! hello, answered with this node's name, version and resources; a probe ends
//! there. A deploy request instead hands the connection to the deploy handler
//! (the runtime's peer side), which runs the part for as long as the
//! connection, its lease, stays open. A `sense` request instead makes the
//! connection an Orion monitor's: each `sense` is answered with a view of this
//! node's sensors from the sense handler, until the monitor closes.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sidecore_wire::mx_msg::MxOpen;
use sidecore_wire::orion_msg::{SenseRequest, SenseView};
use sidecore_wire::session::PeerGrammar;
use sidecore_wire::{Link, LinkError, Message, NodeInfo, Received, RemotePart};

/// How long a connection may take to say hello, and then to ask for anything.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// Back-off after a failed accept (out of descriptors, for example).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves a deploy request: the connection, the (validated) part, and a flag
/// set when the listener stops. It runs for as long as the part it deploys.
pub type DeployHandler = Arc<dyn Fn(&Link<PeerGrammar>, &RemotePart, &AtomicBool) + Send + Sync>;

/// Answers an Orion monitor's `sense` with a view of this node's sensors.
pub type SenseHandler = Arc<dyn Fn(&SenseRequest) -> SenseView + Send + Sync>;

/// How long a monitoring connection may stay silent before it is closed.
const MONITOR_IDLE: Duration = Duration::from_secs(10);

/// Serves a Metachory session (`mx-open`): runs the client's program here
/// for as long as the connection, or until the flag is set.
pub type MxHandler = Arc<dyn Fn(&Link<PeerGrammar>, &MxOpen, &AtomicBool) + Send + Sync>;

/// What the listener does with requests beyond the hello.
#[derive(Clone, Default)]
pub struct Handlers {
    /// Deploy requests (parts of apps); `None`: refused.
    pub deploy: Option<DeployHandler>,
    /// Monitors' `sense` requests; `None`: refused.
    pub sense: Option<SenseHandler>,
    /// Metachory sessions (`sidecore exec --on`); `None`: refused.
    pub mx: Option<MxHandler>,
}

/// Why the node listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen for peers on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("node listener on {addr}: {source}")]
    Setup {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

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
    ) -> Result<NodeListener, ListenError> {
        Self::start_with(
            addr,
            name,
            Handlers {
                deploy,
                sense: None,
                mx: None,
            },
        )
    }

    /// Listens on `addr` as node `name`, serving what `handlers` can.
    pub fn start_with(
        addr: &str,
        name: &str,
        handlers: Handlers,
    ) -> Result<NodeListener, ListenError> {
        let setup = |source| ListenError::Setup {
            addr: addr.to_string(),
            source,
        };
        let l = TcpListener::bind(addr).map_err(|source| ListenError::Bind {
            addr: addr.to_string(),
            source,
        })?;
        let local = l.local_addr().map_err(setup)?;
        l.set_nonblocking(true).map_err(setup)?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let info = NodeInfo {
            name: name.to_string(),
            software: sidecore_wire::SOFTWARE_VERSION.to_string(),
            cpus: u32::try_from(sidecore_pe::cores::allowed_cpus().len()).unwrap_or(u32::MAX),
            memory_bytes: sidecore_pe::cores::mem_available(),
        };
        let thread = std::thread::Builder::new()
            .name("sc-node".into())
            .spawn(move || accept_loop(&l, &info, &handlers, &st))
            .map_err(setup)?;
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

fn accept_loop(l: &TcpListener, info: &NodeInfo, handlers: &Handlers, stop: &Arc<AtomicBool>) {
    let conns: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());
    while !stop.load(Ordering::Acquire) {
        match l.accept() {
            Ok((s, _)) => {
                let (info, handlers, st) = (info.clone(), handlers.clone(), Arc::clone(stop));
                // One thread per connection: a deployed part keeps its
                // connection for as long as it runs.
                let spawned = std::thread::Builder::new()
                    .name("sc-node-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve(s, info, &handlers, &st) {
                            tracing::debug!("node connection: {e}");
                        }
                    });
                if let Ok(h) = spawned {
                    let mut c = conns
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    c.retain(|h| !h.is_finished());
                    c.push(h);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(_) => std::thread::sleep(ACCEPT_BACKOFF),
        }
    }
    for h in conns
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        let _ = h.join();
    }
}

/// One connection: the hello (answered by the session), then a probe's close
/// or a deploy request. A request the protocol refuses (a malformed or invalid
/// part, a message out of turn) is answered with the reason.
fn serve(
    s: TcpStream,
    info: NodeInfo,
    handlers: &Handlers,
    stop: &AtomicBool,
) -> Result<(), LinkError> {
    s.set_nonblocking(false).map_err(|source| LinkError::Io {
        peer: "origin".into(),
        source,
    })?;
    let link = Link::accept(s, info)?;
    let answer = |error: String| link.send(&Message::Error { error });
    match link.expect(REQUEST_TIMEOUT) {
        Ok(_) => {} // the hello: the grammar admits nothing else first
        Err(LinkError::Wire(e)) => return answer(e.kind.to_string()),
        Err(e) => return Err(e),
    }
    match link.recv(Some(REQUEST_TIMEOUT)) {
        Ok(Received::Message(Message::Deploy(part))) => match &handlers.deploy {
            Some(d) => d(&link, &part, stop),
            None => answer("this node does not accept deployments".into())?,
        },
        Ok(Received::Message(Message::MxOpen(open))) => match &handlers.mx {
            Some(h) => h(&link, &open, stop),
            None => answer("this node does not run Metachory guests".into())?,
        },
        Ok(Received::Message(Message::Sense(req))) => match &handlers.sense {
            Some(h) => monitored(&link, h, req, stop)?,
            None => answer("this node serves no sensor views".into())?,
        },
        // A probe's close, silence, or the origin's own error.
        Ok(_) => {}
        Err(LinkError::Wire(e)) => answer(e.kind.to_string())?,
        Err(e) => return Err(e),
    }
    Ok(())
}

/// An Orion monitor's connection: answers each `sense` with a view until the
/// monitor closes, falls silent for [`MONITOR_IDLE`], or the listener stops.
fn monitored(
    link: &Link<PeerGrammar>,
    h: &SenseHandler,
    first: SenseRequest,
    stop: &AtomicBool,
) -> Result<(), LinkError> {
    link.send(&Message::SenseView(h(&first)))?;
    let mut last = std::time::Instant::now();
    while !stop.load(Ordering::Acquire) && last.elapsed() < MONITOR_IDLE {
        match link.recv(Some(ACCEPT_POLL * 5))? {
            Received::Message(Message::Sense(req)) => {
                link.send(&Message::SenseView(h(&req)))?;
                last = std::time::Instant::now();
            }
            Received::Message(_) | Received::Closed => break,
            Received::TimedOut => {}
        }
    }
    Ok(())
}
