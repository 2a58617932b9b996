//! The agent's side of its links to other hosts' agents, sans-IO: which
//! hosts it is linked to (its membership view for rate limits), messages
//! forwarded to their destination's host and the verdicts that answer them,
//! the receiver-side check of a message that arrives from another agent
//! (whose source must be placed on that agent's host: an agent can speak only
//! for its own processes), SE-TRE exchange messages, and the messages held by
//! a rate limit until their tokens come.

use super::*;
use crate::header::from_wire;

impl AgentCore {
    /// This agent's host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The compiled policy this agent enforces.
    pub fn nos(&self) -> &Nos {
        &self.nos
    }

    /// The other hosts of the placement: the agents this one may link to.
    pub fn peer_hosts(&self) -> Vec<String> {
        self.nos
            .host_names()
            .into_iter()
            .filter(|h| *h != self.host)
            .collect()
    }

    /// The agent of `host` is linked (its certificate proved the name). False
    /// if `host` is not another host of the placement.
    pub fn linked(&mut self, host: &str, now_ns: u64) -> bool {
        if host == self.host || self.nos.tables(host).is_none() {
            return false;
        }
        self.linked.insert(host.to_string());
        self.rate.set_view(self.linked.clone(), now_ns as f64);
        true
    }

    /// The link to `host` is gone: the limits are re-divided among the hosts
    /// still linked, and every message forwarded there and not yet answered
    /// is denied (it may or may not have been delivered; the sender is told).
    pub fn unlinked(&mut self, host: &str, now_ns: u64) -> Vec<Effect> {
        if !self.linked.remove(host) {
            return Vec::new();
        }
        self.rate.set_view(self.linked.clone(), now_ns as f64);
        let lost: Vec<u64> = self
            .forwards
            .iter()
            .filter(|(_, f)| f.0 == host)
            .map(|(k, _)| *k)
            .collect();
        let mut out = Vec::new();
        for fid in lost {
            if let Some((h, conn, id)) = self.forwards.remove(&fid) {
                let why = Denied::Undeliverable(format!(
                    "the link to host {h}'s agent went down before it answered"
                ));
                out.push(self.deny(conn, Some(id), why));
            }
        }
        out
    }

    /// The hosts linked now.
    pub fn linked_hosts(&self) -> &BTreeSet<String> {
        &self.linked
    }

    /// Each rate limit's fill rate held on this host, bytes per second.
    pub fn local_rates(&self) -> BTreeMap<u32, f64> {
        self.rate.local_rates()
    }

    /// A message from the agent of `host` (already authenticated as that host).
    pub fn on_peer(&mut self, host: &str, msg: Message, now_ns: u64) -> PeerIn {
        match msg {
            Message::AgentSend(m) => self.on_forwarded(host, m, now_ns),
            Message::AgentResult(r) => {
                let effects = match self.forwards.get(&r.fid) {
                    Some((h, conn, id)) if h == host => {
                        let (conn, id) = (*conn, *id);
                        self.forwards.remove(&r.fid);
                        match r.denied {
                            None => vec![Effect {
                                to: conn,
                                msg: FromAgent::Ok(id),
                            }],
                            Some((kind, why)) => {
                                let why = Denied::Remote {
                                    host: host.to_string(),
                                    why: format!("{why} ({kind})"),
                                };
                                vec![self.deny(conn, Some(id), why)]
                            }
                        }
                    }
                    // Unknown, or answered by a host it was not sent to: ignored.
                    _ => Vec::new(),
                };
                PeerIn {
                    effects,
                    delivery_of: None,
                }
            }
            Message::RateRequest(ex) => {
                if self.placed_on(self.rate.source(ex.slot), ex.from, host) {
                    let resp = self.rate.on_request(&ex, now_ns as f64);
                    self.outbox
                        .push((host.to_string(), Message::RateResponse(resp)));
                }
                PeerIn::default()
            }
            Message::RateResponse(ex) => {
                if self.placed_on(self.rate.source(ex.slot), ex.from, host) {
                    self.rate.on_response(&ex, now_ns as f64);
                }
                PeerIn::default()
            }
            _ => PeerIn::default(),
        }
    }

    /// Whether process `p` of service `s` is placed on `host`.
    fn placed_on(&self, s: Option<ServiceId>, p: ProcessId, host: &str) -> bool {
        s.and_then(|s| self.nos.locate(s, p))
            .is_some_and(|(h, ..)| h == host)
    }

    fn on_forwarded(&mut self, host: &str, m: sidecore_wire::AgentSend, now_ns: u64) -> PeerIn {
        self.counters.received_from_peers += 1;
        let h = from_wire(&m.header);
        let checked = if !self.placed_on(Some(h.src.0), h.src.1, host) {
            let src = self.identity(h.src.0, h.src.1);
            Err(Denied::Forged {
                claimed: format!("{src} (sent by the agent of host {host})"),
                actual: match self.nos.locate(h.src.0, h.src.1) {
                    Some((on, ..)) => format!("{src} is placed on host {on}"),
                    None => format!("{src} is not placed"),
                },
            })
        } else {
            B64.decode(m.payload.as_bytes())
                .map_err(|e| Denied::Malformed(format!("payload is not base64: {e}")))
                .and_then(|payload| self.deliver(&h, payload, now_ns))
        };
        match checked {
            Ok(effects) => PeerIn {
                effects,
                delivery_of: Some(m.fid),
            },
            Err(d) => {
                *self
                    .counters
                    .denied
                    .entry(kind(&d).to_string())
                    .or_default() += 1;
                self.result(host, m.fid, Some((kind(&d).to_string(), d.to_string())));
                PeerIn::default()
            }
        }
    }

    fn result(&mut self, host: &str, fid: u64, denied: Option<(String, String)>) {
        self.outbox.push((
            host.to_string(),
            Message::AgentResult(sidecore_wire::AgentResult { fid, denied }),
        ));
    }

    /// Whether the delivery of message `fid` from `host` went out to its
    /// process; the sending agent learns the verdict.
    pub fn forward_delivered(&mut self, host: &str, fid: u64, delivered: bool) {
        if !delivered {
            // Counted when the delivery was made; it never went out.
            self.counters.delivered = self.counters.delivered.saturating_sub(1);
        }
        let denied = (!delivered).then(|| {
            (
                "undeliverable".to_string(),
                "the receiver's queue is full or it has gone".to_string(),
            )
        });
        self.result(host, fid, denied);
    }

    /// Time passing: rate exchange rounds and timeouts, and held messages
    /// whose tokens have come, each with the connection it answers.
    pub fn tick(&mut self, now_ns: u64) -> Vec<(ConnId, Vec<Effect>)> {
        let now = now_ns as f64;
        self.rate.tick(now);
        let keys: Vec<(u32, ProcessId)> = self.held.keys().copied().collect();
        let mut out = Vec::new();
        for key in keys {
            while let Some(front) = self.held.get(&key).and_then(|q| q.front()) {
                let size = front.payload.len();
                match self.rate.admit(key.0, key.1, size, now) {
                    Ok(Admit::Now) => {}
                    Ok(Admit::Later(_)) => break,
                    // Checked when the message was held: it fits the bucket.
                    Err(_) => {}
                }
                let Some(m) = self.held.get_mut(&key).and_then(VecDeque::pop_front) else {
                    break;
                };
                let effects = match self.route(m.conn, m.id, &m.header, m.payload, now_ns) {
                    Ok(Flow::Done(mut e)) => {
                        e.push(Effect {
                            to: m.conn,
                            msg: FromAgent::Ok(m.id),
                        });
                        e
                    }
                    Ok(Flow::Later) => Vec::new(),
                    Err(d) => vec![self.deny(m.conn, Some(m.id), d)],
                };
                out.push((m.conn, effects));
            }
        }
        self.held.retain(|_, q| !q.is_empty());
        out
    }

    /// Whether messages wait for tokens (the I/O layer then ticks often).
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Messages for other hosts' agents: (host, message).
    pub fn take_outbox(&mut self) -> Vec<(String, Message)> {
        let mut out = std::mem::take(&mut self.outbox);
        out.extend(self.rate.take_out());
        out
    }
}
