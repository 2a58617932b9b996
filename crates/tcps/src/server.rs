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
    #[error("connection rings: {0}")]
    Rings(sidecore_channel::ring::RingConfigError),
    #[error("CPU {cpu} has no PPE slot in this server (not a CPU this process may use)")]
    NoSlot { cpu: usize },
    #[error("the PPE on CPU {cpu} did not hand its connections over within {secs} s")]
    Timeout { cpu: usize, secs: u64 },
}

/// A running server.
pub struct TcpServers {
    shared: Arc<Shared>,
    threads: Mutex<HashMap<usize, JoinHandle<()>>>,
    reconfig: Mutex<()>,
}

impl TcpServers {
    /// Binds `config.listen` and starts the master PPE and `config.extra`,
    /// each on a thread of its own pinned to its CPU.
    pub fn start(config: Config) -> Result<TcpServers, Error> {
        let extra = config.extra.clone();
        let master = config.master;
        let slot_cpus = config.allowed.cpus();
        let (server, listener) = TcpServers::build(config, &slot_cpus)?;
        server.spawn(master, Some(listener))?;
        for cpu in extra {
            if cpu != master {
                server.add_ppe(cpu)?;
            }
        }
        Ok(server)
    }

    /// Binds `config.listen` and returns the server with its master PPE
    /// unstarted, for a resident driver (an offcode's executor on the
    /// master's core) to run with [`Ppe::turn`]. Slots exist for every CPU
    /// this process may use, so resident helper PPEs can [`join`] later
    /// wherever a layout placed them.
    ///
    /// [`join`]: TcpServers::join
    pub fn hosted(config: Config) -> Result<(TcpServers, Ppe), Error> {
        let master = config.master;
        // Every CPU the machine has, not this thread's affinity: a resident
        // driver runs pinned to its own core.
        let mut slot_cpus: Vec<usize> = (0..configured_cpus().min(CoreSet::MAX_CPU + 1))
            .filter(|&c| c <= CoreSet::MAX_CPU)
            .collect();
        slot_cpus.extend(config.allowed.cpus());
        slot_cpus.push(master);
        slot_cpus.sort_unstable();
        slot_cpus.dedup();
        let (server, listener) = TcpServers::build(config, &slot_cpus)?;
        let ppe =
            Ppe::new(Arc::clone(&server.shared), master, Some(listener)).map_err(|source| {
                Error::Start {
                    cpu: master,
                    source,
                }
            })?;
        server.mark_running(master, true);
        Ok((server, ppe))
    }

    /// A resident PPE on `cpu` joins AllowedPPE. It stays dormant (not in
    /// ActivePPE) until [`TcpServers::add_ppe`] activates it; its driver
    /// runs [`Ppe::turn`] while [`TcpServers::is_running`] says so.
    pub fn join(&self, cpu: usize) -> Result<Ppe, Error> {
        let Some(slot) = self.shared.slot(cpu) else {
            return Err(Error::NoSlot { cpu });
        };
        if slot.hosted.swap(true, Ordering::AcqRel) || self.shared.running(cpu) {
            return Err(Error::AlreadyActive { cpu });
        }
        let ppe = Ppe::new(Arc::clone(&self.shared), cpu, None).map_err(|source| {
            slot.hosted.store(false, Ordering::Release);
            Error::Start { cpu, source }
        })?;
        self.shared.allowed.fetch_or(1 << cpu, Ordering::AcqRel);
        Ok(ppe)
    }

    /// A resident PPE's driver is going away: its connections go to the
    /// master (or are closed, when the server is shutting down) and its CPU
    /// leaves ActivePPE and AllowedPPE. Called on the driver's own thread.
    pub fn leave(&self, ppe: &mut Ppe) {
        let cpu = ppe.cpu();
        let _one_at_a_time = self.lock_reconfig();
        if self.is_stopping() {
            ppe.turn();
        } else if self.shared.running(cpu) && cpu != self.shared.config.master {
            self.shared.active.fetch_and(!(1 << cpu), Ordering::AcqRel);
            ppe.retire();
        }
        self.shared.allowed.fetch_and(!(1 << cpu), Ordering::AcqRel);
        if let Some(slot) = self.shared.slot(cpu) {
            slot.hosted.store(false, Ordering::Release);
        }
    }

    /// The server is shutting down (or has).
    pub fn is_stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Acquire)
    }

    /// Whether the PPE on `cpu` should be turning now (a resident driver
    /// polls this between turns; it becomes true on `add_ppe`).
    pub fn is_running(&self, cpu: usize) -> bool {
        self.shared.running(cpu)
    }

    /// The wake-up descriptor of `cpu`'s PPE: a dormant resident driver
    /// waits on it ([`crate::poller::wait_readable`]).
    pub fn waker_fd(&self, cpu: usize) -> Option<std::os::fd::RawFd> {
        self.shared.slot(cpu).map(|s| s.waker.raw())
    }

    fn mark_running(&self, cpu: usize, on: bool) {
        if let Some(slot) = self.shared.slot(cpu) {
            slot.running.store(on, Ordering::Release);
        }
        if on {
            self.shared.active.fetch_or(1 << cpu, Ordering::AcqRel);
        }
    }

    /// The shared state and the bound listener, with a slot for each of `slot_cpus`.
    fn build(config: Config, slot_cpus: &[usize]) -> Result<(TcpServers, TcpListener), Error> {
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
        for &cpu in slot_cpus {
            let (tx, rx) = crossbeam_channel::unbounded();
            let waker = Waker::new().map_err(|source| Error::Start { cpu, source })?;
            slots.push(PpeSlot {
                cpu,
                hosted: AtomicBool::new(false),
                tx,
                rx,
                waker,
                parked: AtomicBool::new(false),
                running: AtomicBool::new(false),
                stats: PpeStats::default(),
            });
        }
        let allowed = AtomicU64::new(config.allowed.0);
        let pool = crate::pool::RingPool::new(
            (config.rq_slots, config.rq_slot_size),
            (config.tx_slots, config.tx_slot_size),
            config.ring_pool,
        )
        .map_err(Error::Rings)?;
        let shared = Arc::new(Shared {
            config,
            listen,
            slots,
            allowed,
            active: AtomicU64::new(0),
            apps: Mutex::new(Vec::new()),
            next_app: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            blobs: std::sync::RwLock::new(Vec::new()),
            backend_used: Mutex::new(String::new()),
            stopping: AtomicBool::new(false),
            app_counters: Mutex::new(Default::default()),
            pool,
        });
        let server = TcpServers {
            shared,
            threads: Mutex::new(HashMap::new()),
            reconfig: Mutex::new(()),
        };
        Ok((server, listener))
    }

    fn spawn(&self, cpu: usize, listener: Option<TcpListener>) -> Result<(), Error> {
        let slot = self.shared.slot(cpu).ok_or(Error::NotAllowed {
            cpu,
            allowed: self.shared.allowed(),
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
        self.shared.allowed()
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
        let _one_at_a_time = self.lock_reconfig();
        let allowed = self.shared.allowed();
        if !allowed.contains(cpu) {
            return Err(Error::NotAllowed { cpu, allowed });
        }
        let active = self.active();
        if active.contains(cpu) {
            return Err(Error::AlreadyActive { cpu });
        }
        if self
            .shared
            .slot(cpu)
            .is_some_and(|s| s.hosted.load(Ordering::Acquire))
        {
            // A resident driver: connections left in its mailbox since it
            // last stopped go to the master, then it turns again.
            self.shared.forward_adoptions(cpu);
            self.mark_running(cpu, true);
            if let Some(slot) = self.shared.slot(cpu) {
                slot.waker.wake();
            }
        } else {
            self.reap(cpu);
            self.spawn(cpu, None)?;
        }
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
        let _one_at_a_time = self.lock_reconfig();
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

    /// Serialises PPE additions and removals (the control socket and an
    /// autoscaler may ask at once).
    fn lock_reconfig(&self) -> std::sync::MutexGuard<'_, ()> {
        self.reconfig
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
            allowed_ppe: self.shared.allowed().cpus(),
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
            rings_reused: self.shared.pool.counts().0,
            rings_fresh: self.shared.pool.counts().1,
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

/// CPUs the machine has (configured, online or not).
fn configured_cpus() -> usize {
    // SAFETY: sysconf has no pointer arguments.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1).max(1)
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
