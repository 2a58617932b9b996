//! FileWall as a proxy on its own thread: an [`Engine`] (the event loop of
//! `crate::engine`: listeners over TCP and UDP, the built-in portmapper, the policy
//! chain, connections to the servers) turned until the [`Proxy`] is dropped:
//! waiting in `epoll_wait` between events, or, with `ProxyConfig::core`,
//! pinned to that CPU and polling without sleep (a dedicated core). The
//! configuration and counter types are the engine's, re-exported here.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;

pub use crate::backend::Backend;
pub use crate::engine::{
    Bound, Engine, Listen, OpCounters, ProxyConfig, ProxyStats, StatsHandle, Transport,
};
pub use crate::message::procedure_name;
use crate::portmap::Mapping;

/// A running proxy; dropping it stops it and closes every connection.
pub struct Proxy {
    addrs: Vec<SocketAddr>,
    mappings: Vec<Mapping>,
    stats: StatsHandle,
    waker: Arc<mio::Waker>,
    shared: Arc<crate::engine::Shared>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Proxy {
    /// Binds the listeners, builds the chain and starts the engine's thread.
    /// Servers are connected on the first call for them.
    pub fn start(config: ProxyConfig) -> io::Result<Proxy> {
        let core = config.core;
        if let Some(cpu) = core {
            sidecore_pe::cores::usable_cpu(cpu).map_err(|usable| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("CPU {cpu} is not one this process may run on (it may use {usable:?})"),
                )
            })?;
        }
        let mut engine = Engine::new(config)?;
        let addrs = engine.local_addrs();
        let first = addrs.first().map_or(0, SocketAddr::port);
        let mappings = engine.port_mappings().to_vec();
        let (stats, waker, shared) = (engine.stats_handle(), engine.waker(), engine.shared());
        let thread = thread::Builder::new()
            .name(format!("filewall-{first}"))
            .spawn(move || match core {
                // Checked above; a pin refused now still runs, unpinned.
                Some(cpu) => {
                    let _ = sidecore_pe::cores::pin_current_thread(cpu);
                    engine.run_busy();
                }
                None => engine.run(),
            })?;
        Ok(Proxy {
            addrs,
            mappings,
            stats,
            waker,
            shared,
            thread: Some(thread),
        })
    }

    /// Where clients connect: the first listener.
    pub fn local_addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Every listener's address, in configuration order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// What the built-in portmapper answers.
    pub fn port_mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// A copy of the counters.
    pub fn stats(&self) -> ProxyStats {
        self.stats.stats()
    }

    /// A handle on the counters that outlives borrowing the proxy.
    pub fn stats_handle(&self) -> StatsHandle {
        self.stats.clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}
