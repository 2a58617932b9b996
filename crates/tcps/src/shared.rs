//! What a server's PPEs, its applications and its control share: the
//! configuration, the AllowedPPE and ActivePPE core sets (§2.5.1), one
//! mailbox, wake-up eventfd and counter block per allowed core (the seed
//! creates a PPT for every CPU at boot, asleep until activated), the
//! registered applications and the blob table.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::conn::{AppSender, Doorbell};
use crate::pconn::{Blobs, PConn};
use crate::poller::{Backend, Waker};
use crate::stats::PpeStats;

/// Why a set of CPUs was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadCoreSet {
    #[error("CPU {0} is beyond CPU {max}", max = CoreSet::MAX_CPU)]
    Beyond(usize),
    #[error("`{part}` in CPU list `{list}` is not a CPU number or range a-b")]
    Syntax { part: String, list: String },
}

/// A set of CPUs, as a bitmap (the seed's AllowedPPE and ActivePPE).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreSet(pub u64);

impl CoreSet {
    /// Largest CPU number a set can hold.
    pub const MAX_CPU: usize = 63;

    /// The set of the given CPUs; an error names the first one out of range.
    pub fn of(cpus: &[usize]) -> Result<CoreSet, BadCoreSet> {
        let mut s = 0u64;
        for &c in cpus {
            if c > Self::MAX_CPU {
                return Err(BadCoreSet::Beyond(c));
            }
            s |= 1 << c;
        }
        Ok(CoreSet(s))
    }

    /// Parses `0,2-3`.
    pub fn parse(text: &str) -> Result<CoreSet, BadCoreSet> {
        let mut cpus = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || BadCoreSet::Syntax {
                part: part.to_string(),
                list: text.to_string(),
            };
            if let Some((a, b)) = part.split_once('-') {
                let (a, b): (usize, usize) = (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                );
                if a > b {
                    return Err(bad());
                }
                cpus.extend(a..=b.min(Self::MAX_CPU + 1));
            } else {
                cpus.push(part.parse().map_err(|_| bad())?);
            }
        }
        CoreSet::of(&cpus)
    }

    pub fn contains(&self, cpu: usize) -> bool {
        cpu <= Self::MAX_CPU && self.0 & (1 << cpu) != 0
    }

    pub fn cpus(&self) -> Vec<usize> {
        (0..=Self::MAX_CPU).filter(|&c| self.contains(c)).collect()
    }

    pub fn len(&self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Display for CoreSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v: Vec<String> = self.cpus().iter().map(ToString::to_string).collect();
        f.write_str(&v.join(","))
    }
}

/// How a server runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// AllowedPPE: CPUs that may become PPEs.
    pub allowed: CoreSet,
    /// The master PPE's CPU (static, as in the seed): it accepts, and serves
    /// every queue.
    pub master: usize,
    /// Further PPEs to start with.
    pub extra: Vec<usize>,
    /// Pin PPE threads to their CPUs (off only where affinity is refused).
    pub pin: bool,
    pub backend: Backend,
    /// Never park: poll even when idle (a truly dedicated core).
    pub spin: bool,
    /// Empty polls before an idle PPE parks (adaptive polling).
    pub spin_polls: u32,
    /// Receive queue: slots (a power of two) and bytes per slot (header included).
    pub rq_slots: usize,
    pub rq_slot_size: usize,
    /// Send queue: slots and bytes per slot.
    pub tx_slots: usize,
    pub tx_slot_size: usize,
    /// Close a connection idle this long (no byte either way).
    pub idle_timeout: Duration,
    /// Close a connection whose peer sent nothing this long after accept.
    pub first_byte_timeout: Duration,
    /// After our FIN, wait this long for the peer's before closing.
    pub linger: Duration,
    /// Receive-queue slots filled per service of a connection.
    pub recv_batch: usize,
    /// Bytes sent per service of a connection.
    pub send_quantum: usize,
    /// Connections accepted per SYN-class service.
    pub accept_batch: usize,
    /// Scheduler decisions per poll round.
    pub round_budget: usize,
    /// TCP_NODELAY on accepted connections.
    pub nodelay: bool,
    /// listen(2) backlog.
    pub backlog: i32,
    /// Ring buffers of closed connections kept for new ones, per kind
    /// (receive, send): see [`crate::pool`].
    pub ring_pool: usize,
}

impl Config {
    /// Defaults for `listen`: the master on the last allowed CPU.
    pub fn new(listen: SocketAddr, allowed: CoreSet) -> Config {
        let master = allowed.cpus().last().copied().unwrap_or(0);
        Config {
            listen,
            allowed,
            master,
            extra: Vec::new(),
            pin: true,
            backend: Backend::IoUring { sqpoll: false },
            spin: false,
            spin_polls: 2000,
            rq_slots: 32,
            rq_slot_size: 4096 + 16,
            tx_slots: 64,
            tx_slot_size: 4096 + 16,
            idle_timeout: Duration::from_secs(60),
            first_byte_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(2),
            recv_batch: 4,
            send_quantum: 64 * 1024,
            accept_batch: 32,
            round_budget: 256,
            nodelay: true,
            backlog: 4096,
            ring_pool: 256,
        }
    }
}

/// Messages to a PPE.
pub enum PpeMsg {
    /// Take over this connection.
    Adopt(Box<PConn>),
    /// The application queued something on connection `id`.
    Doorbell(u64),
    /// Hand `count` connections to the PPE on `to` (a PPE was added).
    Shed { to: usize, count: usize },
    /// Hand every connection to the master and stop (a PPE was removed).
    Stop,
}

/// One allowed CPU's slot.
pub struct PpeSlot {
    pub cpu: usize,
    /// A resident driver runs this CPU's PPE (an offcode's executor on that
    /// core): adding the PPE activates it there instead of spawning a thread.
    pub hosted: AtomicBool,
    pub tx: Sender<PpeMsg>,
    pub rx: Receiver<PpeMsg>,
    pub waker: Waker,
    /// The PPE is parked in its poller: wake it after sending.
    pub parked: AtomicBool,
    pub running: AtomicBool,
    pub stats: PpeStats,
}

/// State shared by a server's threads.
pub struct Shared {
    pub config: Config,
    pub listen: SocketAddr,
    pub slots: Vec<PpeSlot>,
    /// AllowedPPE, as a bitmap: `config.allowed` at start, plus the CPUs of
    /// resident PPEs that joined since (offcodes placed by a layout).
    pub allowed: AtomicU64,
    /// ActivePPE, as a bitmap.
    pub active: AtomicU64,
    pub apps: Mutex<Vec<AppSender>>,
    pub next_app: AtomicUsize,
    pub next_id: AtomicU64,
    pub blobs: Blobs,
    pub backend_used: Mutex<String>,
    pub stopping: AtomicBool,
    /// Application-level counters (name → value), for `stats`.
    pub app_counters: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Connections' rings, pooled.
    pub pool: crate::pool::RingPool,
}

impl Shared {
    /// The slot of `cpu`.
    pub fn slot(&self, cpu: usize) -> Option<&PpeSlot> {
        self.slots.iter().find(|s| s.cpu == cpu)
    }

    /// Whether the PPE on `cpu` runs (or, resident, should be turning).
    pub fn running(&self, cpu: usize) -> bool {
        self.slot(cpu)
            .is_some_and(|s| s.running.load(Ordering::Acquire))
    }

    /// AllowedPPE now.
    pub fn allowed(&self) -> CoreSet {
        CoreSet(self.allowed.load(Ordering::Acquire))
    }

    /// ActivePPE now.
    pub fn active(&self) -> CoreSet {
        CoreSet(self.active.load(Ordering::Acquire))
    }

    /// Sends to the PPE on `cpu` and wakes it if it is parked.
    pub fn send(&self, cpu: usize, msg: PpeMsg) -> Result<(), PpeMsg> {
        let Some(slot) = self.slot(cpu) else {
            return Err(msg);
        };
        // A connection is never left in the mailbox of a PPE that stopped.
        if matches!(msg, PpeMsg::Adopt(_))
            && cpu != self.config.master
            && !slot.running.load(Ordering::SeqCst)
        {
            return self.send(self.config.master, msg);
        }
        slot.tx.send(msg).map_err(|e| e.0)?;
        // Pairs with the PPE's (set `parked`, fence, look at the mailbox).
        std::sync::atomic::fence(Ordering::SeqCst);
        if slot.parked.load(Ordering::SeqCst) {
            slot.waker.wake();
        }
        Ok(())
    }

    /// Passes connections waiting in the mailbox of the (stopped) PPE on
    /// `cpu` to the master; drops everything else there (doorbells are
    /// re-derived on adoption, shed orders are moot).
    pub fn forward_adoptions(&self, cpu: usize) {
        let Some(slot) = self.slot(cpu) else {
            return;
        };
        while let Ok(msg) = slot.rx.try_recv() {
            if let PpeMsg::Adopt(c) = msg
                && let Err(PpeMsg::Adopt(c)) = self.send(self.config.master, PpeMsg::Adopt(c))
            {
                c.close(crate::conn::CloseReason::Reset, true);
            }
        }
    }

    /// The active PPE with the fewest connections (new connections go there).
    pub fn least_loaded(&self) -> usize {
        let active = self.active();
        self.slots
            .iter()
            .filter(|s| active.contains(s.cpu))
            .min_by_key(|s| {
                (
                    s.stats.conns.load(Ordering::Relaxed),
                    s.cpu != self.config.master,
                )
            })
            .map_or(self.config.master, |s| s.cpu)
    }

    /// The next application endpoint, round robin; `None` when no application
    /// listens (then nothing is accepted: SYNs wait in the kernel's backlog).
    pub fn pick_app(&self) -> Option<AppSender> {
        let apps = self
            .apps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if apps.is_empty() {
            return None;
        }
        let i = self.next_app.fetch_add(1, Ordering::Relaxed) % apps.len();
        Some(apps[i].clone())
    }

    /// Adds to an application counter.
    pub fn count_app(&self, name: &str, n: u64) {
        let mut c = self
            .app_counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *c.entry(name.to_string()).or_insert(0) += n;
    }
}

/// The doorbell applications ring: a message to the owning PPE, deduplicated
/// by the connection's `doorbell` flag.
pub struct Bell(pub Arc<Shared>);

impl Doorbell for Bell {
    fn ring(&self, owner: usize, id: u64) {
        // A PPE that went away handed its connections on; the new owner
        // checks every adopted connection's send queue anyway.
        let _ = self.0.send(owner, PpeMsg::Doorbell(id));
    }
}
