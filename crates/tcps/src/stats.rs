//! Counters of one PPE, written by it alone and read by anyone (`sidecore
//! tcps stats`), and the serialisable snapshot of a whole server.

use std::sync::atomic::{AtomicU64, Ordering};

/// One PPE's counters.
#[derive(Debug, Default)]
pub struct PpeStats {
    pub polls: AtomicU64,
    pub parks: AtomicU64,
    pub events: AtomicU64,
    pub accepted: AtomicU64,
    pub accept_errors: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    /// Times the PPE stopped reading a socket because its receive queue was full.
    pub rq_full_stalls: AtomicU64,
    /// Times the PPE resumed such a socket.
    pub rq_resumed: AtomicU64,
    pub closed_app: AtomicU64,
    pub closed_reset: AtomicU64,
    pub closed_idle: AtomicU64,
    pub closed_half_open: AtomicU64,
    pub closed_linger: AtomicU64,
    pub picks_control: AtomicU64,
    pub picks_ready: AtomicU64,
    pub picks_accept: AtomicU64,
    /// Connections this PPE received from another one.
    pub adopted: AtomicU64,
    /// Connections this PPE handed to another one.
    pub handed_off: AtomicU64,
    /// Connections this PPE owns now.
    pub conns: AtomicU64,
    /// Time spent in rounds that found work (its load), ns.
    pub busy_ns: AtomicU64,
}

impl PpeStats {
    /// Adds `n` to a counter (the PPE is its only writer).
    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// A plain copy.
    pub fn snapshot(&self, cpu: usize, master: bool, active: bool) -> PpeSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PpeSnapshot {
            cpu,
            master,
            active,
            polls: l(&self.polls),
            parks: l(&self.parks),
            events: l(&self.events),
            accepted: l(&self.accepted),
            accept_errors: l(&self.accept_errors),
            bytes_in: l(&self.bytes_in),
            bytes_out: l(&self.bytes_out),
            rq_full_stalls: l(&self.rq_full_stalls),
            rq_resumed: l(&self.rq_resumed),
            closed_app: l(&self.closed_app),
            closed_reset: l(&self.closed_reset),
            closed_idle: l(&self.closed_idle),
            closed_half_open: l(&self.closed_half_open),
            closed_linger: l(&self.closed_linger),
            picks_control: l(&self.picks_control),
            picks_ready: l(&self.picks_ready),
            picks_accept: l(&self.picks_accept),
            adopted: l(&self.adopted),
            handed_off: l(&self.handed_off),
            conns: l(&self.conns),
            busy_ns: l(&self.busy_ns),
        }
    }
}

/// One PPE's counters at one moment.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PpeSnapshot {
    pub cpu: usize,
    pub master: bool,
    pub active: bool,
    pub polls: u64,
    pub parks: u64,
    pub events: u64,
    pub accepted: u64,
    pub accept_errors: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub rq_full_stalls: u64,
    pub rq_resumed: u64,
    pub closed_app: u64,
    pub closed_reset: u64,
    pub closed_idle: u64,
    pub closed_half_open: u64,
    pub closed_linger: u64,
    pub picks_control: u64,
    pub picks_ready: u64,
    pub picks_accept: u64,
    pub adopted: u64,
    pub handed_off: u64,
    pub conns: u64,
    /// Time spent in rounds that found work, ns.
    #[serde(default)]
    pub busy_ns: u64,
}

/// A whole server at one moment.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub listen: String,
    pub backend: String,
    pub allowed_ppe: Vec<usize>,
    pub active_ppe: Vec<usize>,
    pub master: usize,
    pub ppes: Vec<PpeSnapshot>,
    /// Application-level counters (HTTP responses by status, …), by name.
    pub app: std::collections::BTreeMap<String, u64>,
    /// Connection rings built on a pooled buffer, and on fresh memory.
    #[serde(default)]
    pub rings_reused: u64,
    #[serde(default)]
    pub rings_fresh: u64,
}

impl Snapshot {
    /// The sum of one counter over every PPE.
    pub fn total(&self, f: impl Fn(&PpeSnapshot) -> u64) -> u64 {
        self.ppes.iter().map(f).sum()
    }
}
