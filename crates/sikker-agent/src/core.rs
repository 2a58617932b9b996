//! The agent's logic, sans-IO: which connection is which attested process,
//! and what each message comes to. Every message is checked at the sender
//! against the sender's NMU tables (§6.2.1, §6.2.3, §6.2.5: with OTPs issued,
//! used once, expiring and capped), and again at the receiver (§6.2.2,
//! §6.2.4), and delivered with the identity the agent derived for its sender.
//! Denials are typed, counted by kind, and name services and domains the way
//! `sidecore policy trace` explains a verdict.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use sidecore_sikker_nmu::{
    DomainId, Header, LocalIndex, NmuError, NmuTables, ProcessId, ServiceId, Triple,
};
use sidecore_sikker_policy::Nos;
use sidecore_wire::{AgentSend, Message};

use crate::attest::{ProcessFacts, attest};
use crate::proto::{Denied, Dest, FromAgent, Identity, ToAgent};
use crate::rate::{Admit, RateControl};

mod peering;
mod placement;
use crate::header::to_wire;

/// What a message from another agent came to here.
#[derive(Debug, Default)]
pub struct PeerIn {
    /// Messages for local processes.
    pub effects: Vec<Effect>,
    /// When the effects deliver a forwarded message: its number. The I/O
    /// layer reports whether the delivery went out ([`AgentCore::forward_delivered`]).
    pub delivery_of: Option<u64>,
}

/// A connection to the agent, numbered by the I/O layer.
pub type ConnId = u64;

/// What the I/O layer must do: send this to that connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    pub to: ConnId,
    pub msg: FromAgent,
}

/// An attested connection.
#[derive(Clone, Debug)]
struct Attached {
    svc: ServiceId,
    proc: ProcessId,
    li: LocalIndex,
    /// What the kernel said about the process when it attached: attested
    /// again against every new policy.
    facts: ProcessFacts,
    listening: bool,
}

/// What the agent has done, for `ps` and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    pub attached: u64,
    pub refused: u64,
    pub sent: u64,
    pub delivered: u64,
    /// Messages sent to other hosts' agents, and received from them.
    pub forwarded: u64,
    pub received_from_peers: u64,
    /// Messages held until their rate limit admitted them.
    pub held: u64,
    /// Denials by kind (`permission`, `forged`, `passed-socket`, …).
    pub denied: BTreeMap<String, u64>,
    /// Policy updates applied, and refused (the last good policy kept enforcing).
    pub policy_updates: u64,
    pub policy_refused: u64,
    /// Placement updates applied, and refused (the last good placement kept).
    pub placement_updates: u64,
    pub placement_refused: u64,
}

/// Why an agent cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("host `{host}` is not in the placement (hosts: {known})")]
    UnknownHost { host: String, known: String },
    #[error(transparent)]
    Rate(#[from] crate::rate::RateError),
}

/// Why a connection was given no identity (the process hears this reason).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Attest(#[from] crate::attest::AttestError),
    #[error("{identity} is placed on host {placed}, not on this agent's host {here}")]
    OtherHost {
        identity: Identity,
        placed: String,
        here: String,
    },
    #[error("{0} is not placed on any host")]
    Unplaced(Identity),
}

/// Why a policy update was refused (the last good policy keeps enforcing).
#[derive(Debug, thiserror::Error)]
pub enum PolicyRefused {
    #[error(transparent)]
    Nos(#[from] sidecore_sikker_policy::NosError),
    #[error("rate limits: {0}")]
    Rates(#[source] crate::rate::RateError),
    #[error("rate limits: {rates} (and restoring the last good policy failed: {restore})")]
    RatesAndRestore {
        #[source]
        rates: crate::rate::RateError,
        restore: sidecore_sikker_policy::NosError,
    },
}

/// Why a placement update was refused (the last good placement stays in force).
#[derive(Debug, thiserror::Error)]
pub enum PlacementRefused {
    #[error("this agent's host `{host}` is not in it (hosts: {known})")]
    NotHere { host: String, known: String },
    #[error(transparent)]
    Nos(#[from] sidecore_sikker_policy::NosError),
    #[error("rate limits: {0}")]
    Rates(#[source] crate::rate::RateError),
}

/// What a placement update changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementDelta {
    /// Processes now on another host, newly placed, or no longer placed.
    pub moved: usize,
    /// Hosts whose agent's address appeared, changed or went, and hosts that
    /// joined or left.
    pub peers_changed: usize,
}

/// A message waiting for its rate limit's tokens.
#[derive(Clone, Debug)]
struct Held {
    conn: ConnId,
    id: u64,
    header: Header,
    payload: Vec<u8>,
}

/// What became of a request: answered now, or later (held by a rate limit
/// or forwarded to another agent, whose verdict answers it).
enum Flow {
    Done(Vec<Effect>),
    Later,
}

/// Reads an attached process's facts again (`None`: it cannot be read, gone).
pub type FactsReader = Box<dyn Fn(&ProcessFacts) -> Option<ProcessFacts> + Send>;

/// One node's agent.
pub struct AgentCore {
    nos: Nos,
    host: String,
    attached: HashMap<ConnId, Attached>,
    counters: Counters,
    rate: RateControl,
    /// Held messages per (rate slot, source process), oldest first.
    held: BTreeMap<(u32, ProcessId), VecDeque<Held>>,
    /// Other hosts' agents this one is linked to.
    linked: BTreeSet<String>,
    /// Forwarded messages awaiting their receiver's verdict: fid → (host, conn, request).
    forwards: HashMap<u64, (String, ConnId, u64)>,
    next_fid: u64,
    /// Messages for other hosts' agents.
    outbox: Vec<(String, Message)>,
    /// Where the hosts' agents listen (the placement's `agent` addresses).
    agents: BTreeMap<String, std::net::SocketAddr>,
    /// The placement's hosts or their agents' addresses changed.
    peers_changed: bool,
    /// Reads attached processes' facts again at each re-attestation (the
    /// I/O layer's `/proc`; none in sans-IO use).
    facts_reader: Option<FactsReader>,
}

/// Denials logged in full before sampling starts.
pub const LOG_FIRST_DENIALS: u64 = 100;
/// After the first [`LOG_FIRST_DENIALS`], one denial in this many is logged.
pub const LOG_EVERY_DENIAL: u64 = 1000;

fn kind(d: &Denied) -> &'static str {
    match d {
        Denied::Permission(_) => "permission",
        Denied::Unknown { .. } => "unknown-name",
        Denied::Forged { .. } => "forged",
        Denied::PassedSocket { .. } => "passed-socket",
        Denied::Exec { .. } => "exec",
        Denied::Otp(_) => "otp",
        Denied::Undeliverable(_) => "undeliverable",
        Denied::Malformed(_) => "malformed",
        Denied::Rate(_) => "rate",
        Denied::Remote { .. } => "remote",
        Denied::NoIdentity(_) => "no-identity",
    }
}

impl AgentCore {
    /// The agent of `host`, enforcing `nos`'s tables for it.
    pub fn new(nos: Nos, host: &str) -> Result<Self, AgentError> {
        if nos.tables(host).is_none() {
            return Err(AgentError::UnknownHost {
                host: host.to_string(),
                known: nos.host_names().join(", "),
            });
        }
        let rate = RateControl::new(&nos, host, 0.0)?;
        Ok(AgentCore {
            nos,
            host: host.to_string(),
            attached: HashMap::new(),
            counters: Counters::default(),
            rate,
            held: BTreeMap::new(),
            linked: BTreeSet::new(),
            forwards: HashMap::new(),
            next_fid: 1,
            outbox: Vec::new(),
            agents: BTreeMap::new(),
            peers_changed: false,
            facts_reader: None,
        })
    }

    /// Has every re-attestation after a policy or placement update read the
    /// attached processes' facts again with `r` first (see
    /// [`AgentCore::refresh_facts`]); the server gives it `/proc`.
    pub fn set_facts_reader(&mut self, r: FactsReader) {
        self.facts_reader = Some(r);
    }

    /// What it has done so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn tables(&self) -> &NmuTables {
        self.nos.tables(&self.host).expect("checked in new")
    }

    fn svc_name(&self, s: ServiceId) -> String {
        self.nos
            .policy()
            .services
            .get(&s)
            .map_or_else(|| format!("S{s}"), |x| x.name.clone())
    }

    fn dom_name(&self, s: ServiceId, d: DomainId) -> String {
        self.nos
            .policy()
            .services
            .get(&s)
            .and_then(|x| x.domains.iter().find(|(_, id)| **id == d))
            .map_or_else(|| format!("D{d}"), |(n, _)| n.clone())
    }

    fn identity(&self, s: ServiceId, p: ProcessId) -> Identity {
        Identity {
            service: self.svc_name(s),
            process: p,
        }
    }

    /// Attests a new connection from the process `facts` describe: its
    /// identity, which must be placed on this host.
    pub fn attach(&mut self, conn: ConnId, facts: &ProcessFacts) -> Result<Identity, AttachError> {
        let r = attest(self.nos.policy(), facts)
            .map_err(AttachError::from)
            .and_then(|(s, p)| match self.nos.locate(s, p) {
                Some((h, _, li)) if h == self.host => Ok((s, p, li)),
                Some((h, ..)) => Err(AttachError::OtherHost {
                    identity: self.identity(s, p),
                    placed: h,
                    here: self.host.clone(),
                }),
                None => Err(AttachError::Unplaced(self.identity(s, p))),
            });
        match r {
            Ok((svc, proc, li)) => {
                self.attached.insert(
                    conn,
                    Attached {
                        svc,
                        proc,
                        li,
                        facts: facts.clone(),
                        listening: false,
                    },
                );
                self.counters.attached += 1;
                Ok(self.identity(svc, proc))
            }
            Err(e) => {
                self.counters.refused += 1;
                Err(e)
            }
        }
    }

    /// Forgets a connection.
    pub fn detach(&mut self, conn: ConnId) {
        self.attached.remove(&conn);
    }

    /// The pid and executable a connection was attested with.
    pub fn attested(&self, conn: ConnId) -> Option<(i32, &std::path::Path)> {
        self.attached
            .get(&conn)
            .map(|a| (a.facts.pid, a.facts.exe.as_path()))
    }

    /// Counts a denial of request `id`, logs it (see [`AgentCore::denial_line`])
    /// and answers it.
    pub fn deny(&mut self, conn: ConnId, id: Option<u64>, why: Denied) -> Effect {
        *self
            .counters
            .denied
            .entry(kind(&why).to_string())
            .or_default() += 1;
        if let Some(line) = self.denial_line(conn, id, &why) {
            eprintln!("{line}");
        }
        Effect {
            to: conn,
            msg: FromAgent::Denied { id, why },
        }
    }

    /// A delivery this core handed out could not be written to its
    /// receiver (its socket is full or it went away): it no longer counts as
    /// delivered, and the sender's request `id` is denied as undeliverable.
    pub fn delivery_failed(&mut self, conn: ConnId, id: u64) -> Effect {
        self.counters.delivered = self.counters.delivered.saturating_sub(1);
        let why = Denied::Undeliverable("the receiver's queue is full or it has gone".into());
        self.deny(conn, Some(id), why)
    }

    /// The log line of a denial just counted, with the sender and the reason
    /// in the policy's names; `None` when it is not logged. The first
    /// [`LOG_FIRST_DENIALS`] are logged, then one in [`LOG_EVERY_DENIAL`] with
    /// the running total, so a process that floods the agent with refused
    /// messages cannot flood its log (the counters keep every one).
    pub fn denial_line(&self, conn: ConnId, id: Option<u64>, why: &Denied) -> Option<String> {
        let total: u64 = self.counters.denied.values().sum();
        let sampled = total > LOG_FIRST_DENIALS;
        if sampled && !total.is_multiple_of(LOG_EVERY_DENIAL) {
            return None;
        }
        let who = match self.attached.get(&conn) {
            Some(a) => format!("pid {} ({}:{})", a.facts.pid, self.svc_name(a.svc), a.proc),
            None => format!("connection {conn} (not attached)"),
        };
        let request = id.map_or(String::new(), |i| format!(" request {i}"));
        let tail = if sampled {
            format!(" [{total} denials so far; 1 in {LOG_EVERY_DENIAL} logged]")
        } else {
            String::new()
        };
        Some(format!(
            "sikker agent {}: denied {who}{request} ({}): {why}{tail}",
            self.host,
            kind(why)
        ))
    }

    /// Handles request `id` from an attested connection at `now_ns`.
    pub fn handle(&mut self, conn: ConnId, id: u64, msg: ToAgent, now_ns: u64) -> Vec<Effect> {
        let Some(me) = self.attached.get(&conn).cloned() else {
            let why = Denied::NoIdentity(
                "it never attached, or a policy update ended its identity".into(),
            );
            return vec![self.deny(conn, Some(id), why)];
        };
        let r = match msg {
            ToAgent::Sync => Ok(Flow::Done(Vec::new())),
            ToAgent::Listen => {
                if let Some(a) = self.attached.get_mut(&conn) {
                    a.listening = true;
                }
                Ok(Flow::Done(Vec::new()))
            }
            ToAgent::Send {
                to,
                payload,
                otp_for,
                claim,
            } => self.send(
                conn,
                id,
                &me,
                &to,
                payload,
                otp_for.as_ref(),
                claim.as_ref(),
                now_ns,
            ),
            ToAgent::Reply { otp, payload } => self.reply(conn, id, &me, otp, payload, now_ns),
        };
        match r {
            Ok(Flow::Done(mut effects)) => {
                effects.push(Effect {
                    to: conn,
                    msg: FromAgent::Ok(id),
                });
                effects
            }
            Ok(Flow::Later) => Vec::new(),
            Err(d) => vec![self.deny(conn, Some(id), d)],
        }
    }

    /// `dest` in the policy's identifiers.
    fn resolve(&self, d: &Dest) -> Result<Triple, Denied> {
        let unknown = |what: &str, name: String| Denied::Unknown {
            what: what.into(),
            name,
        };
        let s = self
            .nos
            .policy()
            .services
            .values()
            .find(|s| s.name == d.service)
            .ok_or_else(|| unknown("service", d.service.clone()))?;
        if !s.processes.contains_key(&d.process) {
            return Err(unknown("process", format!("{}:{}", d.service, d.process)));
        }
        let dom = *s
            .domains
            .get(&d.domain)
            .ok_or_else(|| unknown("domain", format!("{} of {}", d.domain, d.service)))?;
        Ok(Triple::new(s.id, d.process, dom))
    }

    /// An NMU refusal in the policy's names.
    fn explain(&self, e: &NmuError) -> Denied {
        let text = match e {
            NmuError::ServiceDenied { src, dst } => format!(
                "service {} holds no permission to service {} (no grant reaches it)",
                self.svc_name(*src),
                self.svc_name(*dst)
            ),
            NmuError::ProcessDenied { src, dst, proc } => format!(
                "service {} may not reach process {proc} of {} (not in the portal it was granted)",
                self.svc_name(*src),
                self.svc_name(*dst)
            ),
            NmuError::DomainDenied { src, dst, dom } => format!(
                "service {} may not use domain {} of {}",
                self.svc_name(*src),
                self.dom_name(*dst, *dom),
                self.svc_name(*dst)
            ),
            NmuError::UnknownOtp(_) | NmuError::OtpExpired(_) | NmuError::OtpTableFull { .. } => {
                return Denied::Otp(e.to_string());
            }
            other => other.to_string(),
        };
        Denied::Permission(text)
    }

    #[allow(clippy::too_many_arguments)] // the request's parts, as they arrived
    fn send(
        &mut self,
        conn: ConnId,
        id: u64,
        me: &Attached,
        to: &Dest,
        payload: Vec<u8>,
        otp_for: Option<&Dest>,
        claim: Option<&Identity>,
        now_ns: u64,
    ) -> Result<Flow, Denied> {
        let actual = self.identity(me.svc, me.proc);
        if let Some(c) = claim
            && *c != actual
        {
            return Err(Denied::Forged {
                claimed: c.to_string(),
                actual: actual.to_string(),
            });
        }
        let dst = self.resolve(to)?;
        let out = match otp_for {
            Some(r) => {
                let recipient = self.resolve(r)?;
                self.tables().send_with_otp(me.li, dst, recipient)
            }
            None => self.tables().send(me.li, dst),
        }
        .map_err(|e| self.explain(&e))?;
        self.counters.sent += 1;
        if let Some(slot) = out.rate_slot.filter(|s| self.rate.controls(*s, me.proc)) {
            let key = (slot, me.proc);
            // Behind older held messages it waits too: the order is kept.
            let must_wait = self.held.get(&key).is_some_and(|q| !q.is_empty())
                || matches!(
                    self.rate
                        .admit(slot, me.proc, payload.len(), now_ns as f64)
                        .map_err(|e| Denied::Rate(e.to_string()))?,
                    Admit::Later(_)
                );
            if must_wait {
                self.counters.held += 1;
                self.held.entry(key).or_default().push_back(Held {
                    conn,
                    id,
                    header: out.header,
                    payload,
                });
                return Ok(Flow::Later);
            }
        }
        self.route(conn, id, &out.header, payload, now_ns)
    }

    fn reply(
        &mut self,
        conn: ConnId,
        id: u64,
        me: &Attached,
        otp: u32,
        payload: Vec<u8>,
        now_ns: u64,
    ) -> Result<Flow, Denied> {
        let host = self.host.clone();
        let out = self
            .nos
            .tables_mut(&host)
            .expect("checked in new")
            .send_using_otp(me.li, otp, now_ns)
            .map_err(|e| self.explain(&e))?;
        self.counters.sent += 1;
        self.route(conn, id, &out.header, payload, now_ns)
    }

    /// Delivers here, or forwards to the agent of the destination's host
    /// (whose verdict answers request `id` of `conn` later).
    fn route(
        &mut self,
        conn: ConnId,
        id: u64,
        h: &Header,
        payload: Vec<u8>,
        now_ns: u64,
    ) -> Result<Flow, Denied> {
        let dst_name = self.identity(h.dst.svc, h.dst.proc);
        match self.nos.locate(h.dst.svc, h.dst.proc) {
            Some((host, ..)) if host == self.host => {
                self.deliver(h, payload, now_ns).map(Flow::Done)
            }
            Some((host, ..)) if self.linked.contains(&host) => {
                let fid = self.next_fid;
                self.next_fid += 1;
                self.forwards.insert(fid, (host.clone(), conn, id));
                self.counters.forwarded += 1;
                self.outbox.push((
                    host,
                    Message::AgentSend(AgentSend {
                        fid,
                        header: to_wire(h),
                        payload: B64.encode(&payload),
                    }),
                ));
                Ok(Flow::Later)
            }
            Some((host, ..)) => Err(Denied::Undeliverable(format!(
                "{dst_name} runs on host {host}, whose agent this one is not linked to"
            ))),
            None => Err(Denied::Undeliverable(format!("{dst_name} is not placed"))),
        }
    }

    /// The receiver's side: the destination must be resident here and
    /// listening; an OTP request stores its OTP with the receiver (§6.2.4).
    fn deliver(
        &mut self,
        h: &Header,
        payload: Vec<u8>,
        now_ns: u64,
    ) -> Result<Vec<Effect>, Denied> {
        let dst_name = self.identity(h.dst.svc, h.dst.proc);
        match self.nos.locate(h.dst.svc, h.dst.proc) {
            Some((host, ..)) if host == self.host => {}
            Some((host, ..)) => {
                return Err(Denied::Undeliverable(format!(
                    "{dst_name} runs on host {host}; this agent delivers only on {}",
                    self.host
                )));
            }
            None => return Err(Denied::Undeliverable(format!("{dst_name} is not placed"))),
        }
        let Some((&conn, _)) = self
            .attached
            .iter()
            .filter(|(_, a)| a.listening && a.svc == h.dst.svc && a.proc == h.dst.proc)
            .min_by_key(|(c, _)| **c)
        else {
            return Err(Denied::Undeliverable(format!(
                "no process attached as {dst_name} is listening"
            )));
        };
        let host = self.host.clone();
        let tables = self.nos.tables_mut(&host).expect("checked in new");
        let is_request = h.otp.is_some_and(|o| o.requester.is_none());
        let otp = if is_request {
            let (_, key) = tables
                .receive_with_otp(h, now_ns)
                .map_err(|e| Denied::Otp(e.to_string()))?;
            Some(key)
        } else {
            tables
                .receive(h)
                .map_err(|e| Denied::Undeliverable(e.to_string()))?;
            None
        };
        let requester = h
            .otp
            .and_then(|o| o.requester)
            .map(|(s, p)| self.identity(s, p));
        self.counters.delivered += 1;
        Ok(vec![Effect {
            to: conn,
            msg: FromAgent::Deliver {
                from: self.identity(h.src.0, h.src.1),
                domain: self.dom_name(h.dst.svc, h.dst.dom),
                payload,
                otp,
                requester,
            },
        }])
    }
}

/// Live policy updates (issue 15): a new policy replaces the running one
/// through [`Nos::update_policy`], atomically. A refused update (or a policy
/// text that did not parse, reported through [`AgentCore::policy_refused`])
/// leaves the last good policy enforcing, and is counted and logged with its
/// reason.
impl AgentCore {
    /// Applies `p`: only the NMU entries that change are rewritten, attached
    /// processes keep their connections (under their service's new ID if it
    /// changed), OTPs stay live, and rate control is rebuilt only when a rate
    /// limit or the placement of a limited service changed (its senders then
    /// start again from their share of the limit, with a full bucket). On an
    /// error nothing changes.
    pub fn update_policy(
        &mut self,
        p: sidecore_sikker_policy::Policy,
    ) -> Result<sidecore_sikker_policy::Delta, PolicyRefused> {
        let old = self.nos.policy().clone();
        let rates_before = rate_shape(&self.nos);
        let d = match self.nos.update_policy(p) {
            Ok(d) => d,
            Err(e) => return Err(self.refused(e.into())),
        };
        if rate_shape(&self.nos) != rates_before {
            match RateControl::new(&self.nos, &self.host, 0.0) {
                Ok(mut rc) => {
                    rc.set_view(self.rate.view().0.clone(), 0.0);
                    self.rate = rc;
                }
                Err(e) => {
                    // The last good policy compiled against this placement
                    // before, so it does again.
                    let why = match self.nos.update_policy(old).err() {
                        None => PolicyRefused::Rates(e),
                        Some(restore) => PolicyRefused::RatesAndRestore { rates: e, restore },
                    };
                    return Err(self.refused(why));
                }
            }
        }
        self.reattach(&old);
        self.counters.policy_updates += 1;
        Ok(d)
    }

    /// Counts and logs a refused policy update (from [`AgentCore::update_policy`],
    /// or a policy text the I/O layer could not parse); returns the reason.
    fn refused(&mut self, why: PolicyRefused) -> PolicyRefused {
        self.policy_refused(&why.to_string());
        why
    }

    pub fn policy_refused(&mut self, why: &str) -> String {
        self.counters.policy_refused += 1;
        eprintln!(
            "sikker agent {}: policy update refused, the last good policy keeps enforcing: {why}",
            self.host
        );
        why.to_string()
    }

    /// Reads each attached process's facts again with `read` (its cgroup,
    /// program and user may have changed since it attached); `None` (a
    /// process that cannot be read: gone) leaves its facts as they were. The
    /// re-attestation after an update does this itself with the reader set by
    /// [`AgentCore::set_facts_reader`], so each process is judged by where it
    /// is now. It can only end identities: an attached connection keeps its
    /// identity only if its facts still attest to that same identity.
    pub fn refresh_facts(&mut self, read: impl Fn(&ProcessFacts) -> Option<ProcessFacts>) {
        for a in self.attached.values_mut() {
            if let Some(f) = read(&a.facts).filter(|f| f.pid == a.facts.pid) {
                a.facts = f;
            }
        }
    }

    /// Points attached connections at their identities under the new policy
    /// (found by service name); one whose identity is no longer placed here
    /// ends, and its connection is closed at its next message.
    /// After a policy update: every attached connection keeps its identity
    /// (its service may have been renumbered) only if the process is still
    /// placed here and its facts still attest to that same identity under
    /// the new policy (its cgroup, program and uid rules may have changed);
    /// otherwise the identity ends (the connection is refused from then on)
    /// and the log says why.
    fn reattach(&mut self, old: &sidecore_sikker_policy::Policy) {
        if let Some(r) = self.facts_reader.take() {
            self.refresh_facts(&r);
            self.facts_reader = Some(r);
        }
        let mut ended = Vec::new();
        for (conn, a) in &mut self.attached {
            let now = old
                .services
                .get(&a.svc)
                .and_then(|s| self.nos.policy().service_by_name(&s.name))
                .and_then(|s| self.nos.locate(s.id, a.proc).map(|l| (s.id, l)));
            let why = match now {
                Some((svc, (host, _, li))) if host == self.host => {
                    match attest(self.nos.policy(), &a.facts) {
                        Ok((s, p)) if (s, p) == (svc, a.proc) => {
                            a.svc = svc;
                            a.li = li;
                            continue;
                        }
                        Ok((s, p)) => {
                            let name = self.nos.policy().services.get(&s).map_or("?", |x| &x.name);
                            format!("the new policy makes it {name}:{p}")
                        }
                        Err(e) => format!("the new policy no longer attests it: {e}"),
                    }
                }
                _ => "it is no longer placed here".to_string(),
            };
            ended.push((*conn, why));
        }
        for (conn, why) in ended {
            if let Some(a) = self.attached.remove(&conn) {
                eprintln!(
                    "sikker agent {}: the update ends the identity of connection {conn} (pid {}): {why}",
                    self.host, a.facts.pid
                );
            }
        }
    }
}

/// One rate limit and where its source service's processes run.
type RateShape = (
    sidecore_sikker_policy::RateLimit,
    Vec<(ProcessId, Option<String>)>,
);

/// What rate control is built from: each limit and where its source
/// service's processes run.
fn rate_shape(nos: &Nos) -> Vec<RateShape> {
    nos.policy()
        .rate_limits
        .iter()
        .map(|r| {
            let procs = nos
                .policy()
                .services
                .get(&r.from)
                .map(|s| {
                    s.processes
                        .keys()
                        .map(|&p| (p, nos.locate(r.from, p).map(|l| l.0)))
                        .collect()
                })
                .unwrap_or_default();
            (r.clone(), procs)
        })
        .collect()
}
