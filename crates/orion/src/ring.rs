//! The monitoring ring across real nodes: this node's monitor watches its `k + 1`
//! successors in the ring over the node protocol (`sense` → `sense-view` every refresh,
//! judged by the slope of each node's heartbeat with k-refresh hysteresis), declares a
//! successor dead on the process's [`health`] board, and takes it out of the ring — a
//! membership change that gives this monitor the next successor to watch. Declarations
//! spread with the views: a view lists the PEs its node has declared dead, and the
//! watcher takes them out of its ring too. A node declared dead is still probed; when
//! its heartbeat moves again the declaration was a false positive, and it rejoins.
//!
//! Each refresh judges the answer to the previous refresh's request (an answer has a
//! whole period to arrive), so a stopped node is declared within `(k + 2)·r` of its last
//! progress. The exchange never blocks a refresh for more than [`CONNECT_TIMEOUT`]
//! (connecting to a node not yet linked).

use crate::detect::{LivenessConfig, Ring, RingMonitor, SlopeDetector, Transition};
use crate::error::OrionError;
use crate::health::{self, Declaration};
use serde::Serialize;
use sidecore_wire::orion_msg::SenseRequest;
use sidecore_wire::session::OriginGrammar;
use sidecore_wire::{Hello, Link, Message, Received};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The longest a refresh waits to connect to a node.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(50);
/// The longest a refresh waits for a message already on its way.
const RECV_SLICE: Duration = Duration::from_micros(50);
/// The most members a ring may have.
pub const MAX_MEMBERS: usize = 256;

/// A ring member: a node's name and its node-protocol address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    /// The node's name (`sidecore daemon --name`).
    pub name: String,
    /// `ip:port` of its node listener.
    pub addr: String,
}

impl std::str::FromStr for Member {
    type Err = OrionError;
    fn from_str(s: &str) -> Result<Member, OrionError> {
        let bad = |why: &str| OrionError::Config {
            what: format!("ring member `{s}`"),
            why: why.to_owned(),
        };
        let (name, addr) = s
            .split_once('=')
            .ok_or_else(|| bad("expected NAME=IP:PORT"))?;
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(bad("the name is empty or has spaces"));
        }
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(bad("the address is not IP:PORT"));
        }
        Ok(Member {
            name: name.to_owned(),
            addr: addr.to_owned(),
        })
    }
}

/// The PE id of node `name`, as the runtime's inventory names it.
pub fn node_pe(name: &str) -> String {
    format!("node:{name}")
}

/// What a refresh changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "note", rename_all = "kebab-case")]
pub enum RingNote {
    /// This monitor declared `node` dead.
    Declared {
        /// The node.
        node: String,
        /// Why.
        evidence: String,
    },
    /// A node declared dead made progress again (a false positive): it rejoins.
    Recovered {
        /// The node.
        node: String,
    },
    /// `node` left this monitor's ring because `by` declared it dead.
    Left {
        /// The node.
        node: String,
        /// Who declared it.
        by: String,
    },
}

/// The connection to one watched node.
#[derive(Default)]
struct Conn {
    link: Option<Link<OriginGrammar>>,
    welcomed: bool,
    /// The request sent at the last refresh, not yet answered.
    asked: Option<u64>,
    /// The heartbeat that answered it.
    answer: Option<u64>,
    /// PEs the node says it has declared dead.
    gossip: Vec<String>,
}

/// This node's part of the monitoring ring.
pub struct RingWatch {
    me: String,
    members: Vec<Member>,
    ring: Ring,
    monitor: RingMonitor,
    cfg: LivenessConfig,
    /// Members declared dead (by anyone), still probed for a false positive.
    dead: BTreeMap<u32, SlopeDetector>,
    conns: BTreeMap<u32, Conn>,
    seq: u64,
    views: u64,
}

impl RingWatch {
    /// The watch of node `me` in a ring of `members` (which must include `me`) that
    /// tolerates `k` simultaneous failures, judging liveness by `cfg`.
    pub fn new(
        me: &str,
        mut members: Vec<Member>,
        k: usize,
        cfg: LivenessConfig,
    ) -> Result<RingWatch, OrionError> {
        let bad = |why: String| OrionError::Config {
            what: "monitoring ring".to_owned(),
            why,
        };
        members.sort_by(|a, b| a.name.cmp(&b.name));
        let names: BTreeSet<&str> = members.iter().map(|m| m.name.as_str()).collect();
        if names.len() != members.len() {
            return Err(bad("a member is named twice".to_owned()));
        }
        if members.len() > MAX_MEMBERS {
            return Err(bad(format!(
                "{} members; at most {MAX_MEMBERS}",
                members.len()
            )));
        }
        let Some(me_id) = members.iter().position(|m| m.name == me) else {
            return Err(bad(format!("this node `{me}` is not a member")));
        };
        let ring = Ring::new(0..members.len() as u32, k);
        let monitor = RingMonitor::new(me_id as u32, cfg, &ring);
        Ok(RingWatch {
            me: me.to_owned(),
            members,
            ring,
            monitor,
            cfg,
            dead: BTreeMap::new(),
            conns: BTreeMap::new(),
            seq: 0,
            views: 0,
        })
    }

    /// The members still in the ring.
    pub fn live_members(&self) -> Vec<String> {
        self.ring
            .members()
            .map(|i| self.name(i).to_owned())
            .collect()
    }

    /// The nodes this monitor watches now.
    pub fn watching(&self) -> Vec<String> {
        self.monitor
            .targets()
            .into_iter()
            .map(|i| self.name(i).to_owned())
            .collect()
    }

    /// Views received so far.
    pub fn views(&self) -> u64 {
        self.views
    }

    fn name(&self, id: u32) -> &str {
        self.members
            .get(id as usize)
            .map_or("?", |m| m.name.as_str())
    }

    fn id(&self, name: &str) -> Option<u32> {
        self.members
            .iter()
            .position(|m| m.name == name)
            .map(|i| i as u32)
    }

    /// One refresh at `now_ns`: judges the answers to the last refresh's requests,
    /// applies what they changed, and asks again.
    pub fn refresh(&mut self, now_ns: u64) -> Vec<RingNote> {
        let mut notes = Vec::new();
        let targets: BTreeSet<u32> = self
            .monitor
            .targets()
            .into_iter()
            .chain(self.dead.keys().copied())
            .collect();
        self.conns.retain(|id, _| targets.contains(id));
        for &t in &targets {
            self.collect(t);
        }
        for &t in &targets {
            self.judge(t, now_ns, &mut notes);
        }
        self.apply_gossip(&mut notes);
        self.seq += 1;
        let targets: Vec<u32> = self
            .monitor
            .targets()
            .into_iter()
            .chain(self.dead.keys().copied())
            .collect();
        for t in targets {
            self.ask(t);
        }
        notes
    }

    /// Reads whatever node `t` has sent since the last refresh.
    fn collect(&mut self, t: u32) {
        let Some(c) = self.conns.get_mut(&t) else {
            return;
        };
        c.answer = None;
        let Some(link) = c.link.clone() else {
            return;
        };
        loop {
            match link.recv(Some(RECV_SLICE)) {
                Ok(Received::Message(Message::Welcome(_))) => c.welcomed = true,
                Ok(Received::Message(Message::SenseView(v))) => {
                    if Some(v.seq) == c.asked {
                        c.answer = Some(v.heartbeat);
                        c.gossip = v.dead;
                        c.asked = None;
                        self.views += 1;
                    }
                }
                Ok(Received::TimedOut) => break,
                Ok(Received::Message(_) | Received::Closed) | Err(_) => {
                    *c = Conn::default();
                    break;
                }
            }
        }
    }

    fn judge(&mut self, t: u32, now_ns: u64, notes: &mut Vec<RingNote>) {
        let value = self.conns.get(&t).and_then(|c| c.answer);
        let node = self.name(t).to_owned();
        if let Some(d) = self.dead.get_mut(&t) {
            if let Some(Transition::Recovered { .. }) = d.observe(now_ns, value) {
                self.dead.remove(&t);
                self.ring.join(t);
                self.monitor.membership(&self.ring);
                health::declare(Declaration {
                    pe: node_pe(&node),
                    by: self.me.clone(),
                    dead: false,
                    evidence: format!("its heartbeat moved again (seen by {})", self.me),
                });
                notes.push(RingNote::Recovered { node });
            }
            return;
        }
        let Some(ev) = self.monitor.observe(t, now_ns, value) else {
            return;
        };
        if let Transition::Declared {
            at_ns,
            last_progress_ns,
            value,
        } = ev.transition
        {
            let evidence = format!(
                "no heartbeat progress for {:.1} ms ({} refreshes of {:.1} ms; last heartbeat {})",
                (at_ns.saturating_sub(last_progress_ns)) as f64 / 1e6,
                self.cfg.k,
                self.cfg.refresh_ns as f64 / 1e6,
                value.map_or("never seen".to_owned(), |v| v.to_string())
            );
            self.take_out(t, value);
            health::declare(Declaration {
                pe: node_pe(&node),
                by: self.me.clone(),
                dead: true,
                evidence: evidence.clone(),
            });
            notes.push(RingNote::Declared { node, evidence });
        }
    }

    /// Takes `t` out of the ring; it is still probed, and a heartbeat above `last`
    /// (the last one seen, if any) brings it back.
    fn take_out(&mut self, t: u32, last: Option<u64>) {
        self.ring.leave(t);
        self.monitor.membership(&self.ring);
        self.dead.insert(t, SlopeDetector::declared(self.cfg, last));
    }

    /// Membership changes the views reported: nodes others declared dead leave.
    fn apply_gossip(&mut self, notes: &mut Vec<RingNote>) {
        let heard: Vec<(u32, String)> = self
            .conns
            .iter()
            .flat_map(|(from, c)| c.gossip.iter().map(move |pe| (*from, pe.clone())))
            .collect();
        for (from, pe) in heard {
            let Some(name) = pe.strip_prefix("node:") else {
                continue;
            };
            let Some(t) = self.id(name) else { continue };
            if name == self.me || self.dead.contains_key(&t) {
                continue;
            }
            self.take_out(t, None);
            notes.push(RingNote::Left {
                node: name.to_owned(),
                by: self.name(from).to_owned(),
            });
        }
        for c in self.conns.values_mut() {
            c.gossip.clear();
        }
    }

    /// Sends this refresh's request to `t`, connecting first if need be.
    fn ask(&mut self, t: u32) {
        let seq = self.seq;
        let watcher = self.me.clone();
        let Some(addr) = self.members.get(t as usize).map(|m| m.addr.clone()) else {
            return;
        };
        let peer = format!("node {} at {addr}", self.name(t));
        let c = self.conns.entry(t).or_default();
        if c.link.is_none() {
            let hello = Hello {
                origin: format!("orion-monitor@{watcher}"),
                software: sidecore_wire::SOFTWARE_VERSION.to_owned(),
            };
            match Link::connect(&addr, &peer, hello, CONNECT_TIMEOUT) {
                Ok(l) => {
                    c.link = Some(l);
                    c.welcomed = false;
                }
                Err(_) => return,
            }
        }
        if !c.welcomed {
            return; // asked once the welcome is in
        }
        // A request still unanswered from an earlier refresh is superseded: its late
        // answer, under the old number, is ignored.
        let sent = c.link.as_ref().map(|l| {
            l.send(&Message::Sense(SenseRequest {
                seq,
                watcher: watcher.clone(),
            }))
        });
        match sent {
            Some(Ok(())) => c.asked = Some(seq),
            _ => *c = Conn::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_bad_ones_say_why() {
        let m: Member = "b=10.0.0.2:7400".parse().unwrap();
        assert_eq!((m.name.as_str(), m.addr.as_str()), ("b", "10.0.0.2:7400"));
        for bad in ["b", "=1.2.3.4:5", "b=host", "b c=1.2.3.4:5"] {
            let e = bad.parse::<Member>().unwrap_err().to_string();
            assert!(e.contains(&format!("ring member `{bad}`")), "{e}");
        }
        let cfg = LivenessConfig::new(25_000_000, 3).unwrap();
        let ms = |names: &[&str]| -> Vec<Member> {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| Member {
                    name: (*n).to_owned(),
                    addr: format!("127.0.0.1:{}", 1000 + i),
                })
                .collect()
        };
        assert!(RingWatch::new("z", ms(&["a", "b"]), 1, cfg).is_err());
        assert!(RingWatch::new("a", ms(&["a", "a"]), 1, cfg).is_err());
        let w = RingWatch::new("b", ms(&["c", "a", "b", "d"]), 1, cfg).unwrap();
        assert_eq!(w.watching(), vec!["c", "d"], "b's two successors");
    }
}
