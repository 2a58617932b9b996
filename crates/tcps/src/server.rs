//! A TCPServers instance: binds the listening socket, starts the master PPE
//! (and any extra PPEs) on their CPUs, registers applications, and adds or
//! removes PPEs while connections run (§2.5.1's AllowedPPE/ActivePPE, with
//! connections handed between PPEs instead of dropped).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::conn::{App, BlobId};
use crate::poller::Waker;
use crate::ppe::Ppe;
use crate::shared::{Config, CoreSet, PpeMsg, PpeSlot, Shared};
use crate::stats::{PpeStats, Snapshot};

/// What can go wrong starting or reconfiguring a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("AllowedPPE is empty: name at least one CPU for the master PPE")]
    NoCpus,
    #[error("CPU {cpu} is not in AllowedPPE ({allowed})")]
    NotAllowed { cpu: usize, allowed: CoreSet },
    #[error("CPU {cpu} is already an active PPE")]
    AlreadyActive { cpu: usize },
    #[error("CPU {cpu} is not an active PPE (active: {active})")]
    NotActive { cpu: usize, active: CoreSet },
    #[error("CPU {cpu} is the master PPE: it owns the listening socket and cannot be removed")]
    Master { cpu: usize },
    #[error(
        "AllowedPPE ({allowed}) names every CPU this process may use ({usable}): keep one for applications"
    )]
    AllCpus { allowed: CoreSet, usable: CoreSet },
    #[error("starting the PPE on CPU {cpu}: {source}")]
    Start { cpu: usize, source: std::io::Error },
    #[error("the PPE on CPU {cpu} did not hand its connections over within {secs} s")]
    Timeout { cpu: usize, secs: u64 },
}

/// A running server.
pub struct TcpServers {
    shared: Arc<Shared>,
    threads: Mutex<HashMap<usize, JoinHandle<()>>>,
}

impl TcpServers {
    /// Binds `config.listen` and starts the master PPE and `config.extra`.
    pub fn start(config: Config) -> Result<TcpServers, Error> {
        if config.allowed.is_empty() {
            return Err(Error::NoCpus);
        }
        if !config.allowed.contains(config.master) {
            return Err(Error::NotAllowed {
                cpu: config.master,
                allowed: config.allowed,
            });
        }
        let listener = bind(config.listen, config.backlog).map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
        let listen = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
        let mut slots = Vec::new();
        for cpu in config.allowed.cpus() {
            let (tx, rx) = crossbeam_channel::unbounded();
            let waker = Waker::new().map_err(|source| Error::Start { cpu, source })?;
            slots.push(PpeSlot {
                cpu,
                tx,
                rx,
                waker,
                parked: AtomicBool::new(false),
                running: AtomicBool::new(false),
                stats: PpeStats::default(),
            });
        }
        let extra = config.extra.clone();
        let master = config.master;
        let shared = Arc::new(Shared {
            config,
            listen,
            slots,
            active: AtomicU64::new(0),
            apps: Mutex::new(Vec::new()),
            next_app: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            blobs: std::sync::RwLock::new(Vec::new()),
            backend_used: Mutex::new(String::new()),
            stopping: AtomicBool::new(false),
            app_counters: Mutex::new(Default::default()),
        });
        let server = TcpServers {
            shared,
            threads: Mutex::new(HashMap::new()),
        };
        server.spawn(master, Some(listener))?;
        for cpu in extra {
            if cpu != master {
                server.add_ppe(cpu)?;
            }
        }
        Ok(server)
    }

    fn spawn(&self, cpu: usize, listener: Option<TcpListener>) -> Result<(), Error> {
        let slot = self.shared.slot(cpu).ok_or(Error::NotAllowed {
            cpu,
            allowed: self.shared.config.allowed,
        })?;
        // Connections left in the mailbox since this PPE last stopped go to
        // the master (which is never stopped).
        if cpu != self.shared.config.master {
            self.shared.forward_adoptions(cpu);
        }
        let ppe = Ppe::new(Arc::clone(&self.shared), cpu, listener)
            .map_err(|source| Error::Start { cpu, source })?;
        slot.running.store(true, Ordering::Release);
        self.shared.active.fetch_or(1 << cpu, Ordering::AcqRel);
        let h = std::thread::Builder::new()
            .name(format!("tcps-ppe{cpu}"))
            .spawn(move || ppe.run())
            .map_err(|source| Error::Start { cpu, source })?;
        self.threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(cpu, h);
        Ok(())
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.listen
    }

    /// Registers an application endpoint: new connections are spread over
    /// the registered endpoints round robin.
    pub fn app(&self) -> App {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.shared
            .apps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(tx);
        App { rx }
    }

    /// Registers an in-memory blob (a file's bytes) that connections can send
    /// with [`crate::conn::Conn::send_blob`] without copying.
    pub fn register_blob(&self, bytes: Arc<[u8]>) -> BlobId {
        let mut b = self
            .shared
            .blobs
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        b.push(bytes);
        BlobId((b.len() - 1) as u32)
    }

    /// AllowedPPE.
    pub fn allowed(&self) -> CoreSet {
        self.shared.config.allowed
    }

    /// ActivePPE.
    pub fn active(&self) -> CoreSet {
        self.shared.active()
    }

    /// The master PPE's CPU.
    pub fn master(&self) -> usize {
        self.shared.config.master
    }

    /// CPUs of this process not in ActivePPE: where applications should run.
    pub fn app_cpus(&self) -> Vec<usize> {
        let active = self.active();
        usable_cpus()
            .into_iter()
            .filter(|c| !active.contains(*c))
            .collect()
    }

    /// Makes `cpu` a PPE: starts its loop, then has every running PPE hand it
    /// an equal share of its connections.
    pub fn add_ppe(&self, cpu: usize) -> Result<(), Error> {
        let allowed = self.shared.config.allowed;
        if !allowed.contains(cpu) {
            return Err(Error::NotAllowed { cpu, allowed });
        }
        let active = self.active();
        if active.contains(cpu) {
            return Err(Error::AlreadyActive { cpu });
        }
        self.reap(cpu);
        self.spawn(cpu, None)?;
        let n = active.len();
        for other in active.cpus() {
            let have = self
                .shared
                .slot(other)
                .map_or(0, |s| s.stats.conns.load(Ordering::Relaxed));
            let count = (have as usize) / (n + 1);
            if count > 0 {
                let _ = self.shared.send(other, PpeMsg::Shed { to: cpu, count });
            }
        }
        Ok(())
    }

    /// Stops the PPE on `cpu`, after it hands every connection to the master.
    pub fn remove_ppe(&self, cpu: usize) -> Result<(), Error> {
        let active = self.active();
        if !active.contains(cpu) {
            return Err(Error::NotActive { cpu, active });
        }
        if cpu == self.shared.config.master {
            return Err(Error::Master { cpu });
        }
        // Out of ActivePPE first, so no new connection goes there.
        self.shared.active.fetch_and(!(1 << cpu), Ordering::AcqRel);
        let _ = self.shared.send(cpu, PpeMsg::Stop);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .shared
            .slot(cpu)
            .is_some_and(|s| s.running.load(Ordering::Acquire))
        {
            if Instant::now() > deadline {
                return Err(Error::Timeout { cpu, secs: 10 });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.reap(cpu);
        self.shared.forward_adoptions(cpu);
        Ok(())
    }

    fn reap(&self, cpu: usize) {
        let h = self
            .threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&cpu);
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Adds to an application counter (shown by `stats`).
    pub fn count(&self, name: &str, n: u64) {
        self.shared.count_app(name, n);
    }

    /// A handle applications can count through from their own threads.
    pub fn counters(&self) -> Counters {
        Counters(Arc::clone(&self.shared))
    }

    /// Every counter now.
    pub fn stats(&self) -> Snapshot {
        let active = self.active();
        let master = self.shared.config.master;
        Snapshot {
            listen: self.shared.listen.to_string(),
            backend: self
                .shared
                .backend_used
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            allowed_ppe: self.shared.config.allowed.cpus(),
            active_ppe: active.cpus(),
            master,
            ppes: self
                .shared
                .slots
                .iter()
                .map(|s| {
                    s.stats
                        .snapshot(s.cpu, s.cpu == master, active.contains(s.cpu))
                })
                .collect(),
            app: self
                .shared
                .app_counters
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    /// Stops every PPE; open connections are closed (reason `Shutdown`).
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        for s in &self.shared.slots {
            s.waker.wake();
        }
        let hs: Vec<JoinHandle<()>> = self
            .threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain()
            .map(|(_, h)| h)
            .collect();
        for h in hs {
            let _ = h.join();
        }
        self.shared.active.store(0, Ordering::Release);
    }
}

impl Drop for TcpServers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Application counters, shareable with application threads.
#[derive(Clone)]
pub struct Counters(Arc<Shared>);

impl Counters {
    /// Adds `n` to counter `name`.
    pub fn add(&self, name: &str, n: u64) {
        self.0.count_app(name, n);
    }
}

/// The CPUs this process may run on.
pub fn usable_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// A non-blocking listening socket with SO_REUSEADDR and the given backlog.
fn bind(addr: SocketAddr, backlog: i32) -> std::io::Result<TcpListener> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt,
        socket, sockopt,
    };
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(addr),
    )?;
    let backlog = Backlog::new(backlog).unwrap_or(Backlog::MAXCONN);
    listen(&fd, backlog)?;
    Ok(TcpListener::from(fd))
}
