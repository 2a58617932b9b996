//! The packet processing engine: a loop pinned to one dedicated CPU that owns
//! its sockets and never yields to application work (§2.4.1, §2.5.1).
//!
//! Each round it polls the event source without blocking, folds readiness
//! into its connections, reads its mailbox (adopted connections, doorbells
//! from applications, shed/stop orders), resumes connections whose receive
//! queue has room again, runs the timers, and then serves up to
//! `round_budget` scheduler decisions: Control round robin, Ready by GR³, the
//! listening socket last (master only). An idle PPE keeps polling for
//! `spin_polls` empty rounds and then parks in its event source until an
//! event, a mailbox message or its next timer — the seed's adaptive polling —
//! unless `spin` keeps it polling for good.
//!
//! A helper PPE (not the master) serves only Ready: a connection of its that
//! needs teardown is handed to the master, which serves Control.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};

use crate::conn::{AppEvent, CloseReason, Conn, ConnShared};
use crate::gr3::{Limits, Pending, Pick, Role, Scheduler};
use crate::pconn::{PConn, mss};
use crate::poller::{Poller, Ready, TOKEN_LISTENER, TOKEN_WAKE};
use crate::shared::{Bell, PpeMsg, PpeSlot, Shared};
use crate::stats::PpeStats;

const TIMER_EVERY: Duration = Duration::from_millis(20);

/// What one [`Ppe::turn`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// It did work.
    Busy,
    /// It found nothing (and may have parked for a while).
    Idle,
    /// It stopped: removed from ActivePPE (its connections handed to the
    /// master), or the server is shutting down (its connections closed).
    Stopped,
}

/// One PPE's state; lives on its thread.
pub struct Ppe {
    shared: Arc<Shared>,
    cpu: usize,
    poller: Poller,
    sched: Scheduler<u64>,
    conns: FxHashMap<u64, PConn>,
    listener: Option<TcpListener>,
    events: Vec<(u64, Ready)>,
    paused: FxHashSet<u64>,
    touched: Vec<u64>,
    limits: Limits,
    syn_pending: bool,
    last_timer: Instant,
    idle_polls: u32,
}

/// Pins the calling thread to `cpu`.
pub fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within
    // it for cpu < CPU_SETSIZE (checked), and sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::other(format!("CPU {cpu} is out of range")));
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Ppe {
    /// A PPE for `cpu`; the master gets the listener.
    pub fn new(
        shared: Arc<Shared>,
        cpu: usize,
        listener: Option<TcpListener>,
    ) -> std::io::Result<Ppe> {
        let c = &shared.config;
        let (mut poller, note) = Poller::open(c.backend, Some(cpu))?;
        if let Some(note) = note {
            eprintln!("sidecore-tcps: PPE on CPU {cpu}: {note}");
        }
        *shared
            .backend_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = poller.backend().to_string();
        let slot = shared
            .slot(cpu)
            .ok_or_else(|| std::io::Error::other(format!("CPU {cpu} is not in AllowedPPE")))?;
        poller.add(slot.waker.fd(), TOKEN_WAKE)?;
        if let Some(l) = &listener {
            poller.add(l.as_fd(), TOKEN_LISTENER)?;
        }
        let role = if cpu == c.master {
            Role::Master
        } else {
            Role::Helper
        };
        let limits = Limits {
            max_snd_bytes: (c.tx_slots * c.tx_slot_size) as u64,
            max_rcv_bytes: (c.rq_slots * c.rq_slot_size) as u64,
            max_rq_size: c.rq_slots as u64,
        };
        Ok(Ppe {
            cpu,
            poller,
            sched: Scheduler::new(role),
            conns: FxHashMap::default(),
            listener,
            events: Vec::with_capacity(256),
            paused: FxHashSet::default(),
            touched: Vec::new(),
            limits,
            syn_pending: true,
            last_timer: Instant::now(),
            idle_polls: 0,
            shared,
        })
    }

    fn slot(&self) -> &PpeSlot {
        // The slot exists: `new` checked it, and slots are never removed.
        self.shared
            .slot(self.cpu)
            .unwrap_or_else(|| &self.shared.slots[0])
    }

    /// The loop on a thread of its own; returns when the server stops or
    /// this PPE is removed.
    pub fn run(mut self) {
        if self.shared.config.pin
            && let Err(e) = pin_to(self.cpu)
        {
            eprintln!("sidecore-tcps: PPE on CPU {}: cannot pin: {e}", self.cpu);
        }
        while self.turn() != Turn::Stopped {}
    }

    /// One round of the loop: poll, mailbox, resumed queues, timers, up to
    /// `round_budget` scheduler decisions; then, when it found nothing, the
    /// adaptive parking (which may wait in the event source). A resident
    /// driver (an offcode's executor) calls this on every turn; [`Ppe::run`]
    /// calls it in a loop. The time of rounds that found work is added to the
    /// PPE's `busy_ns`, which is what an autoscaler reads as its load.
    pub fn turn(&mut self) -> Turn {
        if self.shared.stopping.load(Ordering::Acquire) {
            self.close_all(CloseReason::Shutdown);
            return Turn::Stopped;
        }
        let now = Instant::now();
        let mut work = self.poll_events(false);
        match self.mailbox() {
            None => return Turn::Stopped,
            Some(w) => work |= w,
        }
        work |= self.resume_paused();
        if now.duration_since(self.last_timer) >= TIMER_EVERY {
            self.timers(now);
            self.last_timer = now;
        }
        self.refile_touched();
        work |= self.serve_round(now);
        if work {
            let busy_ns = u64::try_from(now.elapsed().as_nanos()).unwrap_or(u64::MAX);
            PpeStats::add(&self.slot().stats.busy_ns, busy_ns);
        }
        // Events found while parked are served on the next turn: say so, so
        // a driver does not take the time to back off first.
        if self.adapt(work) || work {
            Turn::Busy
        } else {
            Turn::Idle
        }
    }

    /// The CPU this PPE serves.
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// Adaptive polling: after `spin_polls` empty rounds, park until an
    /// event; true when parking found events.
    fn adapt(&mut self, work: bool) -> bool {
        if work {
            self.idle_polls = 0;
            return false;
        }
        self.idle_polls = self.idle_polls.saturating_add(1);
        if self.shared.config.spin || self.idle_polls < self.shared.config.spin_polls {
            return false;
        }
        let slot = self.slot();
        slot.parked.store(true, Ordering::SeqCst);
        // Pairs with `Shared::send` (send, fence, read `parked`).
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut found = false;
        if slot.rx.is_empty() && !self.shared.stopping.load(Ordering::Acquire) {
            PpeStats::add(&slot.stats.parks, 1);
            found = self.poll_events(true);
        }
        self.slot().parked.store(false, Ordering::SeqCst);
        found
    }

    /// Reads the event source; true when something happened.
    fn poll_events(&mut self, park: bool) -> bool {
        self.events.clear();
        let wait = park.then_some(TIMER_EVERY);
        if let Err(e) = self.poller.poll(&mut self.events, wait) {
            eprintln!("sidecore-tcps: PPE on CPU {}: poll: {e}", self.cpu);
            std::thread::sleep(Duration::from_millis(1));
            return false;
        }
        PpeStats::add(&self.slot().stats.polls, 1);
        if self.events.is_empty() {
            return false;
        }
        PpeStats::add(&self.slot().stats.events, self.events.len() as u64);
        let events = std::mem::take(&mut self.events);
        for &(token, r) in &events {
            self.on_event(token, r);
        }
        self.events = events;
        true
    }

    fn on_event(&mut self, token: u64, r: Ready) {
        if r.rearm {
            if let Some(c) = self.conns.get(&token) {
                let _ = self.poller.rearm(c.stream.as_fd(), token);
            } else if token == TOKEN_LISTENER
                && let Some(l) = &self.listener
            {
                let _ = self.poller.rearm(l.as_fd(), TOKEN_LISTENER);
            } else if token == TOKEN_WAKE {
                let shared = Arc::clone(&self.shared);
                if let Some(slot) = shared.slot(self.cpu) {
                    let _ = self.poller.rearm(slot.waker.fd(), TOKEN_WAKE);
                }
            }
            return;
        }
        match token {
            TOKEN_WAKE => self.slot().waker.drain(),
            TOKEN_LISTENER => {
                self.syn_pending = true;
                self.sched.set_syn_pending(true);
            }
            id => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.on_ready(r);
                    self.touched.push(id);
                }
            }
        }
    }

    /// Handles the mailbox; `None` when this PPE must stop.
    fn mailbox(&mut self) -> Option<bool> {
        let mut work = false;
        while let Ok(msg) = self.slot().rx.try_recv() {
            work = true;
            match msg {
                PpeMsg::Adopt(c) => self.adopt(*c),
                PpeMsg::Doorbell(id) => {
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.on_doorbell();
                        self.touched.push(id);
                    }
                }
                PpeMsg::Shed { to, count } => {
                    let ids: Vec<u64> = self.conns.keys().copied().take(count).collect();
                    for id in ids {
                        self.hand_off(id, to);
                    }
                }
                PpeMsg::Stop => {
                    self.retire();
                    return None;
                }
            }
        }
        Some(work)
    }

    /// Leaves ActivePPE's work: every connection goes to the master, and
    /// the PPE stops running (a thread returns; a resident driver dozes).
    pub fn retire(&mut self) {
        // Not running first: senders redirect new adoptions to the master
        // from now on.
        self.slot().running.store(false, Ordering::SeqCst);
        let to = self.shared.config.master;
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.hand_off(id, to);
        }
        // Adoptions sent just before the flag changed are passed on.
        for _ in 0..3 {
            self.shared.forward_adoptions(self.cpu);
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A dormant resident PPE (not running) waits in its event source for
    /// an activation (its waker) or for a timer period at most.
    pub fn doze(&mut self) {
        let slot = self.slot();
        slot.parked.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if !slot.running.load(Ordering::SeqCst) && !self.shared.stopping.load(Ordering::Acquire) {
            self.poll_events(true);
        }
        self.slot().parked.store(false, Ordering::SeqCst);
        self.idle_polls = 0;
    }

    /// Connections this PPE owns.
    pub fn conns(&self) -> usize {
        self.conns.len()
    }

    fn adopt(&mut self, mut c: PConn) {
        let id = c.id();
        if let Err(e) = self.poller.add(c.stream.as_fd(), id) {
            eprintln!(
                "sidecore-tcps: PPE on CPU {}: adopting connection {id}: {e}",
                self.cpu
            );
            PpeStats::add(&self.slot().stats.closed_reset, 1);
            c.close(CloseReason::Reset, true);
            return;
        }
        c.shared.owner.store(self.cpu, Ordering::Release);
        c.on_adopt();
        let moved = std::mem::take(&mut c.moved);
        if c.paused {
            self.paused.insert(id);
        }
        self.conns.insert(id, c);
        let st = &self.slot().stats;
        if moved {
            PpeStats::add(&st.adopted, 1);
        }
        PpeStats::add(&st.conns, 1);
        self.touched.push(id);
    }

    /// Moves connection `id` to the PPE on `to` (or closes it when that PPE
    /// cannot take it).
    fn hand_off(&mut self, id: u64, to: usize) {
        let Some(mut c) = self.conns.remove(&id) else {
            return;
        };
        c.moved = true;
        self.sched.remove(&id);
        self.paused.remove(&id);
        let _ = self.poller.remove(c.stream.as_fd(), id);
        c.shared.owner.store(to, Ordering::Release);
        let st = &self.slot().stats;
        st.conns.fetch_sub(1, Ordering::Relaxed);
        PpeStats::add(&st.handed_off, 1);
        if let Err(PpeMsg::Adopt(c)) = self.shared.send(to, PpeMsg::Adopt(Box::new(c))) {
            c.close(CloseReason::Reset, true);
        }
    }

    fn resume_paused(&mut self) -> bool {
        if self.paused.is_empty() {
            return false;
        }
        let mut resumed = false;
        let shared = Arc::clone(&self.shared);
        let Some(slot) = shared.slot(self.cpu) else {
            return false;
        };
        let touched = &mut self.touched;
        let conns = &mut self.conns;
        self.paused.retain(|id| {
            let Some(c) = conns.get_mut(id) else {
                return false;
            };
            if c.try_resume(&slot.stats) {
                touched.push(*id);
                resumed = true;
                return false;
            }
            true
        });
        resumed
    }

    /// Idle, half-open and linger timers; a dropped application end.
    fn timers(&mut self, now: Instant) {
        let cfg = &self.shared.config;
        let mut expired = Vec::new();
        let mut unheard = Vec::new();
        for (id, c) in &self.conns {
            if let Some(t) = c.closing_since
                && now.duration_since(t) >= cfg.linger
            {
                expired.push((*id, CloseReason::AppClosed));
            } else if !c.got_bytes && now.duration_since(c.accepted_at) >= cfg.first_byte_timeout {
                expired.push((*id, CloseReason::HalfOpen));
            } else if now.duration_since(c.last_activity) >= cfg.idle_timeout {
                expired.push((*id, CloseReason::IdleTimeout));
            } else if !c.app_closed && c.tx.is_producer_closed() {
                // The application's end is gone and its bell unheard.
                unheard.push(*id);
            }
        }
        for id in unheard {
            if let Some(c) = self.conns.get_mut(&id) {
                c.on_doorbell();
                self.touched.push(id);
            }
        }
        for (id, why) in expired {
            self.close(id, why);
        }
    }

    fn close(&mut self, id: u64, why: CloseReason) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        self.sched.remove(&id);
        self.paused.remove(&id);
        let _ = self.poller.remove(c.stream.as_fd(), id);
        let st = &self.slot().stats;
        st.conns.fetch_sub(1, Ordering::Relaxed);
        let counter = match why {
            CloseReason::AppClosed if c.peer_eof => &st.closed_app,
            CloseReason::AppClosed => &st.closed_linger,
            CloseReason::IdleTimeout => &st.closed_idle,
            CloseReason::HalfOpen => &st.closed_half_open,
            _ => &st.closed_reset,
        };
        PpeStats::add(counter, 1);
        let abortive = matches!(why, CloseReason::IdleTimeout | CloseReason::HalfOpen);
        c.close(why, abortive);
    }

    fn close_all(&mut self, why: CloseReason) {
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(id, why);
        }
    }

    /// Files every touched connection under its queue again.
    fn refile_touched(&mut self) {
        let touched = std::mem::take(&mut self.touched);
        for id in &touched {
            self.refile(*id);
        }
        self.touched = touched;
        self.touched.clear();
    }

    fn refile(&mut self, id: u64) {
        let cfg = &self.shared.config;
        let Some(c) = self.conns.get_mut(&id) else {
            self.sched.remove(&id);
            return;
        };
        let teardown = c.teardown_pending();
        if teardown && self.sched.role() == Role::Helper {
            let master = cfg.master;
            self.hand_off(id, master);
            return;
        }
        let w = c.weight(
            &self.limits,
            self.limits.max_rcv_bytes,
            cfg.rq_slots as u64,
            self.limits.max_snd_bytes,
        );
        self.sched.update(
            id,
            Pending {
                teardown,
                weight: w,
            },
        );
    }

    /// Up to `round_budget` decisions; true when any did work.
    fn serve_round(&mut self, now: Instant) -> bool {
        let mut work = false;
        self.sched.begin_round();
        for _ in 0..self.shared.config.round_budget {
            match self.sched.pick() {
                Some(Pick::Control(id)) => {
                    PpeStats::add(&self.slot().stats.picks_control, 1);
                    self.serve(id, now);
                }
                Some(Pick::Ready(id)) => {
                    PpeStats::add(&self.slot().stats.picks_ready, 1);
                    self.serve(id, now);
                }
                Some(Pick::Accept) => self.accept(now),
                None => break,
            }
            work = true;
        }
        // SYNs rank last, but never wait more than one round (and are
        // served at most once per round: the scheduler says when).
        if self.sched.next_accept().is_some() {
            self.accept(now);
            work = true;
        }
        work
    }

    fn serve(&mut self, id: u64, now: Instant) {
        let cfg = &self.shared.config;
        let Some(slot) = self.shared.slot(self.cpu) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            self.sched.remove(&id);
            return;
        };
        c.pending_events = 0;
        let r = c.receive(cfg.recv_batch, &slot.stats, now);
        let s = c.send(cfg.send_quantum, &self.shared.blobs, &slot.stats, now);
        if r.notify || s.notify {
            c.notify_app();
        }
        if c.paused {
            self.paused.insert(id);
        }
        if c.error {
            self.close(id, CloseReason::Reset);
        } else if c.finished() {
            self.close(id, CloseReason::AppClosed);
        } else {
            self.refile(id);
        }
    }

    /// The SYN class: accepts up to `accept_batch` connections.
    fn accept(&mut self, now: Instant) {
        PpeStats::add(&self.slot().stats.picks_accept, 1);
        for _ in 0..self.shared.config.accept_batch {
            let Some(app) = self.shared.pick_app() else {
                // No application: leave the SYNs in the kernel's backlog.
                return;
            };
            let Some(l) = &self.listener else {
                return;
            };
            match l.accept() {
                Ok((stream, peer)) => self.admit(stream, peer, app, now),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.syn_pending = false;
                    self.sched.set_syn_pending(false);
                    return;
                }
                Err(e) => {
                    PpeStats::add(&self.slot().stats.accept_errors, 1);
                    if e.raw_os_error() == Some(libc::EMFILE)
                        || e.raw_os_error() == Some(libc::ENFILE)
                    {
                        return;
                    }
                }
            }
        }
    }

    fn admit(
        &mut self,
        stream: TcpStream,
        peer: std::net::SocketAddr,
        app: crate::conn::AppSender,
        now: Instant,
    ) {
        let cfg = &self.shared.config;
        if stream.set_nonblocking(true).is_err() {
            PpeStats::add(&self.slot().stats.accept_errors, 1);
            return;
        }
        if cfg.nodelay {
            let _ = stream.set_nodelay(true);
        }
        let Ok(rings) = self.shared.pool.rings() else {
            PpeStats::add(&self.slot().stats.accept_errors, 1);
            return;
        };
        let ((rq_p, rq_c), (tx_p, tx_c)) = (rings.rq, rings.tx);
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let owner = self.shared.least_loaded();
        let cs = Arc::new(ConnShared::new(id, peer, owner));
        let bell = Arc::new(Bell(Arc::clone(&self.shared)));
        let conn = Conn::new(Arc::clone(&cs), rq_c, tx_p, bell);
        let segment = mss(&stream);
        let pc = PConn::new(cs, stream, rq_p, tx_c, app.clone(), segment, now);
        if app.send(AppEvent::Accepted(Box::new(conn))).is_err() {
            return;
        }
        PpeStats::add(&self.slot().stats.accepted, 1);
        if owner == self.cpu {
            self.adopt(pc);
        } else if let Err(PpeMsg::Adopt(pc)) = self.shared.send(owner, PpeMsg::Adopt(Box::new(pc)))
        {
            pc.close(CloseReason::Reset, true);
        }
    }
}
