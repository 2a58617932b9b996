//! The PPE's connection scheduler (TCPServers §2.4.4, sans-IO): the weights of
//! Eqs. 2.1–2.7, the priority groups of Eq. 2.8, GR³'s group ratio
//! round-robin between groups (Alg. 1 with erratum E1) and deficit round robin
//! inside a group, plus the scheduling queues around them.
//!
//! Nothing here touches a socket: the PPE tells the scheduler what each
//! connection has pending ([`Scheduler::update`]) and asks whom to serve next
//! ([`Scheduler::pick`]). That keeps the algorithm testable on its own, with
//! property tests that its shares are proportional within GR³'s bound.
//!
//! * **Packet classes**, highest first ([`PacketClass`]): control, teardown,
//!   data, new-connection SYN. Forwarding is not a class here: sidecore-tcps
//!   terminates TCP for the host's own applications and never forwards, so the
//!   Forwarding queue ([`SchedQueue::Forwarding`]) exists only by name and is
//!   always empty.
//! * **Scheduling queues** ([`SchedQueue`]): Control holds connections with a
//!   teardown (FIN, RST, error) pending, served round robin first; Ready holds
//!   connections with work and a weight above 0, served by GR³; Wait holds the
//!   rest, including every connection whose weight is 0 (erratum E3: weight 0
//!   belongs to no group). Listening sockets with connections to accept (the
//!   SYN class) are served after everything else (E4); the PPE bounds how
//!   long they may wait (see `ppe`).
//! * **Several PPEs** (§2.4.4): the master PPE serves every queue
//!   ([`Role::Master`]); the others serve only Ready ([`Role::Helper`]).

use std::collections::VecDeque;
use std::hash::Hash;

use rustc_hash::FxHashMap as HashMap;

/// Packet classes, highest priority first (§2.4.4). `Ord` follows priority:
/// a smaller value is served first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PacketClass {
    /// ICMP, ARP, RARP in the seed. On a user-space PPE over the kernel's
    /// stack these never reach us; socket errors (`SO_ERROR`) stand in.
    Control,
    /// FIN or RST for a connected socket.
    Teardown,
    /// Data for an existing connection.
    Data,
    /// A new connection waiting to be accepted.
    Syn,
}

/// The four scheduling queues of §2.4.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchedQueue {
    /// Receive queues for forwarded packets. Unused: sidecore-tcps never
    /// forwards (it terminates TCP for local applications).
    Forwarding,
    /// Control protocols and connections with a teardown pending.
    Control,
    /// Connections with work pending and a weight above 0, in GR³ groups.
    Ready,
    /// Everything else (weight 0, nothing pending).
    Wait,
}

/// Which queues a PPE serves (§2.4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The master PPE: every queue, and the listening sockets.
    Master,
    /// Any other PPE: Ready only.
    Helper,
}

/// System-wide maxima used to normalise the weights (Eqs. 2.4–2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// MaxSndBytes: the largest send buffer a connection may have.
    pub max_snd_bytes: u64,
    /// MaxRcvBytes: the largest receive buffer (receive queue) a connection may have.
    pub max_rcv_bytes: u64,
    /// MaxRQSize: the largest receive queue, in slots.
    pub max_rq_size: u64,
}

/// What one connection has pending, as the PPE sees it: the inputs of
/// Eqs. 2.1–2.3 and of the normalisation of Eqs. 2.4–2.6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Load {
    /// PendingSendBytes(i): bytes the application handed over, not yet sent.
    pub pending_send_bytes: u64,
    /// MaxSndBytes(i): this connection's send buffer.
    pub max_snd_bytes: u64,
    /// PendingRcvBytes(i): bytes in the receive queue the application has not read.
    pub pending_rcv_bytes: u64,
    /// MaxRcvBytes(i): this connection's receive queue, in bytes (E2: the
    /// seed's "MaxBytes(i)").
    pub max_rcv_bytes: u64,
    /// NumPendingPackets(i): events pending for the connection.
    pub pending_packets: u64,
    /// MaxRQSize(i): this connection's receive queue, in slots.
    pub max_rq_size: u64,
    /// SegmentSize(i): the connection's segment size (its MSS).
    pub segment_size: u64,
}

/// Largest weight kept: weights are 32-bit, so there are at most 32 groups
/// (§2.4.4, E3).
pub const MAX_WEIGHT: u64 = u32::MAX as u64;

/// W(i) of Eq. 2.7 = Ŵ_s + Ŵ_r + Ŵ_q (Eqs. 2.1–2.6), in integers, saturated
/// at [`MAX_WEIGHT`]. Zero sizes count as 1 (no division by zero on bad input).
pub fn weight(load: &Load, limits: &Limits) -> u64 {
    let seg = u128::from(load.segment_size.max(1));
    // (2.1) W_s = PendingSendBytes / SegmentSize, (2.4) × MaxSndBytes / MaxSndBytes(i).
    let ws = u128::from(load.pending_send_bytes) * u128::from(limits.max_snd_bytes.max(1))
        / (seg * u128::from(load.max_snd_bytes.max(1)));
    // (2.2) W_r = (MaxRcvBytes(i) − PendingRcvBytes(i)) / SegmentSize (E2: free
    // receive space), (2.5) × MaxRcvBytes / MaxRcvBytes(i).
    let free = load.max_rcv_bytes.saturating_sub(load.pending_rcv_bytes);
    let wr = u128::from(free) * u128::from(limits.max_rcv_bytes.max(1))
        / (seg * u128::from(load.max_rcv_bytes.max(1)));
    // (2.3) W_q = NumPendingPackets, (2.6) × MaxRQSize / MaxRQSize(i).
    let wq = u128::from(load.pending_packets) * u128::from(limits.max_rq_size.max(1))
        / u128::from(load.max_rq_size.max(1));
    (ws + wr + wq).min(u128::from(MAX_WEIGHT)) as u64
}

/// σ of Eq. 2.8: the group of order σ holds weights 2^σ ≤ W ≤ 2^(σ+1) − 1.
/// `None` for weight 0, which belongs to no group (E3).
pub fn group_order(weight: u64) -> Option<u32> {
    (weight > 0).then(|| 63 - weight.min(MAX_WEIGHT).leading_zeros())
}

/// Which inter-group rule to use. Only tests pick the one the seed printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRule {
    /// GR³'s rule, as erratum E1 restores it: move on when
    /// (W_i + 1)/(W_{i+1} + 1) > φ_i/φ_{i+1}.
    Gr3,
    /// Alg. 1 line 4 as printed: W_{i+1}/(W_{i+1} + 1) > φ_i/φ_{i+1}. Kept so
    /// the tests can show it is not proportional.
    AsPrinted,
}

#[derive(Debug)]
struct Member<K> {
    key: K,
    weight: u64,
    /// Deficit in units of 1/2^σ of a slot: a visit adds `weight`, a slot
    /// costs 2^σ, so each visit gives 1 or 2 slots and fractions carry over.
    deficit: u64,
}

#[derive(Debug)]
struct Group<K> {
    order: u32,
    members: Vec<Member<K>>,
    /// φ: the sum of the members' weights.
    phi: u64,
    /// W_i: slots this group has had since the group list last changed.
    work: u64,
    /// `curpos` of the seed: the member being served.
    curpos: usize,
}

impl<K: Copy> Group<K> {
    /// TCPServerGroupSchedule: deficit round robin over an unsorted list.
    fn schedule(&mut self) -> Option<K> {
        let unit = 1u64 << self.order;
        let n = self.members.len();
        if n == 0 {
            return None;
        }
        // Each visit adds at least one unit (weight ≥ 2^σ), so this ends within
        // one pass plus one step.
        for _ in 0..=n {
            let cur = self.curpos.min(n - 1);
            self.curpos = cur;
            let m = &mut self.members[cur];
            if m.deficit >= unit {
                m.deficit -= unit;
                return Some(m.key);
            }
            self.curpos = (cur + 1) % n;
            let next = &mut self.members[self.curpos];
            next.deficit += next.weight;
        }
        None
    }
}

/// GR³ over the Ready queue: groups sorted by φ (descending), O(1) decisions,
/// O(g) moves between groups.
#[derive(Debug)]
pub struct Gr3<K> {
    /// Groups by order σ (index = σ); empty groups stay allocated.
    groups: Vec<Group<K>>,
    /// Orders of the non-empty groups, sorted by φ descending.
    sorted: Vec<u32>,
    /// Where each member is: (σ, index in the group).
    at: HashMap<K, (u32, usize)>,
    /// i of Alg. 1, an index into `sorted`.
    current: usize,
    rule: GroupRule,
    /// `resort`'s working list, kept to avoid an allocation per update.
    scratch: Vec<u32>,
}

impl<K: Copy + Eq + Hash> Default for Gr3<K> {
    fn default() -> Self {
        Self::new(GroupRule::Gr3)
    }
}

impl<K: Copy + Eq + Hash> Gr3<K> {
    /// An empty scheduler using `rule` between groups.
    pub fn new(rule: GroupRule) -> Self {
        Gr3 {
            groups: (0..32)
                .map(|order| Group {
                    order,
                    members: Vec::new(),
                    phi: 0,
                    work: 0,
                    curpos: 0,
                })
                .collect(),
            sorted: Vec::new(),
            at: HashMap::default(),
            current: 0,
            rule,
            scratch: Vec::with_capacity(32),
        }
    }

    /// Number of clients scheduled.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// True when no client is scheduled.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Number of non-empty groups (g).
    pub fn groups(&self) -> usize {
        self.sorted.len()
    }

    /// The weight a client is scheduled with, if it is.
    pub fn weight_of(&self, key: &K) -> Option<u64> {
        let &(o, i) = self.at.get(key)?;
        Some(self.groups[o as usize].members[i].weight)
    }

    /// Inserts, moves or (weight 0) removes a client. A client whose weight
    /// stays in its group keeps its place and deficit.
    pub fn set(&mut self, key: K, weight: u64) {
        let weight = weight.min(MAX_WEIGHT);
        let Some(order) = group_order(weight) else {
            self.remove(&key);
            return;
        };
        if let Some(&(o, i)) = self.at.get(&key)
            && o == order
        {
            let g = &mut self.groups[o as usize];
            g.phi = g.phi - g.members[i].weight + weight;
            g.members[i].weight = weight;
            self.resort();
            return;
        }
        self.remove(&key);
        let g = &mut self.groups[order as usize];
        g.members.push(Member {
            key,
            weight,
            deficit: 0,
        });
        g.phi += weight;
        self.at.insert(key, (order, g.members.len() - 1));
        self.resort();
    }

    /// Removes a client (no-op when absent).
    pub fn remove(&mut self, key: &K) {
        let Some((o, i)) = self.at.remove(key) else {
            return;
        };
        let g = &mut self.groups[o as usize];
        let m = g.members.swap_remove(i);
        g.phi -= m.weight;
        if let Some(moved) = g.members.get(i) {
            self.at.insert(moved.key, (o, i));
        }
        // The member that was last now sits at `i`; keep the cursor on it if it
        // pointed there.
        if g.curpos >= g.members.len() {
            g.curpos = i.min(g.members.len().saturating_sub(1));
        }
        self.resort();
    }

    /// Keeps `sorted` ordered by φ descending. When the order changes (a
    /// group appears, empties or overtakes another) the group frame restarts:
    /// work counters back to 0 and i back to the first group, since GR³'s
    /// ratio test compares neighbours. A weight change that keeps the order
    /// keeps the frame.
    fn resort(&mut self) {
        // Into a buffer kept between calls: this runs on every update, and
        // allocating a fresh list each time was a measurable share of a PPE.
        let mut sorted = std::mem::take(&mut self.scratch);
        sorted.clear();
        sorted.extend(
            self.groups
                .iter()
                .filter(|g| !g.members.is_empty())
                .map(|g| g.order),
        );
        let groups = &self.groups;
        sorted.sort_unstable_by(|a, b| {
            groups[*b as usize]
                .phi
                .cmp(&groups[*a as usize].phi)
                .then(b.cmp(a))
        });
        if sorted != self.sorted {
            for g in &mut self.groups {
                g.work = 0;
            }
            std::mem::swap(&mut self.sorted, &mut sorted);
            self.current = 0;
        }
        self.scratch = sorted;
    }

    /// TCPServerSchedule (Alg. 1 with E1): the next client to serve.
    pub fn pick(&mut self) -> Option<K> {
        let g = self.sorted.len();
        if g == 0 {
            return None;
        }
        let i = self.current.min(g - 1);
        let gi = self.sorted[i] as usize;
        let picked = self.groups[gi].schedule();
        self.groups[gi].work += 1;
        let advance = if i + 1 < g {
            let gn = self.sorted[i + 1] as usize;
            let (wi, wn) = (self.groups[gi].work, self.groups[gn].work);
            let (phi_i, phi_n) = (self.groups[gi].phi, self.groups[gn].phi);
            // Cross-multiplied, so no fractions: a/b > c/d ⇔ a·d > c·b.
            let lhs = match self.rule {
                GroupRule::Gr3 => wi + 1,
                GroupRule::AsPrinted => wn,
            };
            u128::from(lhs) * u128::from(phi_n) > u128::from(phi_i) * u128::from(wn + 1)
        } else {
            false
        };
        self.current = if advance { i + 1 } else { 0 };
        picked
    }
}

/// What the PPE knows about one connection when it updates the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pending {
    /// A teardown (FIN, RST) or a socket error is pending: Control queue.
    pub teardown: bool,
    /// W(i) when the connection has work it can do now, else 0 (Wait).
    pub weight: u64,
}

/// A decision: whom to serve, and from which queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick<K> {
    /// A connection from the Control queue (teardown pending).
    Control(K),
    /// A connection from the Ready queue.
    Ready(K),
    /// The listening socket: accept new connections (SYN class, last).
    Accept,
}

/// Counters of decisions, by queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SchedCounts {
    pub control: u64,
    pub ready: u64,
    pub accept: u64,
}

/// The scheduling queues of one PPE.
#[derive(Debug)]
pub struct Scheduler<K> {
    role: Role,
    control: VecDeque<K>,
    in_control: HashMap<K, ()>,
    ready: Gr3<K>,
    wait: HashMap<K, ()>,
    syn_pending: bool,
    counts: SchedCounts,
    /// The SYN class was served in this round ([`Scheduler::begin_round`]).
    accepted_this_round: bool,
    /// Control picks in a row while Ready had connections waiting.
    control_run: u32,
    /// Most Control picks in a row while Ready waits (at least 1).
    control_burst: u32,
}

/// Default for [`Scheduler::set_control_burst`]: after this many teardowns in
/// a row, one Ready connection is served if any waits.
pub const CONTROL_BURST: u32 = 8;

impl<K: Copy + Eq + Hash> Scheduler<K> {
    /// Empty queues for a PPE of the given role.
    pub fn new(role: Role) -> Self {
        Scheduler {
            role,
            control: VecDeque::new(),
            in_control: HashMap::default(),
            ready: Gr3::default(),
            wait: HashMap::default(),
            syn_pending: false,
            counts: SchedCounts::default(),
            accepted_this_round: false,
            control_run: 0,
            control_burst: CONTROL_BURST,
        }
    }

    /// Most Control picks in a row while Ready has connections waiting
    /// (clamped to at least 1). Control still ranks first, but a flood of
    /// teardowns (heavy churn) cannot starve established connections.
    pub fn set_control_burst(&mut self, burst: u32) {
        self.control_burst = burst.max(1);
    }

    /// Starts a PPE round (one poll of the event source). The SYN class is
    /// served at most once per round: SYNs rank last, and a round whose
    /// queues happen to be empty when it starts must not spend its whole
    /// budget accepting while events for established connections wait
    /// unpolled.
    pub fn begin_round(&mut self) {
        self.accepted_this_round = false;
    }

    /// This PPE's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Makes this PPE master or helper.
    pub fn set_role(&mut self, role: Role) {
        self.role = role;
    }

    /// Decisions so far, by queue.
    pub fn counts(&self) -> SchedCounts {
        self.counts
    }

    /// Files a connection under the queue its state calls for.
    pub fn update(&mut self, key: K, p: Pending) {
        if p.teardown {
            self.ready.remove(&key);
            self.wait.remove(&key);
            if self.in_control.insert(key, ()).is_none() {
                self.control.push_back(key);
            }
            return;
        }
        self.forget_control(&key);
        if p.weight == 0 {
            self.ready.remove(&key);
            self.wait.insert(key, ());
        } else {
            self.wait.remove(&key);
            self.ready.set(key, p.weight);
        }
    }

    fn forget_control(&mut self, key: &K) {
        if self.in_control.remove(key).is_some() {
            self.control.retain(|k| k != key);
        }
    }

    /// Forgets a connection (closed, or handed to another PPE).
    pub fn remove(&mut self, key: &K) {
        self.forget_control(key);
        self.ready.remove(key);
        self.wait.remove(key);
    }

    /// Says whether the listening socket has connections waiting (SYN class).
    pub fn set_syn_pending(&mut self, pending: bool) {
        self.syn_pending = pending;
    }

    /// The queue a connection is in, if known.
    pub fn queue_of(&self, key: &K) -> Option<SchedQueue> {
        if self.in_control.contains_key(key) {
            Some(SchedQueue::Control)
        } else if self.ready.weight_of(key).is_some() {
            Some(SchedQueue::Ready)
        } else if self.wait.contains_key(key) {
            Some(SchedQueue::Wait)
        } else {
            None
        }
    }

    /// Connections in each queue: (control, ready, wait).
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.control.len(), self.ready.len(), self.wait.len())
    }

    /// The next decision: Control round robin (master only), then Ready by
    /// GR³, then accepting (master only). A Control pick leaves the queue:
    /// the PPE files the connection again after serving it. A Ready pick stays
    /// until the PPE updates its weight.
    ///
    /// Control ranks first, but after `control_burst` Control picks in a row
    /// one Ready connection is served when any waits, so a flood of
    /// teardowns cannot stop established connections. The SYN class is
    /// served at most once per round (see [`Scheduler::begin_round`]).
    pub fn pick(&mut self) -> Option<Pick<K>> {
        let ready_waits = !self.ready.is_empty();
        let control_turn = !ready_waits || self.control_run < self.control_burst;
        if self.role == Role::Master
            && control_turn
            && let Some(k) = self.control.pop_front()
        {
            self.in_control.remove(&k);
            self.counts.control += 1;
            self.control_run = if ready_waits { self.control_run + 1 } else { 0 };
            return Some(Pick::Control(k));
        }
        if let Some(k) = self.ready.pick() {
            self.control_run = 0;
            self.counts.ready += 1;
            return Some(Pick::Ready(k));
        }
        self.next_accept()
    }

    /// Accepting, when it is pending, this is the master, and the SYN class
    /// has not been served yet this round: the PPE also asks for it once per
    /// round so it cannot starve.
    pub fn next_accept(&mut self) -> Option<Pick<K>> {
        if self.role == Role::Master && self.syn_pending && !self.accepted_this_round {
            self.accepted_this_round = true;
            self.counts.accept += 1;
            return Some(Pick::Accept);
        }
        None
    }

    /// Connections a helper cannot serve (teardowns), for handing to the master.
    pub fn take_control(&mut self) -> Vec<K> {
        self.in_control.clear();
        self.control.drain(..).collect()
    }
}

#[cfg(test)]
mod tests;
